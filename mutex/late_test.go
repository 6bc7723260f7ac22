package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/faultproxy"
	"github.com/sluicekit/sluice/internal/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// The late-reply tests run one side through a proxy whose round trip (1 s)
// is far longer than the lease (300 ms): every grant it gets is over on the
// server before its answer arrives, whatever the scheduling.
const (
	lateLatency = 500 * time.Millisecond // each way
	lateLease   = 300 * time.Millisecond
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

// TestLateGrantIsNotAHold: a Lock whose grant arrives after its lease ended
// must not return nil; meanwhile another owner takes the lock and must keep
// it. TryLock fails with ErrNotObtained. Fair and unfair alike.
func TestLateGrantIsNotAHold(t *testing.T) {
	for _, fair := range []bool{false, true} {
		name := "unfair"
		if fair {
			name = "fair"
		}
		t.Run(name, func(t *testing.T) {
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
			// A's late grants end on the server by their lease; B gets in
			// between them.
			bctx, bcancel := context.WithTimeout(ctx, signal)
			defer bcancel()
			if err := b.Lock(bctx); err != nil {
				t.Fatalf("B's Lock: %v", err)
			}
			if err := <-got; !errors.Is(err, mutex.ErrNotObtained) {
				t.Fatalf("A's Lock with late grants while B holds = %v, want ErrNotObtained", err)
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
			bctx, bcancel := context.WithTimeout(ctx, signal)
			defer bcancel()
			if err := b.Lock(bctx); err != nil {
				t.Fatalf("B's Lock: %v", err)
			}
			if err := <-got; !errors.Is(err, mutex.ErrNotObtained) {
				t.Fatalf("A's lock with late grants while B writes = %v, want ErrNotObtained", err)
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
