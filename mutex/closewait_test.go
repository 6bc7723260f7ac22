package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// TestCloseEndsLockInFlight: with ReplicaAcks, a Lock whose script+WAIT
// call is in flight on a server that stopped answering, with a context
// that can be cancelled but never is, must not hold Locker.Close up
// (README: a server that stopped answering cannot hold Close up), and
// must return ErrClosed (Close's doc: waiting Locks return ErrClosed).
// Before the fix Close waited for the caller's context to end (issue 22,
// item 10). The WAIT timeout of a minute keeps the call's own bound far
// above closeBound.
func TestCloseEndsLockInFlight(t *testing.T) {
	// closeBound is generous for a loaded 2-core machine under -race; the
	// old code waits for ever (the caller's context).
	const closeBound = 10 * time.Second
	srv := redistest.NewServer(t)
	client := redistest.Client(t, srv.Addr())
	// Open the dedicated connection the pair runs on (same client, short
	// WAIT): on the paused server the call then waits for its reply, not
	// for a handshake.
	warm := newMutex(t, newLocker(t, client, mutex.Options{ReplicaAcks: 1, ReplicaTimeout: time.Millisecond}), "close-in-flight")
	if err := warm.TryLock(context.Background()); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("warm-up TryLock = %v, want ErrNotReplicated (no replica)", err)
	}
	l := newLocker(t, client, mutex.Options{ReplicaAcks: 1, ReplicaTimeout: time.Minute})
	m := newMutex(t, l, "close-in-flight")
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resume := srv.Resumer(t)
	defer resume()

	ctx, cancel := context.WithCancel(context.Background()) // never cancelled before Close
	defer cancel()
	locked := make(chan error, 1)
	go func() { locked <- m.Lock(ctx) }()
	const frame = "sluice/internal/scriptexec.(*Group).ExecWaitOrLate"
	if !redistest.WaitFor(context.Background(), signal, func() bool { return len(redistest.GoroutinesIn(frame)) > 0 }) {
		t.Fatalf("the Lock's call never reached %s", frame)
	}
	closed := make(chan struct{})
	go func() {
		l.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(closeBound):
		t.Errorf("Locker.Close still blocked %v after it was called, with a Lock in flight on a paused server", closeBound)
		cancel() // the old code returns once the caller's context ends
		<-closed
	}
	select {
	case err := <-locked:
		if !errors.Is(err, mutex.ErrClosed) {
			t.Errorf("Lock in flight at Close = %v, want ErrClosed", err)
		}
	case <-time.After(closeBound):
		cancel()
		t.Errorf("Lock still in flight %v after Close returned; after its context ended: %v", closeBound, <-locked)
	}
}
