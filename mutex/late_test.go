package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// The late-reply tests run one side through a proxy whose round trip (at
// least 1 s) is longer than the lease (900 ms) by more than the margin:
// every grant it gets is over on the client (at 810 ms) before its answer
// arrives, whatever the scheduling, since delays only add. The lease is
// long enough that another owner sees the late grant held on the server
// before it starts to compete.
const (
	lateLatency = 500 * time.Millisecond // each way
	lateLease   = 900 * time.Millisecond
)

// lateProxy returns a proxy to srv, with no latency yet: the caller warms
// its connections up first.
func lateProxy(t *testing.T, srv *redistest.Server) *faultproxy.Proxy {
	t.Helper()
	proxy, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	return proxy
}

// waitRedis waits, polling, for state in Redis that has no signal to wait
// on.
func waitRedis(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !redistest.WaitFor(context.Background(), signal, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestLateGrantIsNotAHold: a Lock whose grant arrives after its lease ended
// must not return nil (before, it did, and the other owner that took the
// lock when that lease ended on the server held it too); it gives the grant
// back and tries again within its ctx. The other owner keeps its hold.
// TryLock fails with ErrNotObtained. Fair and unfair alike.
func TestLateGrantIsNotAHold(t *testing.T) {
	for _, fair := range []bool{false, true} {
		name := "unfair"
		if fair {
			name = "fair"
		}
		t.Run(name, func(t *testing.T) {
			// The two cases have a server and a proxy each and spend
			// their ~10 s waiting on the proxy's delays: side by side.
			t.Parallel()
			ctx := context.Background()
			srv := redistest.NewServer(t)
			proxy := lateProxy(t, srv)
			slow := newLocker(t, redistest.Client(t, proxy.Addr()), mutex.Options{Fair: fair})
			fast := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{Fair: fair})
			a := newMutex(t, slow, "late", mutex.WithLease(lateLease))
			b := newMutex(t, fast, "late")
			if err := a.TryLock(ctx); err != nil { // connections up, scripts loaded
				t.Fatal(err)
			}
			if err := a.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			proxy.SetLatency(lateLatency, 0)

			if err := a.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
				t.Fatalf("TryLock with a late grant = %v, want ErrNotObtained", err)
			}
			if h := a.Holds(); h != 0 {
				t.Fatalf("Holds() = %d after a late TryLock, want 0", h)
			}

			lctx, cancel := context.WithTimeout(ctx, 4*time.Second)
			defer cancel()
			got := make(chan error, 1)
			go func() { got <- a.Lock(lctx) }()
			// B competes once A's late grant is held on the server, and gets
			// the lock when that grant's lease ends there.
			waitRedis(t, "A's grant held on the server", func() bool {
				in, err := b.Info(ctx)
				return err == nil && in.Owner == a.Owner()
			})
			bctx, bcancel := context.WithTimeout(ctx, signal)
			defer bcancel()
			if err := b.Lock(bctx); err != nil {
				t.Fatalf("B's Lock: %v", err)
			}
			// A's late grants are given back, and A keeps trying (and
			// finds B holding) until its ctx ends.
			if err := <-got; !errors.Is(err, mutex.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("A's Lock with late grants while B holds = %v, want ErrNotObtained at its deadline", err)
			}
			if h := a.Holds(); h != 0 {
				t.Fatalf("A's Holds() = %d, want 0", h)
			}
			select {
			case <-b.Lost():
				t.Fatalf("B lost the lock: %v", b.Err())
			default:
			}
			if err := b.Unlock(ctx); err != nil {
				t.Fatalf("B's Unlock = %v; A's give-backs must leave B's hold alone", err)
			}
		})
	}
}

// TestLateRWGrantIsNotAHold: TestLateGrantIsNotAHold for the write lock
// and the read holds of an RWMutex; the other owner is a writer.
func TestLateRWGrantIsNotAHold(t *testing.T) {
	for _, write := range []bool{true, false} {
		name := "read"
		if write {
			name = "write"
		}
		t.Run(name, func(t *testing.T) {
			// The two cases have a server and a proxy each and spend
			// their ~10 s waiting on the proxy's delays: side by side.
			t.Parallel()
			ctx := context.Background()
			srv := redistest.NewServer(t)
			proxy := lateProxy(t, srv)
			slow := newLocker(t, redistest.Client(t, proxy.Addr()), mutex.Options{})
			fast := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{})
			a, err := slow.NewRWMutex("late", mutex.WithLease(lateLease))
			if err != nil {
				t.Fatal(err)
			}
			b, err := fast.NewRWMutex("late")
			if err != nil {
				t.Fatal(err)
			}
			lock, try, unlock := a.Lock, a.TryLock, a.Unlock
			if !write {
				lock, try, unlock = a.RLock, a.TryRLock, a.RUnlock
			}
			if err := try(ctx); err != nil { // connections up, scripts loaded
				t.Fatal(err)
			}
			if err := unlock(ctx); err != nil {
				t.Fatal(err)
			}
			proxy.SetLatency(lateLatency, 0)

			if err := try(ctx); !errors.Is(err, mutex.ErrNotObtained) {
				t.Fatalf("try with a late grant = %v, want ErrNotObtained", err)
			}
			if w, r := a.Holds(); w != 0 || r != 0 {
				t.Fatalf("Holds() = %d, %d after a late try, want 0, 0", w, r)
			}

			lctx, cancel := context.WithTimeout(ctx, 4*time.Second)
			defer cancel()
			got := make(chan error, 1)
			go func() { got <- lock(lctx) }()
			waitRedis(t, "A's grant held on the server", func() bool {
				in, err := b.Info(ctx)
				return err == nil && (in.Writer == a.Owner() || !write && in.Readers > 0)
			})
			bctx, bcancel := context.WithTimeout(ctx, signal)
			defer bcancel()
			if err := b.Lock(bctx); err != nil {
				t.Fatalf("B's Lock: %v", err)
			}
			if err := <-got; !errors.Is(err, mutex.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("A's lock with late grants while B writes = %v, want ErrNotObtained at its deadline", err)
			}
			if w, r := a.Holds(); w != 0 || r != 0 {
				t.Fatalf("A's Holds() = %d, %d, want 0, 0", w, r)
			}
			select {
			case <-b.Lost():
				t.Fatalf("B lost the lock: %v", b.Err())
			default:
			}
			if err := b.Unlock(ctx); err != nil {
				t.Fatalf("B's Unlock = %v; A's give-backs must leave B's hold alone", err)
			}
		})
	}
}

// TestLateExtendIsLoss: an Extend whose answer arrives after the new lease
// it asked for has ended (on the client's clock) must not return a
// deadline and nil: the server may have let the hold go meanwhile. It
// reports the loss.
func TestLateExtendIsLoss(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	proxy := lateProxy(t, srv)
	l := newLocker(t, redistest.Client(t, proxy.Addr()), mutex.Options{})
	m := newMutex(t, l, "late-extend", mutex.WithLease(10*time.Second))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.SetLatency(lateLatency, 0)
	if until, err := m.Extend(ctx, lateLease); !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("Extend answered after its lease = %v, %v; want ErrLost", until, err)
	}
	if !errors.Is(m.Err(), mutex.ErrLost) {
		t.Fatalf("Err() = %v, want ErrLost", m.Err())
	}
	select {
	case <-m.Lost():
	default:
		t.Fatal("Lost not closed")
	}
	proxy.SetLatency(0, 0)
	if err := m.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Fatalf("Unlock after the loss = %v, want ErrNotHeld", err)
	}
}
