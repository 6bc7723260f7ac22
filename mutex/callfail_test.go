package mutex_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// failingClient runs the next script call whose keys name armed, then
// answers it with a reset connection, as if the connection broke after the
// server ran it. With hold set, it waits for release before it answers.
type failingClient struct {
	scriptcache.Client
	mu      sync.Mutex
	armed   string
	hold    bool
	sent    chan struct{} // closed when the armed call has run
	release chan struct{} // with hold: close to answer the armed call
}

func newFailingClient(c scriptcache.Client) *failingClient {
	return &failingClient{Client: c, sent: make(chan struct{}), release: make(chan struct{})}
}

func (c *failingClient) arm(name string, hold bool) {
	c.mu.Lock()
	c.armed, c.hold = name, hold
	c.mu.Unlock()
}

// take reports whether this call is the armed one (and disarms).
func (c *failingClient) take(keys []string) (armed, hold bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	armed = c.armed != "" && slices.ContainsFunc(keys, func(k string) bool { return strings.Contains(k, c.armed) })
	if armed {
		c.armed = ""
	}
	return armed, c.hold
}

var errReset = &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}

func (c *failingClient) fail(hold bool) {
	close(c.sent)
	if hold {
		<-c.release
	}
}

func (c *failingClient) Eval(ctx context.Context, sha, body string, keys, args []string) scriptcache.Reply {
	armed, hold := c.take(keys)
	r := c.Client.Eval(ctx, sha, body, keys, args)
	if !armed {
		return r
	}
	c.fail(hold)
	return scriptcache.ErrorReply(errReset)
}

func (c *failingClient) EvalWait(ctx context.Context, sha, body string, keys, args []string, replicas int64, timeout time.Duration) (scriptcache.Reply, int64, error) {
	armed, hold := c.take(keys)
	r, acks, err := c.Client.EvalWait(ctx, sha, body, keys, args, replicas, timeout)
	if !armed {
		return r, acks, err
	}
	c.fail(hold)
	return scriptcache.ErrorReply(errReset), 0, errReset
}

func newFailingLocker(t *testing.T, addr string, opts mutex.Options) (*mutex.Locker, *failingClient) {
	t.Helper()
	ctx := context.Background()
	sc0, err := scriptcache.New(ctx, redistest.Client(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	c := newFailingClient(sc0.Client())
	sc, err := scriptcache.NewFrom(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	l, err := mutex.NewLocker(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l, c
}

// TestFailedCallGivesBack: a lock call that ran on the server but whose
// connection broke before the reply leaves the Lock with an error and
// nothing held: the grant nobody knows of is given back, with and without
// ReplicaAcks (whose call, script and WAIT, has a path of its own), for
// Mutex and RWMutex. Without the give-back the name stays taken for the
// 30 s lease.
func TestFailedCallGivesBack(t *testing.T) {
	addr := redistest.Single(t).Addr()
	plain := newLocker(t, redistest.Client(t, addr), mutex.Options{})
	for _, tc := range []struct {
		name string
		opts mutex.Options
	}{
		{"plain", mutex.Options{}},
		{"replica-acks", mutex.Options{ReplicaAcks: 1, ReplicaTimeout: time.Millisecond}},
	} {
		for _, rw := range []bool{false, true} {
			name := tc.name + "-mutex"
			if rw {
				name = tc.name + "-rw"
			}
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				l, c := newFailingLocker(t, addr, tc.opts)
				c.arm("callfail-"+name, false)
				var err error
				if rw {
					m, merr := l.NewRWMutex("callfail-" + name)
					if merr != nil {
						t.Fatal(merr)
					}
					err = m.Lock(ctx)
				} else {
					err = newMutex(t, l, "callfail-"+name).Lock(ctx)
				}
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("Lock = %v, want the connection's error", err)
				}
				lctx, cancel := context.WithTimeout(ctx, signal)
				defer cancel()
				if rw {
					other, merr := plain.NewRWMutex("callfail-" + name)
					if merr != nil {
						t.Fatal(merr)
					}
					if err := other.Lock(lctx); err != nil {
						t.Fatalf("the failed call's grant was not given back: %v", err)
					}
					other.Unlock(ctx)
					return
				}
				other := newMutex(t, plain, "callfail-"+name)
				if err := other.Lock(lctx); err != nil {
					t.Fatalf("the failed call's grant was not given back: %v", err)
				}
				other.Unlock(ctx)
			})
		}
	}
}

// TestLockFailingDuringCloseReturnsErrClosed: a Lock whose call fails on
// its own after its Locker's Close began returns ErrClosed, as Close
// promises every Lock that waits, not the connection's error.
func TestLockFailingDuringCloseReturnsErrClosed(t *testing.T) {
	addr := redistest.Single(t).Addr()
	for _, tc := range []struct {
		name string
		opts mutex.Options
	}{
		{"plain", mutex.Options{}},
		{"replica-acks", mutex.Options{ReplicaAcks: 1, ReplicaTimeout: time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			l, c := newFailingLocker(t, addr, tc.opts)
			m := newMutex(t, l, "closefail-"+tc.name)
			probe := newMutex(t, l, "closefail-probe-"+tc.name)
			c.arm("closefail-"+tc.name, true)
			locked := make(chan error, 1)
			go func() { locked <- m.Lock(ctx) }()
			select {
			case <-c.sent:
			case <-time.After(signal):
				t.Fatal("the Lock's call was not sent")
			}
			closed := make(chan struct{})
			go func() { l.Close(); close(closed) }()
			// Close marks the Locker closed before it waits for anything:
			// an outermost TryLock then refuses at once. One that got in
			// before is unlocked again, or the next would only nest.
			deadline := time.Now().Add(signal)
			for {
				err := probe.TryLock(ctx)
				if errors.Is(err, mutex.ErrClosed) {
					break
				}
				if err == nil {
					_ = probe.Unlock(ctx)
				}
				if time.Now().After(deadline) {
					t.Fatalf("Close did not mark the Locker closed (TryLock: %v)", err)
				}
				time.Sleep(time.Millisecond)
			}
			close(c.release)
			var err error
			select {
			case err = <-locked:
			case <-time.After(signal):
				t.Fatal("Lock did not return")
			}
			if !errors.Is(err, mutex.ErrClosed) {
				t.Fatalf("Lock = %v, want ErrClosed", err)
			}
			select {
			case <-closed:
			case <-time.After(signal):
				t.Fatal("Close did not return")
			}
		})
	}
}

// TestExtendUnknownOutcomeShortens: an Extend that shortens the lease and
// fails with its outcome unknown (here: the server ran it, the reply was
// lost) may have been applied, so the hold is known to last only until the
// shorter lease's end. Before, HeldUntil kept the old end, 30 s away, while
// the server freed the lock after 200 ms: another owner could take it while
// this one was still Valid (the fault harness's soak saw exactly that).
func TestExtendUnknownOutcomeShortens(t *testing.T) {
	ctx := context.Background()
	addr := redistest.Single(t).Addr()
	l, c := newFailingLocker(t, addr, mutex.Options{})
	m := newMutex(t, l, "extend-unknown", mutex.WithLease(30*time.Second))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Unlock(ctx)
	c.arm("extend-unknown", false)
	sent := time.Now()
	if _, err := m.Extend(ctx, 200*time.Millisecond); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("Extend = %v, want the connection's error", err)
	}
	if until := m.HeldUntil(); until.After(sent.Add(200 * time.Millisecond)) {
		t.Fatalf("HeldUntil = %v after the call, want no later than the 200 ms lease that may have been taken (%v)", until.Sub(sent), 200*time.Millisecond)
	}
	select {
	case <-m.Lost():
	case <-time.After(signal):
		t.Fatal("Lost did not close at the end of the shorter lease")
	}
	other := newMutex(t, newLocker(t, redistest.Client(t, addr), mutex.Options{}), "extend-unknown")
	lctx, cancel := context.WithTimeout(ctx, signal)
	defer cancel()
	if err := other.Lock(lctx); err != nil {
		t.Fatalf("the lock after the shorter lease: %v", err)
	}
	other.Unlock(ctx)

	// A longer lease whose outcome is unknown changes nothing: the old
	// end holds either way.
	l2, c2 := newFailingLocker(t, addr, mutex.Options{})
	m2 := newMutex(t, l2, "extend-unknown-longer", mutex.WithLease(5*time.Second))
	if err := m2.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer m2.Unlock(ctx)
	before := m2.HeldUntil()
	c2.arm("extend-unknown-longer", false)
	if _, err := m2.Extend(ctx, 20*time.Second); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("Extend = %v, want the connection's error", err)
	}
	if until := m2.HeldUntil(); !until.Equal(before) {
		t.Fatalf("HeldUntil = %v after a longer Extend of unknown outcome, want the old %v", until, before)
	}
}
