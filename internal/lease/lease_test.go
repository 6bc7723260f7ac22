package lease

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// lostRecorder is an onLost callback that records the reason and when.
type lostRecorder struct {
	ch chan error
	at atomic.Int64
}

func newLost() *lostRecorder { return &lostRecorder{ch: make(chan error, 1)} }

func (r *lostRecorder) fn(err error) {
	r.at.Store(time.Now().UnixNano())
	r.ch <- err
}

func TestRenewedLeaseIsNotLost(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	var renewals atomic.Int64
	lost := newLost()
	const ttl = 90 * time.Millisecond
	l := k.Add(time.Now(), ttl, func(ctx context.Context) error { renewals.Add(1); return nil }, lost.fn)
	// Hold for 5 TTLs: renewal every ttl/3 keeps it.
	select {
	case err := <-lost.ch:
		t.Fatalf("lost after %d renewals: %v", renewals.Load(), err)
	case <-time.After(5 * ttl):
	}
	l.Stop()
	if n := renewals.Load(); n < 5 {
		t.Errorf("renewals in 5 TTLs = %d, want about 15 (at least 5)", n)
	}
	n := renewals.Load()
	time.Sleep(ttl) // nothing to wait for: asserting that nothing happens
	if got := renewals.Load(); got != n {
		t.Errorf("renewals after Stop: %d, want %d", got, n)
	}
}

func TestGoneIsLost(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	lost := newLost()
	k.Add(time.Now(), 60*time.Millisecond, func(ctx context.Context) error {
		return errors.Join(ErrGone, errors.New("owner changed"))
	}, lost.fn)
	if err := <-lost.ch; !errors.Is(err, ErrGone) {
		t.Fatalf("lost with %v, want ErrGone", err)
	}
}

// TestHangingRenewalExpires blackholes renewals: the loss must be reported
// before sent+ttl, the earliest the server could expire the lease.
func TestHangingRenewalExpires(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	lost := newLost()
	const ttl = 150 * time.Millisecond
	sent := time.Now()
	k.Add(sent, ttl, func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, lost.fn)
	if err := <-lost.ch; !errors.Is(err, ErrExpired) {
		t.Fatalf("lost with %v, want ErrExpired", err)
	}
	if at := time.Unix(0, lost.at.Load()); !at.Before(sent.Add(ttl)) {
		t.Errorf("loss reported %v after sent, want before the ttl %v", at.Sub(sent), ttl)
	}
}

func TestFailingRenewalsRetryThenExpire(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	lost := newLost()
	var calls atomic.Int64
	const ttl = 120 * time.Millisecond
	k.Add(time.Now(), ttl, func(ctx context.Context) error { calls.Add(1); return errors.New("connection refused") }, lost.fn)
	if err := <-lost.ch; !errors.Is(err, ErrExpired) {
		t.Fatalf("lost with %v, want ErrExpired", err)
	}
	// Renewal starts at ttl/3 and retries every ttl/12: several tries.
	if n := calls.Load(); n < 3 {
		t.Errorf("renewal attempts before expiry = %d, want >= 3", n)
	}
}

func TestTransientFailureRecovers(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	lost := newLost()
	var calls atomic.Int64
	const ttl = 120 * time.Millisecond
	l := k.Add(time.Now(), ttl, func(ctx context.Context) error {
		if calls.Add(1) == 1 {
			return errors.New("EOF")
		}
		return nil
	}, lost.fn)
	select {
	case err := <-lost.ch:
		t.Fatalf("lost: %v", err)
	case <-time.After(4 * ttl):
	}
	l.Stop()
}

func TestFixedLeaseEnds(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	lost := newLost()
	sent := time.Now()
	k.Add(sent, 50*time.Millisecond, nil, lost.fn)
	if err := <-lost.ch; !errors.Is(err, ErrExpired) {
		t.Fatalf("lost with %v, want ErrExpired", err)
	}
	if d := time.Unix(0, lost.at.Load()).Sub(sent); d > 50*time.Millisecond {
		t.Errorf("fixed lease reported lost %v after sent, want by its 50ms end", d)
	}
}

func TestCloseReportsHeldLeases(t *testing.T) {
	k := NewKeeper()
	lost := newLost()
	k.Add(time.Now(), time.Hour, func(ctx context.Context) error { return nil }, lost.fn)
	k.Close()
	select {
	case err := <-lost.ch:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("lost with %v, want ErrClosed", err)
		}
	default:
		t.Fatal("Close returned without reporting the held lease")
	}
	late := newLost()
	k.Add(time.Now(), time.Hour, nil, late.fn)
	if err := <-late.ch; !errors.Is(err, ErrClosed) {
		t.Fatalf("Add after Close: %v, want ErrClosed", err)
	}
}

// TestManyLeasesFewGoroutines: the keeper does not cost a goroutine per
// lease.
func TestManyLeasesFewGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	k := NewKeeper()
	defer k.Close()
	leases := make([]*Lease, 5000)
	for i := range leases {
		leases[i] = k.Add(time.Now(), time.Hour, func(ctx context.Context) error { return nil }, func(error) {})
	}
	if n := runtime.NumGoroutine() - before; n > 3 {
		t.Errorf("5000 leases cost %d goroutines, want 1", n)
	}
	for _, l := range leases {
		l.Stop()
	}
}
