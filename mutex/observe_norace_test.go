//go:build !race

package mutex_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// TestNoObserverAllocs: without an observer, Lock and Unlock allocate no
// more than before observers existed: 5 allocations a pair with a
// background context, as BenchmarkLockUnlock showed before. (Not under
// -race, which allocates on its own.)
func TestNoObserverAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("measures allocations of real calls")
	}
	l := newLocker(t, redistest.Client(t, redistest.Single(t).Addr()), mutex.Options{})
	m := newMutex(t, l, "observe:"+t.Name())
	deadline, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{
		{"background", context.Background()},
		// A cancellable context costs nothing more per pair: the
		// deadline is hidden from the shared connection without an
		// allocation. (Making the context is the caller's: 4 more with
		// context.WithTimeout.)
		{"deadline", deadline},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			// AllocsPerRun counts the whole process's allocations, other
			// goroutines' too (the client's, the watchdog's, earlier
			// tests' stragglers), which can only add: the fewest of
			// several runs is the pair's own.
			allocs := redistest.FewestAllocs(func() {
				if err = m.Lock(tc.ctx); err == nil {
					err = m.Unlock(tc.ctx)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			if allocs > 5 {
				t.Errorf("Lock+Unlock without an observer: %v allocations, want at most 5", allocs)
			}
		})
	}
}
