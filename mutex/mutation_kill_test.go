package mutex_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// Tests written against mutants that escaped every other test (issue 32;
// internal/harness/mutation lists them). Each says which mutant it kills.

// TestRWLastRUnlockWakesWriter: the release of the last live reader
// publishes the writers' wake-up when a writer waits, and that writer then
// gets the lock; an RUnlock that leaves another reader in publishes
// nothing. A waiting writer also retries every third of its mark, so
// without the wake-up it still got in after up to 0.7 s and no test saw
// the difference: an outside mutant that dropped rwmutex_runlock's
// PUBLISH escaped. The count of PUBLISH calls on a server of the test's
// own is what a missing wake-up changes, whatever the machine's speed.
func TestRWLastRUnlockWakesWriter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*signal)
	defer cancel()
	srv := redistest.NewServer(t)
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{Lease: time.Minute})
	name := "rwwake:" + t.Name()
	newRW := func() *mutex.RWMutex {
		rw, err := l.NewRWMutex(name)
		if err != nil {
			t.Fatal(err)
		}
		return rw
	}
	r1, r2, w := newRW(), newRW(), newRW()
	for _, r := range []*mutex.RWMutex{r1, r2} {
		if err := r.RLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- w.Lock(ctx) }()
	if !redistest.WaitFor(ctx, signal, func() bool {
		in, err := r1.Info(ctx)
		return err == nil && in.WriterWaiting > 0
	}) {
		t.Fatal("the writer's Lock left no writer-waiting mark")
	}
	published := func() int64 {
		c := commandCalls(t, srv)
		return c["publish"] + c["spublish"]
	}
	before := published()
	if err := r1.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := published() - before; got != 0 {
		t.Errorf("an RUnlock that left a reader in published %d wake-ups, want 0", got)
	}
	if err := r2.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := published() - before; got != 1 {
		t.Errorf("the last reader's RUnlock, with a writer waiting, published %d wake-ups, want 1", got)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiting writer's Lock = %v, want the lock", err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
