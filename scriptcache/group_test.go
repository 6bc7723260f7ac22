package scriptcache_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// endBound is how long a call that must end with its context (or a Group
// whose Close must give up left calls) may take on a loaded 2-core machine
// with -race. The code under test, when wrong, takes the WAIT timeout plus
// scriptcache.WaitSlack (25 s here), far above it.
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
// WaitSlack). A Locker or Manager with ReplicaAcks calls Group.Close from
// its Close.
func TestGroupCloseEndsLeftExecWait(t *testing.T) {
	ctx := context.Background()
	srv, s := pausedWarmIncr(t)
	resume := srv.Resumer(t)
	defer resume()

	g := scriptcache.NewGroup()
	type lateReply struct {
		r   scriptcache.Reply
		err error
	}
	late := make(chan lateReply, 1)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, _, err := s.ExecWaitOrLate(short, g, []string{"groupwait"}, nil, 0, longWaitTimeout,
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

// TestExecWaitClosedGroupHonoursContext: once a Group is closed,
// ExecOrLate is a plain Exec that returns when its context ends. Its twin
// ExecWaitOrLate must too ("It returns when ctx ends, like Exec"): a Lock
// with ReplicaAcks racing with Locker.Close gets here. On a server that
// stopped answering it must return about when ctx ends, not after the WAIT
// timeout plus WaitSlack.
func TestExecWaitClosedGroupHonoursContext(t *testing.T) {
	ctx := context.Background()
	srv, s := pausedWarmIncr(t)
	resume := srv.Resumer(t)
	defer resume()

	g := scriptcache.NewGroup()
	g.Close()

	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	type result struct {
		err     error
		elapsed time.Duration
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		_, _, err := s.ExecWaitOrLate(short, g, []string{"closedwait"}, nil, 0, longWaitTimeout,
			func(scriptcache.Reply, int64, error) { t.Error("late called on a closed Group") })
		done <- result{err, time.Since(start)}
	}()
	var res result
	select {
	case res = <-done:
	case <-time.After(endBound):
		t.Errorf("ExecWaitOrLate on a closed Group still running %v after its 100 ms context ended (server hung)", endBound)
		resume()
		res = <-done
		t.Logf("it returned %v after it was called, once the server was resumed, with err %v", res.elapsed, res.err)
		return
	}
	if !errors.Is(res.err, context.DeadlineExceeded) {
		t.Errorf("ExecWaitOrLate on a closed Group, paused server = %v, want DeadlineExceeded", res.err)
	}
}
