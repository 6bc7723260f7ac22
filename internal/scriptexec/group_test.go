package scriptexec_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/scriptexec"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// endBound is how long a call that must end with its context (or a Group
// whose Close must give up left calls) may take on a loaded 2-core machine
// with -race. The code under test, when wrong, takes the WAIT timeout plus
// its slack of 5 s (25 s here), far above it.
const endBound = 3 * time.Second

// longWaitTimeout is the WAIT timeout the tests pass: long, so that a call
// bounded by it rather than by its context or by Group.Close is told apart
// from one that ends in time.
const longWaitTimeout = 20 * time.Second

// pausedWarmIncr is pausedIncr with rueidis's pool of dedicated
// connections warmed first by one ExecWait: a call on the paused server
// then waits for no new connection (whose handshake is bounded by the
// dial timeout, the documented exception), only for its reply.
func pausedWarmIncr(t *testing.T) (*redistest.Server, *scriptcache.Script) {
	t.Helper()
	return pausedIncrAfter(t, func(s *scriptcache.Script) {
		warm, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, _, err := s.ExecWait(warm, []string{"warm"}, nil, 0, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	})
}

// TestGroupCloseEndsLeftExecWait is the ExecWaitOrLate twin of
// TestGroupCloseEndsLeftCalls: Group.Close must give up a call of
// ExecWaitOrLate whose caller left ("g.Close waits for it, and gives up the
// call if its caller has left (late then gets the error)"), even while the
// server hangs, instead of waiting for the call's own bound (WAIT timeout +
// 5 s of slack). A Locker or Manager with ReplicaAcks calls Group.Close from
// its Close.
func TestGroupCloseEndsLeftExecWait(t *testing.T) {
	ctx := context.Background()
	srv, s := pausedWarmIncr(t)
	resume := srv.Resumer(t)
	defer resume()

	g := scriptexec.NewGroup(nil)
	type lateReply struct {
		r   scriptcache.Reply
		err error
	}
	late := make(chan lateReply, 1)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, _, err := g.ExecWaitOrLate(short, s, []string{"groupwait"}, nil, 0, longWaitTimeout,
		func(r scriptcache.Reply, _ int64, err error) { late <- lateReply{r, err} })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ExecWaitOrLate on a paused server = %v, want DeadlineExceeded", err)
	}

	closed := make(chan struct{})
	start := time.Now()
	go func() {
		g.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(endBound):
		t.Errorf("Group.Close still waiting %v after it was called: it did not give up the left ExecWaitOrLate call on a hung server", endBound)
		resume() // let the call end so that Close returns
		<-closed
		t.Logf("Group.Close returned %v after it was called, once the server was resumed", time.Since(start))
	}
	select {
	case lr := <-late:
		if !t.Failed() && (lr.r.Error() == nil || lr.r.ServerError()) {
			t.Errorf("late got %v (server error %v), want the error of a call given up", lr.r.Error(), lr.r.ServerError())
		}
	default:
		t.Error("Close returned before late ran")
	}
}

// TestClosedGroupRefuses: once a Group is closed, ExecOrLate and
// ExecWaitOrLate with a context that can end send nothing and return the
// Group's closed error at once: a Lock or Acquire racing with Close gets
// here, and must return ErrClosed rather than wait for a server that
// stopped answering (before issue 22, item 10, they ran the call until ctx
// ended, or, for ExecWaitOrLate before that, the WAIT timeout plus
// 5 s of slack). late is never called.
func TestClosedGroupRefuses(t *testing.T) {
	ctx := context.Background()
	srv, s := pausedWarmIncr(t)
	resume := srv.Resumer(t)
	defer resume()

	g := scriptexec.NewGroup(nil)
	g.Close()

	short, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	type result struct {
		err     error
		elapsed time.Duration
	}
	done := make(chan result, 2)
	start := time.Now()
	go func() {
		_, _, err := g.ExecWaitOrLate(short, s, []string{"closedwait"}, nil, 0, longWaitTimeout,
			func(scriptcache.Reply, int64, error) { t.Error("late called on a closed Group") })
		done <- result{err, time.Since(start)}
	}()
	go func() {
		err := g.ExecOrLate(short, s, []string{"closedwait"}, nil,
			func(scriptcache.Reply) { t.Error("late called on a closed Group") }).Error()
		done <- result{err, time.Since(start)}
	}()
	for range 2 {
		var res result
		select {
		case res = <-done:
		case <-time.After(endBound):
			t.Errorf("a call on a closed Group still running %v after it was made (server hung)", endBound)
			resume()
			res = <-done
			t.Logf("it returned %v after it was called, once the server was resumed, with err %v", res.elapsed, res.err)
			continue
		}
		if !errors.Is(res.err, scriptexec.ErrClosed) {
			t.Errorf("call on a closed Group, paused server = %v, want ErrClosed", res.err)
		}
	}
}

// TestGroupCloseEndsAttendedCalls: Group.Close gives up the calls whose
// callers still wait, too: they return the error the Group was made with,
// at once, and Close does not wait for a
// server that stopped answering (issue 22, item 10). Before, Close waited
// until each such caller's context ended.
func TestGroupCloseEndsAttendedCalls(t *testing.T) {
	errMine := errors.New("primitive closed")
	for _, wait := range []bool{false, true} {
		name := "ExecOrLate"
		if wait {
			name = "ExecWaitOrLate"
		}
		t.Run(name, func(t *testing.T) {
			// Warmed for both calls: rueidis's pipelining connections as
			// well as a dedicated one, so that on the paused
			// server the call waits for its reply, not for a handshake
			// (bounded by the dial timeout, the documented exception).
			srv, s := pausedIncrAfter(t, func(s *scriptcache.Script) {
				warm, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if _, _, err := s.ExecWait(warm, []string{"attended"}, nil, 0, time.Millisecond); err != nil {
					t.Fatal(err)
				}
				// rueidis picks one of its pipelining connections at random
				// per call: enough calls open them all (with no deadline, or
				// a lone call takes a dedicated connection).
				for range 64 {
					if err := s.Exec(context.Background(), []string{"attended"}, nil).Error(); err != nil {
						t.Fatal(err)
					}
				}
			})
			resume := srv.Resumer(t)
			defer resume()
			g := scriptexec.NewGroup(errMine)
			ctx, cancel := context.WithCancel(context.Background()) // never cancelled before Close
			defer cancel()
			lateCalled := make(chan struct{})
			errc := make(chan error, 1)
			go func() {
				if wait {
					_, _, err := g.ExecWaitOrLate(ctx, s, []string{"attended"}, nil, 0, longWaitTimeout,
						func(scriptcache.Reply, int64, error) { close(lateCalled) })
					errc <- err
					return
				}
				errc <- g.ExecOrLate(ctx, s, []string{"attended"}, nil, func(scriptcache.Reply) { close(lateCalled) }).Error()
			}()
			frame := "scriptexec.(*Group)." + name + ".func" // the call, in g
			if !redistest.WaitFor(context.Background(), 10*time.Second, func() bool { return len(redistest.GoroutinesIn(frame)) > 0 }) {
				t.Fatalf("the call never reached %s", frame)
			}
			closed := make(chan struct{})
			go func() {
				g.Close()
				close(closed)
			}()
			select {
			case <-closed:
			case <-time.After(endBound):
				t.Errorf("Group.Close still waiting %v after it was called, with a call in flight on a hung server", endBound)
				cancel()
				<-closed
			}
			if err := <-errc; !errors.Is(err, errMine) {
				t.Errorf("%s in flight at Close = %v, want the Group's error", name, err)
			}
			select {
			case <-lateCalled:
			default:
				t.Error("Close returned before late got the call's end")
			}
		})
	}
}

// TestAfterClose checks the bound of a give-back sent after Close: the
// shorter of d and closeGrace, and never a deadline (see Bounded).
func TestAfterClose(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    time.Duration
	}{
		{"d shorter than the grace", 10 * time.Millisecond},
		{"the grace shorter than d", time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			ctx, cancel := scriptexec.AfterClose(tc.d)
			defer cancel()
			if _, ok := ctx.Deadline(); ok {
				t.Fatal("AfterClose's context has a deadline")
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Minute):
				t.Fatalf("AfterClose(%v) not ended after a minute", tc.d)
			}
			if el := time.Since(start); el < min(tc.d, time.Second) {
				t.Fatalf("AfterClose(%v) ended after %v, before %v", tc.d, el, min(tc.d, time.Second))
			}
		})
	}
	ctx, cancel := scriptexec.AfterClose(time.Hour)
	cancel()
	if ctx.Err() == nil {
		t.Fatal("cancel left AfterClose's context running")
	}
}
