package semaphore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// TestCloseWaitsForAbandonedCalls: Manager.Close stops and waits for every
// goroutine it started (README). An Acquire abandoned by its context while
// its script call is unanswered (a server that hangs) leaves a goroutine
// that waits for the late reply to release the grant. Close must end that
// call and wait for the goroutine; before the scriptexec.Group, it
// outlived Close and then called Redis for a closed Manager.
func TestCloseWaitsForAbandonedCalls(t *testing.T) {
	srv := redistest.NewServer(t)
	e := newEnv(t, []string{srv.Addr()}, semaphore.Options{})
	name := uniqueName(t)
	s := e.sem(t, name, 1)
	wantAvailable(t, s, 1) // the connection is up and the scripts loaded

	const frame = "sluice/internal/scriptexec.(*Group).ExecOrLate"
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resume := srv.Resumer(t)
	defer resume()

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := s.Acquire(ctx, 1)
	cancel()
	if !errors.Is(err, semaphore.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire on a hung server = %v, want ErrNotObtained wrapping DeadlineExceeded", err)
	}
	e.mgr.Close()
	left := redistest.GoroutinesIn(frame)

	// Let the late reply come, and the goroutine end, before judging, so
	// that the package's goleak check is not tripped by this test.
	resume()
	if !redistest.WaitFor(context.Background(), signalWait, func() bool { return len(redistest.GoroutinesIn(frame)) == 0 }) {
		t.Errorf("late-reply goroutine still running %v after the server resumed", signalWait)
	}
	if len(left) > 0 {
		t.Fatalf("%d goroutine(s) of an abandoned Acquire still running after Manager.Close returned:\n%s",
			len(left), strings.Join(left, "\n\n"))
	}
}

// TestCloseEndsAcquireInFlight: a server that stopped answering cannot
// hold Manager.Close up (README), and a waiting Acquire returns ErrClosed
// (Close's doc). An Acquire whose script call is in flight on a paused
// server, with a context that can be cancelled but never is, must see the
// close: before the fix Close waited for that caller's context to end, and
// the Acquire did not return ErrClosed (issue 22, item 10). With
// ReplicaAcks the call is the script+WAIT pair, whose own bound (the WAIT
// timeout plus 5 s of slack) is set far above closeBound here.
func TestCloseEndsAcquireInFlight(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  semaphore.Options
		frame string
	}{
		{"plain", semaphore.Options{}, "sluice/internal/scriptexec.(*Group).ExecOrLate"},
		{"replica-acks", semaphore.Options{ReplicaAcks: 1, ReplicaTimeout: time.Minute}, "sluice/internal/scriptexec.(*Group).ExecWaitOrLate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// closeBound is generous for a loaded 2-core machine under
			// -race; the old code waits for ever (the caller's context).
			const closeBound = 10 * time.Second
			srv := redistest.NewServer(t)
			e := newEnv(t, []string{srv.Addr()}, tc.opts)
			name := uniqueName(t)
			s := e.sem(t, name, 1)
			// The connections are up and the scripts loaded: rueidis picks
			// one of its pipelining connections at random per call, and
			// one not yet open would hold the call in its handshake
			// (bounded by the dial timeout) rather than on the server.
			for range 64 {
				wantAvailable(t, s, 1)
			}
			if tc.opts.ReplicaAcks > 0 {
				// Open the dedicated connection the script+WAIT pair runs
				// on (same client, short WAIT): on the paused server the
				// call then waits for its reply, not for a handshake.
				sc, err := scriptcache.New(context.Background(), e.client)
				if err != nil {
					t.Fatal(err)
				}
				wm, err := semaphore.NewManager(sc, semaphore.Options{ReplicaAcks: 1, ReplicaTimeout: time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				defer wm.Close()
				w, err := wm.NewSemaphore(name, 1)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := w.Acquire(context.Background(), 1); !errors.Is(err, semaphore.ErrNotReplicated) {
					t.Fatalf("warm-up Acquire = %v, want ErrNotReplicated (no replica)", err)
				}
			}
			if err := srv.Pause(); err != nil {
				t.Fatal(err)
			}
			resume := srv.Resumer(t)
			defer resume()

			ctx, cancel := context.WithCancel(context.Background()) // never cancelled before Close
			defer cancel()
			acquired := make(chan error, 1)
			go func() {
				p, err := s.Acquire(ctx, 1)
				if p != nil {
					err = errors.New("granted on a paused server")
				}
				acquired <- err
			}()
			if !redistest.WaitFor(context.Background(), signalWait, func() bool { return len(redistest.GoroutinesIn(tc.frame)) > 0 }) {
				t.Fatalf("the Acquire's call never reached %s", tc.frame)
			}
			closed := make(chan struct{})
			go func() {
				e.mgr.Close()
				close(closed)
			}()
			select {
			case <-closed:
			case <-time.After(closeBound):
				t.Errorf("Manager.Close still blocked %v after it was called, with an Acquire in flight on a paused server", closeBound)
				cancel() // the old code returns once the caller's context ends
				<-closed
			}
			select {
			case err := <-acquired:
				if !errors.Is(err, semaphore.ErrClosed) {
					t.Errorf("Acquire in flight at Close = %v, want ErrClosed", err)
				}
			case <-time.After(closeBound):
				cancel()
				t.Errorf("Acquire still in flight %v after Close returned; after its context ended: %v", closeBound, <-acquired)
			}
		})
	}
}
