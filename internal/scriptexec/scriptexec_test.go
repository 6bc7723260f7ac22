package scriptexec_test

import (
	"context"
	"errors"
	"testing"
	"testing/fstest"
	"time"

	"github.com/sluicekit/sluice/internal/scriptexec"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// testFS holds the script the tests run: incr, whose reply shows that it ran.
var testFS = fstest.MapFS{
	"incr.lua": {Data: []byte("-- incr: INCR KEYS[1]\nreturn redis.call('INCR', KEYS[1])\n")},
}

// pausedIncr returns the script "incr" of testFS, loaded on a server of
// its own that is then paused (SIGSTOP): calls hang until srv.Resume.
func pausedIncr(t *testing.T) (*redistest.Server, *scriptcache.Script) {
	t.Helper()
	return pausedIncrAfter(t, nil)
}

// pausedIncrAfter is pausedIncr, with warm run on the script before the
// pause (nil: nothing).
func pausedIncrAfter(t *testing.T, warm func(*scriptcache.Script)) (*redistest.Server, *scriptcache.Script) {
	t.Helper()
	srv := redistest.NewServer(t)
	sc, err := scriptcache.New(context.Background(), redistest.Client(t, srv.Addr()), scriptcache.WithFS(testFS))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sc.Script("incr")
	if warm != nil {
		warm(s)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	return srv, s
}

// TestExecOrLate: a caller that gives up gets ctx.Err() at once, and the
// reply, when it comes, goes to late.
func TestExecOrLate(t *testing.T) {
	ctx := context.Background()
	srv, s := pausedIncr(t)
	late := make(chan int64, 1)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	var g *scriptexec.Group // nil: a Group never closed
	err := g.ExecOrLate(short, s, []string{"late"}, nil, func(r scriptcache.Reply) {
		n, _ := r.AsInt64()
		late <- n
	}).Error()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ExecOrLate on a paused server = %v, want DeadlineExceeded", err)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-late:
		if n != 1 {
			t.Fatalf("late reply = %d, want 1", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("late was not called with the reply")
	}
}

// TestGroupCloseEndsLeftCalls: a Group's Close gives up the calls their
// callers left (late gets the error, not a reply), waits for their
// goroutines even while the server hangs, and afterwards ExecOrLate is a
// plain Exec that never calls late.
func TestGroupCloseEndsLeftCalls(t *testing.T) {
	ctx := context.Background()
	srv, s := pausedIncr(t)
	resume := srv.Resumer(t)
	g := scriptexec.NewGroup(nil)
	late := make(chan scriptcache.Reply, 1)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	err := g.ExecOrLate(short, s, []string{"group"}, nil, func(r scriptcache.Reply) { late <- r }).Error()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ExecOrLate on a paused server = %v, want DeadlineExceeded", err)
	}
	closed := make(chan struct{})
	go func() {
		g.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Group.Close did not end a left call on a hung server")
	}
	select {
	case r := <-late:
		if r.Error() == nil || r.ServerError() {
			t.Fatalf("late got %v (server error %v), want the error of a call given up", r.Error(), r.ServerError())
		}
	default:
		t.Fatal("Close returned before late ran")
	}
	if !g.Closed() {
		t.Fatal("Closed() = false after Close")
	}
	resume()
	n, err := g.ExecOrLate(ctx, s, []string{"group"}, nil, func(scriptcache.Reply) { t.Error("late called after Close") }).AsInt64()
	if err != nil || n < 1 {
		t.Fatalf("ExecOrLate after Close = %d, %v; want the reply", n, err)
	}
}

// TestExecWaitReturnsWithContext: a WAIT on a server that stopped answering
// returns when the caller's context ends, not when the server wakes, and
// the reply still reaches late (issue 10, item 6).
func TestExecWaitReturnsWithContext(t *testing.T) {
	ctx := context.Background()
	srv, s := pausedIncr(t)
	late := make(chan int64, 1)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	var g *scriptexec.Group // nil: a Group never closed
	_, _, err := g.ExecWaitOrLate(short, s, []string{"wait"}, nil, 0, 100*time.Millisecond, func(r scriptcache.Reply, _ int64, _ error) {
		n, _ := r.AsInt64()
		late <- n
	})
	// The server stays paused until the call has returned, so the call
	// cannot have waited for it; endBound, far below the call's own bound
	// (WAIT's timeout plus 5 s of slack), tells the
	// caller's deadline from the call's own.
	if elapsed := time.Since(start); elapsed > endBound {
		t.Fatalf("ExecWaitOrLate returned after %v, want soon after the 50 ms context", elapsed)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ExecWaitOrLate on a paused server = %v, want DeadlineExceeded", err)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-late:
		if n != 1 {
			t.Fatalf("late reply = %d, want 1", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("late was not called with the reply")
	}
}
