//go:build !race

package mutex_test

import (
	"context"
	"testing"

	"github.com/sluicekit/sluice/internal/redistest"
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
	ctx := context.Background()
	l := newLocker(t, redistest.Client(t, redistest.Single(t).Addr()), mutex.Options{})
	m := newMutex(t, l, "observe:"+t.Name())
	var err error
	allocs := testing.AllocsPerRun(200, func() {
		if err = m.Lock(ctx); err == nil {
			err = m.Unlock(ctx)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if allocs > 5 {
		t.Errorf("Lock+Unlock without an observer: %v allocations, want at most 5", allocs)
	}
}
