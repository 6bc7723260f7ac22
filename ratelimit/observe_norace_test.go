//go:build !race

package ratelimit

import (
	"context"
	"testing"

	"github.com/sluicekit/sluice/internal/redistest"
)

// TestNoObserverAllocs: without an observer, Allow allocates no more than
// before observers existed: 2 allocations a call, as BenchmarkAllow shows. (Not under -race, which allocates on its own.)
func TestNoObserverAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("measures allocations of real calls")
	}
	ctx := context.Background()
	l := newLimiter(t, newCache(t, redistest.Single(t).Addr()), Options{Limit: PerSecond(maxRate), DisableDenyCache: true})
	var err error
	// AllocsPerRun counts the whole process's allocations, other
	// goroutines' too (the client's, earlier tests' stragglers), which can
	// only add: the fewest of several runs is Allow's own.
	allocs := redistest.FewestAllocs(func() {
		_, err = l.Allow(ctx, "k")
	})
	if err != nil {
		t.Fatal(err)
	}
	if allocs > 2 {
		t.Errorf("Allow without an observer: %v allocations, want at most 2", allocs)
	}
}
