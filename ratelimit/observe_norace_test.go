//go:build !race

package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestNoObserverAllocs: without an observer, Allow allocates no more than
// before observers existed: 2 allocations a call, as BenchmarkAllow shows. (Not under -race, which allocates on its own.)
func TestNoObserverAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("measures allocations of real calls")
	}
	l := newLimiter(t, newCache(t, redistest.Single(t).Addr()), Options{Limit: PerSecond(maxRate), DisableDenyCache: true})
	deadline, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{
		{"background", context.Background()},
		// A call alone in flight with a deadline takes the dedicated
		// connection path of scriptcache: no more allocations either.
		{"deadline", deadline},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			// AllocsPerRun counts the whole process's allocations, other
			// goroutines' too (the client's, earlier tests' stragglers),
			// which can only add: the fewest of several runs is Allow's own.
			allocs := redistest.FewestAllocs(func() {
				_, err = l.Allow(tc.ctx, "k")
			})
			if err != nil {
				t.Fatal(err)
			}
			if allocs > 2 {
				t.Errorf("Allow without an observer: %v allocations, want at most 2", allocs)
			}
		})
	}
}
