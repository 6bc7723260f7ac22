package faultproxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestMain checks, through goleak, that Close leaves no goroutine behind.
func TestMain(m *testing.M) { redistest.Main(m) }

// server is a pure-Go TCP server for the proxy tests: it echoes every line
// it receives and records what it received.
type server struct {
	ln net.Listener
	wg sync.WaitGroup

	mu    sync.Mutex
	got   bytes.Buffer
	conns []net.Conn
	echo  bool
}

func newServer(t *testing.T, echo bool) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{ln: ln, echo: echo}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						s.mu.Lock()
						s.got.Write(buf[:n])
						s.mu.Unlock()
						if s.echo {
							c.Write(buf[:n])
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *server) received() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got.String()
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// waitFor polls cond until it holds or 5 s pass: for state that has no
// signal, such as bytes having arrived at the server.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestForwardsBothWays(t *testing.T) {
	s := newServer(t, true)
	p := newProxy(t, s.ln.Addr().String())
	c := dial(t, p.Addr())
	r := bufio.NewReader(c)
	for i := range 100 {
		fmt.Fprintf(c, "line %d\n", i)
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("line %d\n", i); line != want {
			t.Fatalf("got %q, want %q", line, want)
		}
	}
	if p.Conns() != 1 || p.Accepted() != 1 {
		t.Fatalf("Conns %d, Accepted %d; want 1, 1", p.Conns(), p.Accepted())
	}
}

// TestLatencyKeepsOrder sends many small writes with a jitter larger than
// the gap between them: they must come back delayed and in order.
func TestLatencyKeepsOrder(t *testing.T) {
	s := newServer(t, true)
	p := newProxy(t, s.ln.Addr().String())
	const base, jitter = 20 * time.Millisecond, 15 * time.Millisecond
	p.SetLatency(base, jitter)
	c := dial(t, p.Addr())

	start := time.Now()
	fmt.Fprintf(c, "ping\n")
	r := bufio.NewReader(c)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 2*base {
		t.Fatalf("round trip %v, want at least %v", rtt, 2*base)
	}

	const n = 500
	errc := make(chan error, 1)
	go func() {
		for i := range n {
			if _, err := fmt.Fprintf(c, "%d\n", i); err != nil {
				errc <- err
				return
			}
			if i%50 == 0 {
				time.Sleep(time.Millisecond) // spread the writes over several chunks
			}
		}
		errc <- nil
	}()
	for i := range n {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := strconv.Atoi(strings.TrimSpace(line)); got != i {
			t.Fatalf("line %d came back as %q: reordered", i, line)
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}

	// With the latency still on, every round trip would take at least
	// 2*base; on a loaded machine one may be slow for other reasons, so
	// the fastest of a few is compared.
	p.SetLatency(0, 0)
	fastest := time.Hour
	for range 5 {
		start = time.Now()
		fmt.Fprintf(c, "fast\n")
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		fastest = min(fastest, time.Since(start))
	}
	if fastest >= 2*base {
		t.Errorf("fastest of 5 round trips %v after SetLatency(0, 0), want under %v", fastest, 2*base)
	}
}

// TestBlackholeHoldsBytes checks that nothing passes either way while the
// blackhole is on, and that the held bytes arrive, in order, after it.
func TestBlackholeHoldsBytes(t *testing.T) {
	s := newServer(t, true)
	p := newProxy(t, s.ln.Addr().String())
	c := dial(t, p.Addr())
	r := bufio.NewReader(c)
	fmt.Fprintf(c, "before\n")
	if line, err := r.ReadString('\n'); err != nil || line != "before\n" {
		t.Fatalf("%q, %v", line, err)
	}

	p.Blackhole(true)
	if _, err := fmt.Fprintf(c, "during\n"); err != nil {
		t.Fatalf("a write into a blackhole must succeed: %v", err)
	}
	c2 := dial(t, p.Addr()) // a new connection is stalled too
	fmt.Fprintf(c2, "new\n")
	c.SetReadDeadline(time.Now().Add(150 * time.Millisecond))
	if line, err := r.ReadString('\n'); !isTimeout(err) {
		t.Fatalf("read %q, %v through a blackhole; want a timeout", line, err)
	}
	if got := s.received(); strings.Contains(got, "during") || strings.Contains(got, "new") {
		t.Fatalf("server received %q through a blackhole", got)
	}
	if n := p.HeldReplies(); n != 0 {
		t.Errorf("HeldReplies() = %d with no request through before the blackhole, want 0", n)
	}

	p.Blackhole(false)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := r.ReadString('\n'); err != nil || line != "during\n" {
		t.Fatalf("after the blackhole: %q, %v; want the held line", line, err)
	}
	waitFor(t, "the new connection's bytes", func() bool { return strings.Contains(s.received(), "new") })
}

// TestBlackholeCountsHeldReplies: a reply whose request reached the server
// before the blackhole is held and counted.
func TestBlackholeCountsHeldReplies(t *testing.T) {
	s := newServer(t, true)
	p := newProxy(t, s.ln.Addr().String())
	// The reply is on its way for half a second after the request arrives:
	// time enough, even on a loaded machine, to start the blackhole first.
	p.SetLatency(500*time.Millisecond, 0)
	c := dial(t, p.Addr())
	fmt.Fprintf(c, "request\n")
	waitFor(t, "the request at the server", func() bool { return strings.Contains(s.received(), "request") })
	p.Blackhole(true)
	waitFor(t, "the reply to be held", func() bool { return p.HeldReplies() == 1 })
	p.Blackhole(false)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "request\n" {
		t.Fatalf("after the blackhole: %q, %v; want the held reply", line, err)
	}
	if n := p.HeldReplies(); n != 1 {
		t.Errorf("HeldReplies() = %d, want 1", n)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestDropReplies checks that requests reach the server, replies do not
// reach the client, and that ending the mode resets the damaged connection
// while leaving untouched ones alone.
func TestDropReplies(t *testing.T) {
	s := newServer(t, true)
	p := newProxy(t, s.ln.Addr().String())
	idle := dial(t, p.Addr())
	idleR := bufio.NewReader(idle)
	fmt.Fprintf(idle, "hello\n")
	if _, err := idleR.ReadString('\n'); err != nil {
		t.Fatal(err)
	}

	p.DropReplies(true)
	c := dial(t, p.Addr())
	fmt.Fprintf(c, "request\n")
	waitFor(t, "the request at the server", func() bool { return strings.Contains(s.received(), "request") })
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	buf := make([]byte, 64)
	if n, err := c.Read(buf); !isTimeout(err) {
		t.Fatalf("read %q, %v while replies are dropped; want a timeout", buf[:n], err)
	}

	p.DropReplies(false)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(buf); err == nil || isTimeout(err) {
		t.Fatalf("read %q, %v from a connection that lost a reply; want it reset", buf[:n], err)
	}
	fmt.Fprintf(idle, "still\n")
	idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := idleR.ReadString('\n'); err != nil || line != "still\n" {
		t.Fatalf("untouched connection: %q, %v", line, err)
	}
}

func TestResetAll(t *testing.T) {
	s := newServer(t, true)
	p := newProxy(t, s.ln.Addr().String())
	var conns []net.Conn
	for range 3 {
		c := dial(t, p.Addr())
		fmt.Fprintf(c, "x\n")
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	p.ResetAll()
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Fatalf("connection %d: %v after ResetAll; want reset", i, err)
		}
	}
	waitFor(t, "no connections", func() bool { return p.Conns() == 0 })
	c := dial(t, p.Addr())
	fmt.Fprintf(c, "again\n")
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "again\n" {
		t.Fatalf("new connection after ResetAll: %q, %v", line, err)
	}
}

// TestServerDown checks that a client connecting while the target is down
// sees its connection fail rather than hang.
func TestServerDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := newProxy(t, ln.Addr().String())
	ln.Close() // after New, so the proxy cannot be given the same port
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		return // reset so fast that connect saw it: fine
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("read: %v; want the connection closed", err)
	}
}

// TestCloseStopsEverything closes a proxy with connections in every state
// (forwarding, delayed, blackholed with a full queue); goleak in TestMain
// fails the run if a goroutine survives.
func TestCloseStopsEverything(t *testing.T) {
	s := newServer(t, false)
	p, err := New(s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p.SetLatency(time.Hour, 0)
	a := dial(t, p.Addr())
	fmt.Fprintf(a, "delayed\n")
	p.SetLatency(0, 0)
	p.Blackhole(true)
	b := dial(t, p.Addr())
	// More than the queue holds, so the reader blocks on a full queue.
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		io.Copy(b, bytes.NewReader(make([]byte, 4*queueChunks*chunkSize)))
	}()
	waitFor(t, "both connections", func() bool { return p.Conns() == 2 })
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	select { // the reset connection fails the blocked writer
	case <-copied:
	case <-time.After(5 * time.Second):
		t.Fatal("writer into the closed proxy still blocked")
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), 200*time.Millisecond); err == nil {
		t.Fatal("proxy still accepts after Close")
	}
}
