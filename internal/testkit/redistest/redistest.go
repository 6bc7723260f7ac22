// Package redistest starts throwaway server processes (redis-server, or
// valkey-server) on loopback for tests: a single server and a 3-master
// Redis Cluster, plus ways to fault them (SCRIPT FLUSH, kill -9, restart,
// SIGSTOP).
//
// Servers run as children of the test binary with their own temp dir, no
// persistence and --bind 127.0.0.1; they receive SIGKILL if the test binary
// dies, so none is ever left running. A package shares one single server and
// one cluster, started on first use and stopped by Main:
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
//
// SLUICE_REDIS_SERVER chooses the server binary: a name looked up on PATH
// or an absolute path (go test runs each package in its own directory). It
// defaults to redis-server; set it to valkey-server to run the same tests on
// Valkey:
//
//	SLUICE_REDIS_SERVER=valkey-server go test ./mutex
//
// Sentinels run that same binary in sentinel mode (--sentinel), which is
// what redis-sentinel and valkey-sentinel are, so the variable chooses them
// too. Nothing here runs redis-cli.
//
// When the server binary is not found, Single and Cluster skip the test
// with a note on how to install it; with SLUICE_REQUIRE_REDIS=1 they fail
// instead.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"go.uber.org/goleak"
)

// RequireEnv is the environment variable that turns a missing redis-server
// into a test failure instead of a skip. CI sets it.
const RequireEnv = "SLUICE_REQUIRE_REDIS"

// ServerEnv is the environment variable that chooses the server binary
// every Server runs (sentinels included): a name looked up on PATH, such
// as valkey-server, or an absolute path. Unset or empty, it is redis-server.
const ServerEnv = "SLUICE_REDIS_SERVER"

// ServerBinary returns the server binary the package runs: $SLUICE_REDIS_SERVER,
// or redis-server when that is unset or empty.
func ServerBinary() string {
	if b := os.Getenv(ServerEnv); b != "" {
		return b
	}
	return "redis-server"
}

// lookServer returns the path of the server binary, or an error that says
// how to install it.
func lookServer() (string, error) {
	bin := ServerBinary()
	path, err := exec.LookPath(bin)
	if err == nil {
		return path, nil
	}
	if os.Getenv(ServerEnv) != "" {
		return "", fmt.Errorf("%s not found (%s=%s): %w", bin, ServerEnv, bin, err)
	}
	return "", errors.New("redis-server not found on PATH; install it with " +
		"`apt-get install redis-server` (Debian) to run the real-server tests, or name another " +
		"server binary (such as valkey-server) in " + ServerEnv)
}

// Server is one server child process (redis-server, or the binary
// SLUICE_REDIS_SERVER names) on 127.0.0.1.
type Server struct {
	Port int
	bin  string // path of the server binary
	args []string
	dir  string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
}

// Addr returns "127.0.0.1:PORT".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// StartServer starts a redis-server on a free loopback port with the given
// extra arguments and waits until it answers PING.
func StartServer(extra ...string) (*Server, error) {
	bin, err := lookServer()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sluice-redis-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 10 {
		port, err := freePort()
		if err != nil {
			lastErr = err
			continue
		}
		s := &Server{Port: port, bin: bin, dir: dir}
		s.args = append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir,
			"--logfile", filepath.Join(dir, "redis.log"),
			"--enable-debug-command", "local",
		}, extra...)
		if lastErr = s.start(); lastErr == nil {
			return s, nil
		}
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redistest: start %s: %w", bin, lastErr)
}

func (s *Server) start() error {
	cmd := exec.Command(s.bin, s.args...)
	cmd.Dir = s.dir
	// The server dies with the test binary, whatever way the binary ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // a killed server exits with an error
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := s.Do("PING"); err == nil {
			break
		}
		select {
		case <-exited:
			return fmt.Errorf("%s on port %d exited at start: %s", s.bin, s.Port, s.logTail())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill() // fails only if it has exited meanwhile
			<-exited
			return fmt.Errorf("%s on port %d did not answer PING", s.bin, s.Port)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	return nil
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return string(b)
}

// Kill sends SIGKILL and waits for the process to go. Data is lost (no
// persistence), as in a crash.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill() // fails only if it has exited meanwhile
	<-exited
}

// Restart kills the server (kill -9) and starts it again, empty, on the same
// port.
func (s *Server) Restart() error {
	s.Kill()
	var err error
	for range 50 { // the port can take a moment to be free again
		if err = s.start(); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// Pause stops the process with SIGSTOP and returns once every thread of it
// is seen stopped: the signal is delivered asynchronously, and on a loaded
// machine the server could otherwise still run (serve, replicate) for a
// while after Pause returned. Resume continues it. A Pause that fails
// leaves the server running: its caller, told of no pause, resumes nothing.
func (s *Server) Pause() error {
	if err := s.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	s.mu.Lock()
	pid := s.cmd.Process.Pid
	s.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for !allStopped(pid) {
		if time.Now().After(deadline) {
			_ = s.Resume() // fails only if the server has exited
			return fmt.Errorf("redistest: process %d not stopped 10 s after SIGSTOP", pid)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

// Resumer returns a function that resumes the server (after Pause) the
// first time it is called and does nothing after; the test calls it when
// it ends too, so that a test that fails while the server is paused does
// not leave it stopped.
func (s *Server) Resumer(t testing.TB) (resume func()) {
	var once sync.Once
	resume = func() {
		once.Do(func() {
			if err := s.Resume(); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(resume)
	return resume
}

// allStopped reports whether every thread of pid is in state T (stopped),
// from /proc. Where /proc cannot be read it reports true: nothing better
// can be known.
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return true
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			continue // the thread has gone
		}
		// "tid (comm) S ...": the state follows the last ')'.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 || i+2 >= len(stat) {
			continue
		}
		if state := stat[i+2]; state != 'T' && state != 't' {
			return false
		}
	}
	return true
}

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("redistest: server is not running")
	}
	return s.cmd.Process.Signal(sig)
}

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	s.Kill()
	os.RemoveAll(s.dir)
}

// Do sends one command on a fresh connection and returns the reply as text
// (arrays and maps are flattened, one element per line). It is for test
// set-up and fault injection, independent of the client under test.
func (s *Server) Do(args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second)) // fails only on a closed conn, which the write reports
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	var out strings.Builder
	if err := readReply(bufio.NewReader(conn), &out); err != nil {
		return "", err
	}
	return strings.TrimSuffix(out.String(), "\n"), nil
}

// readReply reads one RESP2 reply.
func readReply(r *bufio.Reader, out *strings.Builder) error {
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return errors.New("redistest: empty reply line")
	}
	switch line[0] {
	case '+', ':':
		out.WriteString(line[1:] + "\n")
	case '-':
		return errors.New(line[1:])
	case '$':
		n, _ := strconv.Atoi(line[1:])
		if n < 0 {
			out.WriteString("\n")
			return nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return err
		}
		out.Write(buf[:n])
		out.WriteString("\n")
	case '*':
		n, _ := strconv.Atoi(line[1:])
		for range n {
			if err := readReply(r, out); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("redistest: unexpected reply %q", line)
	}
	return nil
}

// FlushScripts empties the server's script cache, as a restart or failover
// would.
func (s *Server) FlushScripts() error {
	_, err := s.Do("SCRIPT", "FLUSH")
	return err
}

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	Nodes []*Server
}

// Addrs returns the addresses of all nodes.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr()
	}
	return out
}

// Stop stops every node.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		n.Stop()
	}
}

// StartCluster starts n masters, splits the 16384 slots between them and
// waits until every node reports cluster_state:ok.
func StartCluster(n int) (*Cluster, error) {
	c := &Cluster{}
	for range n {
		s, err := StartServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000")
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
	}
	per := 16384 / n
	for i, s := range c.Nodes {
		lo, hi := i*per, (i+1)*per-1
		if i == n-1 {
			hi = 16383
		}
		if _, err := s.Do("CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)); err != nil {
			c.Stop()
			return nil, fmt.Errorf("redistest: addslots: %w", err)
		}
		if i > 0 {
			if _, err := s.Do("CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(c.Nodes[0].Port)); err != nil {
				c.Stop()
				return nil, fmt.Errorf("redistest: meet: %w", err)
			}
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Nodes {
		for {
			info, err := s.Do("CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)) {
				break
			}
			if time.Now().After(deadline) {
				c.Stop()
				return nil, fmt.Errorf("redistest: cluster not ok after 30s: %s", info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c, nil
}

// freePort picks a random port in [20000, 40000) such that both it and the
// cluster bus port (+10000) are free on loopback right now.
func freePort() (int, error) {
	for range 100 {
		p := 20000 + rand.IntN(20000)
		if portFree(p) && portFree(p+10000) {
			return p, nil
		}
	}
	return 0, errors.New("redistest: no free port")
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// The package-wide shared servers.
var shared struct {
	mu      sync.Mutex
	single  *Server
	cluster *Cluster
	err     map[string]error
}

// Main runs the tests of a package, stops the shared servers, and then fails
// the run if any goroutine is left over (goleak): every goroutine a package
// starts must be stopped by something its user holds. A run about to pass
// its -timeout prints the stacks of sluice's goroutines first
// (timeoutWarning).
func Main(m *testing.M) {
	stop := timeoutWarning()
	code := m.Run()
	stop()
	shared.mu.Lock()
	if shared.single != nil {
		shared.single.Stop()
	}
	if shared.cluster != nil {
		shared.cluster.Stop()
	}
	shared.mu.Unlock()
	if code == 0 {
		// rueidis closes connections dropped by a cluster topology refresh
		// after a 5 s sleep in a goroutine of its own, and starts a delayed
		// refresh (after a MOVED, say) in another that sleeps up to its
		// delay before it looks at the closed client; both end by
		// themselves, and Close cannot stop them.
		if err := goleak.Find(
			goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
			goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"),
		); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines left after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Available reports why real-server tests cannot run, or nil if they can.
func Available() error {
	_, err := lookServer()
	return err
}

// Skip skips (or, with SLUICE_REQUIRE_REDIS=1, fails) t when redis-server is
// not available.
func Skip(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		unavailable(t, err)
	}
}

func unavailable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%v (%s=1)", err, RequireEnv)
	}
	t.Skip(err)
}

// Single returns the package's shared single server, starting it on first
// use. Tests that fault the server must use NewServer instead.
func Single(t testing.TB) *Server {
	t.Helper()
	Skip(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.single == nil {
		s, err := StartServer()
		if err != nil {
			unavailable(t, err)
		}
		shared.single = s
	}
	return shared.single
}

// SharedCluster returns the package's shared 3-master cluster, starting it
// on first use.
func SharedCluster(t testing.TB) *Cluster {
	t.Helper()
	Skip(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.cluster == nil {
		c, err := StartCluster(3)
		if err != nil {
			unavailable(t, err)
		}
		shared.cluster = c
	}
	return shared.cluster
}

// NewServer starts a server owned by t, stopped when t ends. Use it for
// tests that kill, restart or pause the server.
func NewServer(t testing.TB, extra ...string) *Server {
	t.Helper()
	Skip(t)
	s, err := StartServer(extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Client returns a rueidis client for the given addresses, closed when t
// ends. A cluster is detected from the server.
func Client(t testing.TB, addrs ...string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  addrs,
		DisableCache: true,
	})
	if err != nil {
		t.Fatalf("rueidis client for %v: %v", addrs, err)
	}
	t.Cleanup(c.Close)
	return c
}

// WaitFor polls cond every few milliseconds until it is true or timeout
// passes, and reports whether it became true. It is for waiting on state in
// Redis that has no signal to wait on, such as a key's expiry.
func WaitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}
