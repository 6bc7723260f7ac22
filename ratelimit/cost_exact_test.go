package ratelimit

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestMixedCostsExact races goroutines sending costs 3 and 6
// at one key, with the deny cache on, then drains the key with cost 1.
// The capacities are not multiples of 3, so the race always ends with a
// denial of a cost larger than what is left, and units left over. The
// costs allowed must add up to the capacity exactly: more is a limit
// broken; less means a denial of a large cost was cached and answered for
// a smaller one that Redis would have let through. TestConcurrentExact and
// TestAllowPoliciesConcurrentExact send cost 1 only, and the latter with
// the deny cache off.
func TestMixedCostsExact(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	ctx := context.Background()
	// Per hour: the GCRA bucket earns one token back in 72s, far longer
	// than the test, and the fixed window starts with the first call.
	for _, algo := range []Algorithm{GCRA, FixedWindow} {
		t.Run(algo.String(), func(t *testing.T) {
			l := newLimiter(t, sc, Options{Algorithm: algo, Limit: PerHour(50)})
			var spent atomic.Int64
			var wg sync.WaitGroup
			for g := range 16 {
				rng := rand.New(rand.NewPCG(uint64(g), 7))
				wg.Go(func() {
					for range 30 {
						n := 3 * (1 + rng.IntN(2))
						res, err := l.AllowN(ctx, "k", n)
						if err != nil {
							t.Error(err)
							return
						}
						if res.Allowed {
							spent.Add(int64(n))
						}
					}
				})
			}
			wg.Wait()
			for range 60 {
				res := allow(t, l, "k", 1)
				if !res.Allowed {
					break
				}
				spent.Add(1)
			}
			if got := spent.Load(); got != 50 {
				t.Fatalf("costs allowed add up to %d; want exactly the capacity, 50", got)
			}
		})
	}
	t.Run("policies", func(t *testing.T) {
		l := newLimiter(t, sc, Options{Limit: PerSecond(1)})
		ps, err := NewPolicies(
			Policy{Name: "bucket", Limit: PerHour(50)},
			Policy{Name: "window", Algorithm: FixedWindow, Limit: PerHour(40)},
		)
		if err != nil {
			t.Fatal(err)
		}
		var spent atomic.Int64
		var wg sync.WaitGroup
		for g := range 16 {
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			wg.Go(func() {
				for range 30 {
					n := 3 * (1 + rng.IntN(2))
					d, err := l.AllowPolicies(ctx, "k", n, ps)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						spent.Add(int64(n))
					}
				}
			})
		}
		wg.Wait()
		for range 60 {
			d, err := l.AllowPolicies(ctx, "k", 1, ps)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed {
				break
			}
			spent.Add(1)
		}
		if got := spent.Load(); got != 40 {
			t.Fatalf("costs allowed add up to %d; want exactly the smaller capacity, 40", got)
		}
		d, err := l.AllowPolicies(ctx, "k", 0, ps)
		if err != nil {
			t.Fatal(err)
		}
		// Both policies were charged the same 40, nothing for denials.
		if d.Results[0].Remaining != 10 || d.Results[1].Remaining != 0 {
			t.Fatalf("after the race: %+v; want 10 and 0 remaining", d.Results)
		}
	})
}
