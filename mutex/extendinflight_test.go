package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// TestExtendShorterInFlightBoundsHold: an Extend that shortens the lease
// bounds the hold from the moment it is sent, not from its reply. The
// server takes the shorter lease when the call arrives, and another owner
// gets the lock when it ends; with the reply still on its way (a slow
// network), the holder kept the old end until then, and was told of the
// loss only after the other owner's grant (the chaos harness, issue 32,
// seed 1795928535094390036: an Extend by 315 ms that took 356 ms to fail,
// another node's hold granted 39 ms before this one was told).
//
// Here each way takes a second: the server frees the lock 1.3 s after the
// call, and the reply comes 2 s after it. The holder must be told by the
// time the other owner's Lock returns, as the margin promises. Before
// the fix, Lost was still open then.
func TestExtendShorterInFlightBoundsHold(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	proxy := lateProxy(t, srv)
	slow := newLocker(t, redistest.Client(t, proxy.Addr()), mutex.Options{})
	m := newMutex(t, slow, "extend-inflight", mutex.WithLease(10*time.Second))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	other := newMutex(t, newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{}), "extend-inflight")
	waiting, granted := make(chan struct{}), make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(ctx, signal)
		defer cancel()
		if err := other.TryLock(lctx); !errors.Is(err, mutex.ErrNotObtained) {
			granted <- fmt.Errorf("TryLock under the hold: %w, want ErrNotObtained", err)
			return
		}
		close(waiting)
		granted <- other.Lock(lctx)
	}()
	select {
	case <-waiting:
	case err := <-granted:
		t.Fatal(err)
	}
	proxy.SetLatency(time.Second, 0)
	extended := make(chan error, 1)
	go func() {
		_, err := m.Extend(ctx, 300*time.Millisecond)
		extended <- err
	}()
	if err := <-granted; err != nil {
		t.Fatalf("the other owner's Lock once the shorter lease ended: %v", err)
	}
	select {
	case <-m.Lost():
	default:
		t.Errorf("the other owner got the lock while the holder, whose Extend to 300 ms was still in flight, had not been told of its loss (HeldUntil %v from now)", time.Until(m.HeldUntil()).Round(time.Millisecond))
	}
	<-extended
	proxy.SetLatency(0, 0)
	m.Unlock(ctx)
	other.Unlock(ctx)
}
