package goredis_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice/goredis"
	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// failingConn fails the first write of a SUBSCRIBE or SSUBSCRIBE while
// *left is positive, as a connection reset between the dial and that
// write does.
type failingConn struct {
	net.Conn
	left *atomic.Int32
}

func (c *failingConn) Write(b []byte) (int, error) {
	if bytes.Contains(bytes.ToLower(b), []byte("subscribe")) && c.left.Add(-1) >= 0 {
		c.Close()
		return 0, errors.New("connection reset by the test")
	}
	return c.Conn.Write(b)
}

// TestSubscribeWriteFails: when the write of the subscription fails,
// go-redis reconnects the PubSub at once, before the channel is recorded
// as subscribed, so the new connection carries no subscription and a
// Receive on it waits for ever: no confirmation, no message, no error.
// (A reset of the connection between the dial and the write does this.)
// Subscribe must not read such a PubSub: it must subscribe again, and the
// subscription must then be confirmed and carry messages.
func TestSubscribeWriteFails(t *testing.T) {
	srv := redistest.NewServer(t)
	for _, sharded := range []bool{false, true} {
		name := map[bool]string{false: "plain", true: "sharded"}[sharded]
		t.Run(name, func(t *testing.T) {
			var left atomic.Int32
			left.Store(1)
			rdb := redis.NewClient(&redis.Options{
				Addr: srv.Addr(),
				Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
					c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
					if err != nil {
						return nil, err
					}
					return &failingConn{Conn: c, left: &left}, nil
				},
			})
			t.Cleanup(func() { rdb.Close() })
			c, err := goredis.Wrap(rdb)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			confirmed := make(chan struct{}, 16)
			got := make(chan string, 16)
			done := make(chan struct{})
			go func() { // what the notify hub does: subscribe again after a failure
				defer close(done)
				for ctx.Err() == nil {
					if err := c.Subscribe(ctx, "wf."+name, sharded,
						func() { confirmed <- struct{}{} },
						func(p string) { got <- p }); ctx.Err() == nil {
						t.Logf("subscribe: %v", err)
					}
				}
			}()
			defer func() { cancel(); <-done }()
			select {
			case <-confirmed:
			case <-time.After(10 * time.Second):
				t.Fatal("no confirmation within 10s after a failed subscription write")
			}
			if left.Load() >= 0 {
				t.Fatal("the subscription write did not fail: the test tested nothing")
			}
			publish := "PUBLISH"
			if sharded {
				publish = "SPUBLISH"
			}
			if _, err := srv.Do(publish, "wf."+name, "hello"); err != nil {
				t.Fatal(err)
			}
			select {
			case p := <-got:
				if p != "hello" {
					t.Fatalf("message %q, want hello", p)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the confirmed subscription carried no message")
			}
		})
	}
}

// subscribed runs c.Subscribe of channel until it returns, and reports
// its confirmations, messages and end.
type subscribed struct {
	confirmed chan struct{}
	got       chan string
	end       chan error
}

func subscribe(ctx context.Context, c *goredis.Client, channel string) *subscribed {
	s := &subscribed{confirmed: make(chan struct{}, 16), got: make(chan string, 16), end: make(chan error, 1)}
	go func() {
		s.end <- c.Subscribe(ctx, channel, false,
			func() { s.confirmed <- struct{}{} },
			func(p string) { s.got <- p })
	}()
	return s
}

// waitConfirmed waits for the subscription's first confirmation.
func (s *subscribed) waitConfirmed(t *testing.T) {
	t.Helper()
	select {
	case <-s.confirmed:
	case err := <-s.end:
		t.Fatalf("Subscribe ended before its confirmation: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no confirmation within 10s")
	}
}

// quietClient wraps a go-redis client of addr, closed when t ends, that
// gives a subscription's connection a second of quiet: a confirmation has
// two ticks to come, and a PONG one, even on a loaded machine.
func quietClient(t *testing.T, addr string) *goredis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	c, err := goredis.Wrap(rdb)
	if err != nil {
		t.Fatal(err)
	}
	goredis.SetSubscriptionQuiet(c, time.Second)
	return c
}

// TestSubscribeSilentConnection: a subscription's connection that goes
// silent without a reset (a partition, a NAT that dropped it) must end
// Subscribe, for the caller to subscribe again: go-redis's Receive
// would wait on it for ever.
func TestSubscribeSilentConnection(t *testing.T) {
	srv := redistest.NewServer(t)
	proxy, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	c := quietClient(t, proxy.Addr())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := subscribe(ctx, c, "silent")
	s.waitConfirmed(t)
	proxy.Blackhole(true)
	defer proxy.Blackhole(false)
	select {
	case err := <-s.end:
		if err == nil || !strings.Contains(err.Error(), "no reply to a PING") {
			t.Fatalf("Subscribe ended with %v, want no reply to a PING", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Subscribe still reading a silent connection after 10s (quiet 1s)")
	}
}

var pingCalls = regexp.MustCompile(`cmdstat_ping:calls=(\d+)`)

// TestSubscribeQuietConnectionKept: a subscription that hears nothing
// but answers the PINGs is kept, and still carries messages.
func TestSubscribeQuietConnectionKept(t *testing.T) {
	srv := redistest.NewServer(t)
	c := quietClient(t, srv.Addr())
	ctx, cancel := context.WithCancel(context.Background())
	s := subscribe(ctx, c, "quiet")
	defer func() {
		cancel()
		if err := <-s.end; !errors.Is(err, context.Canceled) {
			t.Errorf("Subscribe ended with %v, want its context's end", err)
		}
	}()
	s.waitConfirmed(t)
	pings := func() int {
		out, _ := srv.Do("INFO", "commandstats")
		m := pingCalls.FindStringSubmatch(out)
		if m == nil {
			return 0
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	base := pings()
	if !redistest.WaitFor(ctx, 20*time.Second, func() bool { return pings() >= base+3 }) {
		t.Fatalf("%d PINGs in 20s on a quiet subscription (quiet 1s), want 3", pings()-base)
	}
	select {
	case err := <-s.end:
		t.Fatalf("Subscribe ended on a connection that answers its PINGs: %v", err)
	default:
	}
	if _, err := srv.Do("PUBLISH", "quiet", "hello"); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-s.got:
		if p != "hello" {
			t.Fatalf("message %q, want hello", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the kept subscription carried no message")
	}
}
