package redistest

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// DefaultMasterName is the name under which StartSentinel's sentinels
// monitor the primary.
const DefaultMasterName = "sluice-primary"

// Sentinel is a Redis Sentinel setup on loopback: a primary, one replica of
// it, and three sentinels (quorum 2) that monitor the primary under Name,
// with a down-after of 1 s and a failover timeout of 3 s, so a primary
// killed with Kill is replaced by the replica within a few seconds.
//
// Primary and Replica keep the roles the servers started with; after a
// failover, the sentinels' view is what PrimaryAddr reports. Every process
// is a child of the test binary, in its own temp dir, like StartServer's.
// The sentinels run the server binary (redis-server, or the one
// SLUICE_REDIS_SERVER names) in sentinel mode, which is what Debian's
// redis-sentinel and valkey-sentinel are, with a config file of their own,
// which they rewrite as they learn the topology.
type Sentinel struct {
	Name      string
	Primary   *Server
	Replica   *Server
	Sentinels []*Server
}

// SentinelAddrs returns the addresses of the three sentinels: what a client
// connects to.
func (s *Sentinel) SentinelAddrs() []string {
	out := make([]string, len(s.Sentinels))
	for i, n := range s.Sentinels {
		out[i] = n.Addr()
	}
	return out
}

// Stop stops every process of the setup and removes their directories.
func (s *Sentinel) Stop() {
	for _, n := range s.Sentinels {
		n.Stop()
	}
	if s.Replica != nil {
		s.Replica.Stop()
	}
	if s.Primary != nil {
		s.Primary.Stop()
	}
}

// NewSentinel starts a Sentinel setup owned by t, stopped when t ends
// (also when t fails). It skips t, or fails it with SLUICE_REQUIRE_REDIS=1,
// when the server binary is not installed.
func NewSentinel(t testing.TB) *Sentinel {
	t.Helper()
	Skip(t)
	s, err := StartSentinel(DefaultMasterName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartSentinel starts a primary, a replica of it and three sentinels
// monitoring it as name, and returns once the replica is in sync and
// acknowledges writes (WAIT), and every sentinel sees the primary up, the
// replica up and linked to it, and the two other sentinels connected, so
// a failover can start as soon as the primary fails. The caller stops it.
func StartSentinel(name string) (*Sentinel, error) {
	s := &Sentinel{Name: name}
	fail := func(err error) (*Sentinel, error) {
		s.Stop()
		return nil, err
	}
	var err error
	// No 5 s wait before the first (diskless) sync, on either server: the
	// replica becomes a primary with replicas of its own after a failover.
	if s.Primary, err = StartServer("--repl-diskless-sync-delay", "0"); err != nil {
		return fail(err)
	}
	if s.Replica, err = StartServer("--repl-diskless-sync-delay", "0",
		"--replicaof", "127.0.0.1", strconv.Itoa(s.Primary.Port)); err != nil {
		return fail(err)
	}
	if err := waitReplicating(s.Primary, s.Replica); err != nil {
		return fail(err)
	}

	// Every sentinel is told the others' ids and the replica up front, so
	// none has to wait for the hello messages (every 2 s) that would
	// otherwise introduce them; they check all of it on their own at once.
	const n = 3
	ports := make([]int, n)
	ids := make([]string, n)
	dirs := make([]string, n)
	for i := range n {
		if ports[i], err = freePort(); err != nil {
			return fail(err)
		}
		for j := range i { // two sentinels must not draw the same port
			if ports[j] == ports[i] {
				return fail(errors.New("redistest: sentinel port drawn twice"))
			}
		}
		var id [20]byte
		rand.Read(id[:])
		ids[i] = hex.EncodeToString(id[:])
		if dirs[i], err = os.MkdirTemp("", "sluice-sentinel-"); err != nil {
			return fail(err)
		}
	}
	for i := range n {
		var conf strings.Builder
		fmt.Fprintf(&conf, "port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n",
			ports[i], dirs[i], filepath.Join(dirs[i], "redis.log"))
		fmt.Fprintf(&conf, "sentinel myid %s\n", ids[i])
		conf.WriteString("sentinel resolve-hostnames no\nsentinel announce-hostnames no\n")
		fmt.Fprintf(&conf, "sentinel monitor %s 127.0.0.1 %d 2\n", name, s.Primary.Port)
		fmt.Fprintf(&conf, "sentinel down-after-milliseconds %s 1000\n", name)
		fmt.Fprintf(&conf, "sentinel failover-timeout %s 3000\n", name)
		fmt.Fprintf(&conf, "sentinel parallel-syncs %s 1\n", name)
		fmt.Fprintf(&conf, "sentinel known-replica %s 127.0.0.1 %d\n", name, s.Replica.Port)
		for j := range n {
			if j != i {
				fmt.Fprintf(&conf, "sentinel known-sentinel %s 127.0.0.1 %d %s\n", name, ports[j], ids[j])
			}
		}
		file := filepath.Join(dirs[i], "sentinel.conf")
		if err := os.WriteFile(file, []byte(conf.String()), 0o600); err != nil {
			os.RemoveAll(dirs[i])
			return fail(err)
		}
		// A Server whose arguments are a config file and --sentinel: the
		// process handling (Pdeathsig, Kill, Pause, Stop) is Server's.
		sn := &Server{Port: ports[i], bin: s.Primary.bin, dir: dirs[i], args: []string{file, "--sentinel"}}
		if err := sn.start(); err != nil {
			os.RemoveAll(dirs[i])
			return fail(fmt.Errorf("redistest: start sentinel: %w", err))
		}
		s.Sentinels = append(s.Sentinels, sn)
	}
	if err := s.waitReady(30 * time.Second); err != nil {
		return fail(err)
	}
	return s, nil
}

// waitReplicating waits until replica is in sync with primary and
// acknowledges a write: a replica that has just synced may take a moment
// before it answers the primary's GETACK.
func waitReplicating(primary, replica *Server) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		info, _ := replica.Do("INFO", "replication")
		pinfo, _ := primary.Do("INFO", "replication")
		if strings.Contains(info, "master_link_status:up") && strings.Contains(pinfo, "state=online") {
			if r, err := DoOn(primary.Addr(), []string{"SET", "sluice:redistest:probe", "1"},
				[]string{"WAIT", "1", "1000"}); err == nil && r == "1" {
				_, err := primary.Do("DEL", "sluice:redistest:probe")
				return err
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: replica %s not in sync with primary %s after 15 s", replica.Addr(), primary.Addr())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReady waits until every sentinel sees the primary up with one replica
// up and linked, and both other sentinels connected.
func (s *Sentinel) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, sn := range s.Sentinels {
		for {
			why := s.notReady(sn)
			if why == "" {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("redistest: sentinel %s not ready after %v: %s", sn.Addr(), timeout, why)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

func (s *Sentinel) notReady(sn *Server) string {
	master, err := sn.Do("SENTINEL", "MASTER", s.Name)
	if err != nil {
		return err.Error()
	}
	m := fields(master)
	if m["flags"] != "master" || m["port"] != strconv.Itoa(s.Primary.Port) || m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" {
		return "SENTINEL MASTER: " + strings.ReplaceAll(master, "\n", " ")
	}
	replicas, err := sn.Do("SENTINEL", "REPLICAS", s.Name)
	if err != nil {
		return err.Error()
	}
	r := fields(replicas)
	if r["flags"] != "slave" || r["port"] != strconv.Itoa(s.Replica.Port) || r["master-link-status"] != "ok" {
		return "SENTINEL REPLICAS: " + strings.ReplaceAll(replicas, "\n", " ")
	}
	others, err := sn.Do("SENTINEL", "SENTINELS", s.Name)
	if err != nil {
		return err.Error()
	}
	if n := strings.Count(others, "\nflags\nsentinel\n"); n != 2 {
		return "SENTINEL SENTINELS: " + strings.ReplaceAll(others, "\n", " ")
	}
	return ""
}

// fields reads a flattened key/value reply (one element per line, as Do
// returns it). A key that occurs more than once keeps its last value.
func fields(flat string) map[string]string {
	lines := strings.Split(flat, "\n")
	m := make(map[string]string, len(lines)/2)
	for i := 0; i+1 < len(lines); i += 2 {
		m[lines[i]] = lines[i+1]
	}
	return m
}

// PrimaryAddr returns the primary's address as sentinel i reports it
// (SENTINEL GET-MASTER-ADDR-BY-NAME).
func (s *Sentinel) PrimaryAddr(i int) (string, error) {
	r, err := s.Sentinels[i].Do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.Name)
	if err != nil {
		return "", err
	}
	ip, port, ok := strings.Cut(r, "\n")
	if !ok {
		return "", fmt.Errorf("redistest: GET-MASTER-ADDR-BY-NAME %s: %q", s.Name, r)
	}
	return net.JoinHostPort(ip, port), nil
}

// WaitPrimary waits until every sentinel reports want as the primary and
// want itself reports the master role, and returns how long that took.
func (s *Sentinel) WaitPrimary(want *Server, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	for i := 0; i < len(s.Sentinels); {
		addr, err := s.PrimaryAddr(i)
		if err == nil && addr == want.Addr() {
			i++
			continue
		}
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("redistest: sentinel %s reports primary %q (%v), not %s, after %v",
				s.Sentinels[i].Addr(), addr, err, want.Addr(), timeout) //nolint:errorlint // err may be nil here: %v prints <nil>, %w would print %!w(<nil>)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for {
		role, err := want.Do("ROLE")
		if err == nil && strings.HasPrefix(role, "master\n") {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("redistest: %s reports role %q (%v) after %v", want.Addr(), role, err, timeout) //nolint:errorlint // err may be nil here: %v prints <nil>, %w would print %!w(<nil>)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Failover asks a sentinel for a failover (SENTINEL FAILOVER) while the
// primary is up: a controlled switch to the replica, which the old primary
// then follows. Wait for it with WaitPrimary(s.Replica, ...).
func (s *Sentinel) Failover() error {
	_, err := s.Sentinels[0].Do("SENTINEL", "FAILOVER", s.Name)
	return err
}

// WaitSynced waits until the replica has received everything the primary
// wrote so far: its replication offset has reached the primary's.
func (s *Sentinel) WaitSynced(timeout time.Duration) error {
	info, err := s.Primary.Do("INFO", "replication")
	if err != nil {
		return err
	}
	want, err := strconv.ParseInt(infoField(info, "master_repl_offset"), 10, 64)
	if err != nil {
		return fmt.Errorf("redistest: primary offset: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		info, _ := s.Replica.Do("INFO", "replication")
		got, err := strconv.ParseInt(infoField(info, "slave_repl_offset"), 10, 64)
		if err == nil && got >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: replica at offset %d (%v), primary at %d, after %v", got, err, want, timeout) //nolint:errorlint // err may be nil here: %v prints <nil>, %w would print %!w(<nil>)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// infoField returns the value of key in an INFO reply, or "".
func infoField(info, key string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+":"); ok {
			return v
		}
	}
	return ""
}

// DoOn sends the commands on one fresh connection to addr, in order, and
// returns the last reply as Server.Do does; an error reply to any of them
// is returned as the error. It is for commands that depend on their
// connection, such as WAIT after a write.
func DoOn(addr string, cmds ...[]string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second)) // fails only on a closed conn, which the write reports
	var b strings.Builder
	for _, args := range cmds {
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	var out strings.Builder
	for range cmds {
		out.Reset()
		if err := readReply(r, &out); err != nil {
			return "", err
		}
	}
	return strings.TrimSuffix(out.String(), "\n"), nil
}
