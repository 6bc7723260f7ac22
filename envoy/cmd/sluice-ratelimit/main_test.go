package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// childEnv marks a copy of the test binary that runs the service with the
// arguments of childArgsEnv (separated by newlines) until its stdin closes.
const (
	childEnv     = "SLUICE_RL_TEST_CHILD"
	childArgsEnv = "SLUICE_RL_TEST_ARGS"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		ctx, cancel := context.WithCancel(context.Background())
		go func() { io.Copy(io.Discard, os.Stdin); cancel() }()
		if err := run(ctx, strings.Split(os.Getenv(childArgsEnv), "\n"), os.Getenv, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	redistest.Main(m)
}

var servingRE = regexp.MustCompile(`msg="serving gRPC" addr=(\S+)`)

// lineWriter hands each line written to it to a channel, for a service
// started in this process.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			return len(p), nil
		}
		select {
		case w.lines <- line:
		default:
		}
	}
}

// startInProcess runs the service in this process with args, and returns
// its address, a function that waits for run's result, and its cancel.
func startInProcess(t *testing.T, args ...string) (string, func() error, context.CancelFunc) {
	addr, wait, cancel, _ := startLogged(t, args...)
	return addr, wait, cancel
}

// startLogged is startInProcess that also hands over the log lines that
// follow the one saying it serves.
func startLogged(t *testing.T, args ...string) (string, func() error, context.CancelFunc, <-chan string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &lineWriter{lines: make(chan string, 100)}
	ended := make(chan struct{})
	var result error
	go func() {
		defer close(ended)
		// A generous timeout first (a later flag wins): the machine may be
		// loaded.
		result = run(ctx, append([]string{"-grpc-addr", "127.0.0.1:0", "-timeout", "10s"}, args...), func(string) string { return "" }, out)
	}()
	wait := func() error { <-ended; return result }
	t.Cleanup(func() { cancel(); <-ended })
	for {
		select {
		case line := <-out.lines:
			if m := servingRE.FindStringSubmatch(line); m != nil {
				return m[1], wait, cancel, out.lines
			}
		case <-ended:
			t.Fatalf("run ended: %v", result)
		}
	}
}

func dial(t *testing.T, addr string) rlspb.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlspb.NewRateLimitServiceClient(conn)
}

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// TestEmbedded is the README's first command: no flags but an address,
// the built-in example on an embedded miniredis, answering at once.
func TestEmbedded(t *testing.T) {
	addr, wait, cancel := startInProcess(t)
	client := dial(t, addr)
	r := &rlspb.RateLimitRequest{Domain: "example", Descriptors: []*rlcommon.RateLimitDescriptor{desc("org", "acme"), desc("user", "alice")}}
	var codes []rlspb.RateLimitResponse_Code
	for range 6 {
		resp, err := client.ShouldRateLimit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, resp.OverallCode)
	}
	if fmt.Sprint(codes) != "[OK OK OK OK OK OVER_LIMIT]" {
		t.Fatalf("alice's six requests: %v, want five OK (the example's 5 a minute)", codes)
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatalf("run: %v", err)
	}
}

// TestGracefulDrain: a call in flight when the shutdown starts is
// answered, not cut, and the health check says NOT_SERVING meanwhile.
func TestGracefulDrain(t *testing.T) {
	srv := redistest.NewServer(t)
	proxy, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/c.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr, wait, cancel, lines := startLogged(t, "-redis", proxy.Addr(), "-config", dir, "-timeout", "30s")
	client := dial(t, addr)
	r := &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v")}}
	if _, err := client.ShouldRateLimit(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	// The next call's replies come back 2 s late: once its script has run
	// in Redis (the server counted one more EVALSHA), the call is in
	// flight in the service for about 2 s more.
	evals := func() int {
		out, _ := srv.Do("INFO", "commandstats")
		_, rest, _ := strings.Cut(out, "cmdstat_evalsha:calls=")
		n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
		return n
	}
	before := evals()
	proxy.SetLatency(2*time.Second, 0)
	answered := make(chan error, 1)
	go func() {
		_, err := client.ShouldRateLimit(context.Background(), r)
		answered <- err
	}()
	if !redistest.WaitFor(context.Background(), 30*time.Second, func() bool { return evals() > before }) {
		t.Fatal("the call did not reach Redis")
	}
	cancel()
	for line := range lines {
		if strings.Contains(line, `msg="shutting down"`) {
			break
		}
	}
	if err := <-answered; err != nil {
		t.Fatalf("call in flight at shutdown: %v, want an answer", err)
	}
	if err := wait(); err != nil {
		t.Fatalf("run: %v", err)
	}
}

func TestFlagsFromEnvironment(t *testing.T) {
	env := map[string]string{"SLUICE_RL_REDIS": "10.0.0.5:6379", "SLUICE_RL_FALLBACK_LOCAL": "true", "SLUICE_RL_TIMEOUT": "15ms", "SLUICE_RL_PREFIX": "env:"}
	c, err := parseFlags([]string{"-prefix", "flag:"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if c.redis != "10.0.0.5:6379" || !c.fallbackLocal || c.timeout != 15*time.Millisecond || c.prefix != "flag:" {
		t.Fatalf("%+v: want the environment, and the flag over it", c)
	}
	if _, err := parseFlags(nil, func(k string) string { return map[string]string{"SLUICE_RL_TIMEOUT": "soon"}[k] }); err == nil || !strings.Contains(err.Error(), "SLUICE_RL_TIMEOUT") {
		t.Fatalf("bad environment value: %v", err)
	}
}

func TestCheck(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-check"}, func(string) string { return "" }, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "domains: example") {
		t.Fatalf("-check printed %q", out.String())
	}
	dir := t.TempDir()
	os.WriteFile(dir+"/bad.yaml", []byte("domain: x\nfoo: 1\n"), 0o644)
	if err := run(context.Background(), []string{"-check", "-config", dir}, func(string) string { return "" }, &out); err == nil || !strings.Contains(err.Error(), "bad.yaml") {
		t.Fatalf("-check of a bad file: %v", err)
	}
}

// child is a copy of this binary running the service.
type child struct {
	cmd   *exec.Cmd
	stdin io.Closer
	addr  string
}

func startChild(t *testing.T, args ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childArgsEnv+"="+strings.Join(append([]string{"-grpc-addr", "127.0.0.1:0", "-timeout", "10s"}, args...), "\n"))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, stdin: stdin}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if m := servingRE.FindStringSubmatch(sc.Text()); m != nil {
			c.addr = m[1]
			break
		}
	}
	if c.addr == "" {
		t.Fatal("child service did not start")
	}
	go io.Copy(io.Discard, stdout)
	return c
}

// TestMultiProcessExact: three processes of the service share one Redis
// (single server, then cluster); 48 clients spread over them send 400
// requests of 10 users of one organisation. The organisation allows 30 an
// hour and each user 5: exactly 30 pass, no user over 5, and afterwards
// each counter holds exactly the requests it let through: the 370 refused
// counted nowhere.
func TestMultiProcessExact(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 3 processes")
	}
	dir := t.TempDir()
	cfg := "domain: api\ndescriptors:\n  - key: org\n    rate_limit: {unit: hour, requests_per_unit: 30}\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: gcra}\n"
	if err := os.WriteFile(dir+"/api.yaml", []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tg := range []struct {
		name  string
		addrs func() []string
	}{
		{"single", func() []string { return []string{redistest.Single(t).Addr()} }},
		{"cluster", func() []string { return redistest.SharedCluster(t).Addrs() }},
	} {
		t.Run(tg.name, func(t *testing.T) {
			prefix := fmt.Sprintf("mp:%s:%d:", tg.name, time.Now().UnixNano())
			var clients []rlspb.RateLimitServiceClient
			for range 3 {
				c := startChild(t, "-redis", strings.Join(tg.addrs(), ","), "-config", dir, "-prefix", prefix)
				clients = append(clients, dial(t, c.addr))
			}
			const users, perUser, workers = 10, 40, 48
			var passed [users]atomic.Int64
			var next atomic.Int64
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for {
						i := next.Add(1) - 1
						if i >= users*perUser {
							return
						}
						u := int(i % users)
						r := &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{desc("org", "acme"), desc("user", fmt.Sprint("u", u))}}
						resp, err := clients[w%len(clients)].ShouldRateLimit(context.Background(), r)
						if err != nil {
							t.Error(err)
							return
						}
						if resp.OverallCode == rlspb.RateLimitResponse_OK {
							passed[u].Add(1)
						}
					}
				})
			}
			wg.Wait()
			var total int64
			for u := range users {
				n := passed[u].Load()
				total += n
				if n > 5 {
					t.Errorf("user %d: %d passed, over its 5", u, n)
				}
				peek := desc("user", fmt.Sprint("u", u))
				peek.HitsAddend = wrapperspb.UInt64(0)
				resp, err := clients[0].ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{peek}})
				if err != nil {
					t.Fatal(err)
				}
				if got := 5 - int64(resp.Statuses[0].LimitRemaining); got != n {
					t.Errorf("user %d's counter holds %d, %d passed", u, got, n)
				}
			}
			if total != 30 {
				t.Fatalf("%d passed, want the organisation's 30", total)
			}
			peek := desc("org", "acme")
			peek.HitsAddend = wrapperspb.UInt64(0)
			resp, err := clients[1].ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{peek}})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Statuses[0].LimitRemaining != 0 {
				t.Fatalf("organisation: %d left, want 0", resp.Statuses[0].LimitRemaining)
			}
		})
	}
}

// TestHealth: the standard health service answers SERVING for the rate
// limit service.
func TestHealth(t *testing.T) {
	addr, _, _ := startInProcess(t)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: rlspb.RateLimitService_ServiceDesc.ServiceName})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", resp, err)
	}
}
