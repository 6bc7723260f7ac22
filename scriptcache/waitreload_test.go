package scriptcache_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestExecWaitNoScriptStorm: concurrent NOSCRIPT replies to ExecWait load
// the script once, as they do for Exec (issue 22, item 9). The calls are
// queued on a paused server whose script cache was flushed, so that all
// of them get NOSCRIPT; before the fix each reloaded on its own: one
// SCRIPT LOAD and one reload event per caller.
func TestExecWaitNoScriptStorm(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	var reloads atomic.Int64
	obs := scriptcache.ObserverFunc(func(e scriptcache.Event) {
		if e.Kind == scriptcache.EventScriptReload {
			reloads.Add(1)
		}
	})
	sc, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()), scriptcache.WithFS(testFS), scriptcache.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sc.Script("incr")
	const callers = 32
	run := func() []error {
		var wg sync.WaitGroup
		errs := make([]error, callers)
		for i := range callers {
			wg.Go(func() {
				_, _, errs[i] = s.ExecWait(ctx, []string{"waitstorm"}, nil, 0, time.Millisecond)
			})
		}
		wg.Wait()
		return errs
	}
	// Warm: one dedicated connection per caller, so that on the paused
	// server no call waits for a handshake, only for its reply.
	for _, err := range run() {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.FlushScripts(); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	reloads.Store(0)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resume := srv.Resumer(t)
	done := make(chan []error, 1)
	go func() { done <- run() }()
	// Resume once every call is in the client, sent or about to be.
	const frame = "scriptcache.rueidisClient.EvalWait"
	if !redistest.WaitFor(ctx, 10*time.Second, func() bool { return len(redistest.GoroutinesIn(frame)) >= callers }) {
		t.Errorf("only %d of %d calls reached EvalWait", len(redistest.GoroutinesIn(frame)), callers)
	}
	resume()
	for i, err := range <-done {
		if err != nil {
			t.Errorf("caller %d: %v", i, err)
		}
	}
	loads, evals := commandCalls(t, srv, "script|load"), commandCalls(t, srv, "eval")
	if n := reloads.Load(); n != 1 || loads != 1 {
		t.Errorf("%d reload events, %d SCRIPT LOAD (and %d EVAL) for %d concurrent NOSCRIPTs of ExecWait, want one", n, loads, evals, callers)
	}
}
