package ratelimit

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// evalshaCalls reads how many EVALSHA commands srv has run since the last
// CONFIG RESETSTAT.
func evalshaCalls(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	info, err := srv.Do("INFO", "commandstats")
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

func resetStats(t *testing.T, srv *redistest.Server) {
	t.Helper()
	if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatalf("CONFIG RESETSTAT: %v", err)
	}
}

// TestDenyCacheSavesRoundTrips floods one key after it is denied and counts
// the scripts Redis ran: with the deny cache none, without it one per call.
func TestDenyCacheSavesRoundTrips(t *testing.T) {
	srv := redistest.NewServer(t)
	sc := newCache(t, srv.Addr())
	for _, algo := range algorithms {
		for _, disable := range []bool{false, true} {
			t.Run(algo.String()+"/disabled="+strconv.FormatBool(disable), func(t *testing.T) {
				l := newLimiter(t, sc, Options{Algorithm: algo, Limit: PerMinute(5), DisableDenyCache: disable})
				resetStats(t, srv)
				for i := range 5 {
					if res := allow(t, l, "flood", 1); !res.Allowed {
						t.Fatalf("call %d: got %+v; want allowed", i+1, res)
					}
				}
				first := allow(t, l, "flood", 1)
				if first.Allowed {
					t.Fatalf("call 6: got %+v; want denied", first)
				}
				for i := range 1000 {
					res := allow(t, l, "flood", 1)
					if res.Allowed || res.Remaining != 0 || res.Limit != 5 {
						t.Fatalf("flood call %d: got %+v; want denied, limit 5, 0 remaining", i, res)
					}
					if res.RetryAfter <= 0 || res.RetryAfter > first.RetryAfter || res.ResetAfter < res.RetryAfter {
						t.Fatalf("flood call %d: got %+v; want 0 < RetryAfter <= %v <= ResetAfter", i, res, first.RetryAfter)
					}
				}
				want := 6
				if disable {
					want = 1006
				}
				if got := evalshaCalls(t, srv); got != want {
					t.Fatalf("EVALSHA calls %d; want %d", got, want)
				}
				// Reset clears the local entry too.
				if err := l.Reset(context.Background(), "flood"); err != nil {
					t.Fatal(err)
				}
				if res := allow(t, l, "flood", 1); !res.Allowed {
					t.Fatalf("after Reset: got %+v; want allowed", res)
				}
			})
		}
	}
}

// TestDenyCacheExpires checks that the local denial ends when Redis's does:
// the first call after RetryAfter goes to Redis and is allowed.
func TestDenyCacheExpires(t *testing.T) {
	srv := redistest.NewServer(t)
	sc := newCache(t, srv.Addr())
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			l := newLimiter(t, sc, Options{Algorithm: algo, Limit: Limit{Rate: 2, Period: time.Second}})
			allow(t, l, "k", 1)
			allow(t, l, "k", 1)
			denied := allow(t, l, "k", 1)
			if denied.Allowed {
				t.Fatalf("call 3: got %+v; want denied", denied)
			}
			resetStats(t, srv)
			if res := allow(t, l, "k", 1); res.Allowed {
				t.Fatalf("call 4: got %+v; want denied", res)
			}
			if got := evalshaCalls(t, srv); got != 0 {
				t.Fatalf("call 4 ran %d scripts; want 0 (answered locally)", got)
			}
			// PTTL, the fixed window's RetryAfter, is whole milliseconds
			// rounded down: the window may end up to 1ms later.
			time.Sleep(denied.RetryAfter + 2*time.Millisecond)
			if res := allow(t, l, "k", 1); !res.Allowed {
				t.Fatalf("call after RetryAfter: got %+v; want allowed", res)
			}
			if got := evalshaCalls(t, srv); got != 1 {
				t.Fatalf("call after RetryAfter ran %d scripts; want 1", got)
			}
			if n := l.deny.len(); n != 0 {
				t.Fatalf("deny cache holds %d entries after expiry; want 0", n)
			}
		})
	}
}

func TestDenyCacheBounded(t *testing.T) {
	now := time.Now()
	live := Result{RetryAfter: time.Hour, ResetAfter: time.Hour}
	// The bound both ways: a cache of 8 keeps 8 live entries, and the 9th
	// makes it shrink to three quarters, no further.
	c := newDenyCache(8)
	for i := range 8 {
		c.add("k"+strconv.Itoa(i), now, live, 0)
	}
	if n := c.len(); n != 8 {
		t.Fatalf("8 live entries in a cache of 8: %d kept; want all 8", n)
	}
	c.add("k8", now, live, 0)
	if n := c.len(); n != 6 {
		t.Fatalf("a 9th live entry in a cache of 8: %d kept; want 6", n)
	}
	c = newDenyCache(8)
	for i := range 100 {
		c.add("k"+strconv.Itoa(i), now, live, 0)
		if n := c.len(); n > 8 {
			t.Fatalf("after %d adds the cache holds %d entries; want at most 8", i+1, n)
		}
	}
	// Expired entries go first.
	c = newDenyCache(8)
	for i := range 8 {
		c.add("old"+strconv.Itoa(i), now.Add(-time.Hour), Result{RetryAfter: time.Minute}, 0)
	}
	c.add("live", now, live, 0)
	if n := c.len(); n != 1 {
		t.Fatalf("after overflow the cache holds %d entries; want 1 (the expired ones dropped)", n)
	}
	if _, ok := c.lookup("live", now, 5); !ok {
		t.Fatal("the live entry was dropped; want it kept")
	}
	// Re-adding a key does not count twice; lookups of expired keys remove
	// them.
	c.add("live", now, live, 0)
	if n := c.len(); n != 1 {
		t.Fatalf("re-add: %d entries; want 1", n)
	}
	if _, ok := c.lookup("live", now.Add(2*time.Hour), 5); ok {
		t.Fatal("lookup after expiry denied; want no answer")
	}
	if n := c.len(); n != 0 {
		t.Fatalf("after an expired lookup: %d entries; want 0", n)
	}
	c.remove("absent", "")
	if n := c.len(); n != 0 {
		t.Fatalf("after removing an absent key: %d entries; want 0", n)
	}
}

func TestDenyCacheLookupResult(t *testing.T) {
	now := time.Now()
	c := newDenyCache(8)
	c.add("k", now, Result{RetryAfter: 3 * time.Second, ResetAfter: 10 * time.Second}, 0)
	res, ok := c.lookup("k", now.Add(time.Second), 7)
	want := Result{Allowed: false, Limit: 7, Remaining: 0, RetryAfter: 2 * time.Second, ResetAfter: 9 * time.Second}
	if !ok || res != want {
		t.Fatalf("lookup = %+v, %v; want %+v, true", res, ok, want)
	}
	if _, ok := c.lookup("k", now.Add(3*time.Second), 7); ok {
		t.Fatal("lookup at the deadline denied; want no answer (Redis may allow then)")
	}
}

// TestResetDuringDenial resets a key while a denial of it is in flight:
// Redis has denied the request, the reply has not been cached yet, and Reset
// runs in between. The late reply must not make the process deny the key it
// has just reset. The afterReply hook holds the reply at that point, so the
// interleaving is the same on every run.
func TestResetDuringDenial(t *testing.T) {
	sc := newCache(t, redistest.NewServer(t).Addr())
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			l := newLimiter(t, sc, Options{Algorithm: algo, Limit: PerHour(1)})
			if res := allow(t, l, "k", 1); !res.Allowed {
				t.Fatalf("call 1: got %+v; want allowed", res)
			}
			resets := 0
			l.afterReply = func(key string, res Result) {
				if !res.Allowed && resets == 0 {
					resets++
					if err := l.Reset(context.Background(), key); err != nil {
						t.Errorf("Reset: %v", err)
					}
				}
			}
			if res := allow(t, l, "k", 1); res.Allowed {
				t.Fatalf("call 2: got %+v; want denied (Redis decided before the Reset)", res)
			}
			if resets != 1 {
				t.Fatalf("Reset ran %d times in the hook; want 1", resets)
			}
			l.afterReply = nil
			if res := allow(t, l, "k", 1); !res.Allowed {
				t.Fatalf("call 3, after the Reset: got %+v; want allowed (the in-flight denial was cached after the Reset)", res)
			}
		})
	}
}

// TestDenyCacheGeneration checks the rule the Reset fix rests on: a denial
// read under an older generation of its shard is not added, and one read
// after the removal is.
func TestDenyCacheGeneration(t *testing.T) {
	now := time.Now()
	live := Result{RetryAfter: time.Hour, ResetAfter: time.Hour}
	c := newDenyCache(8)
	gen := c.generation("k")
	c.remove("k", "")
	c.add("k", now, live, gen)
	if _, ok := c.lookup("k", now, 5); ok {
		t.Fatal("denial sent before the removal was cached; want it dropped")
	}
	c.add("k", now, live, c.generation("k"))
	if _, ok := c.lookup("k", now, 5); !ok {
		t.Fatal("denial sent after the removal was not cached; want it cached")
	}
}

// TestDenyCacheCostFigures checks that a request of cost n answered from
// the deny cache carries the figures of cost n, as Redis would give them
// (Result.RetryAfter: "a request of the same cost"), not those of the cost
// 1 denial the cache holds: a Limiter with the cache and one without it,
// on the same keys, must agree. A Policies set's per-policy room too.
func TestDenyCacheCostFigures(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	ctx := context.Background()
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			lim := Limit{Rate: 10, Period: time.Second, Burst: 4}
			if algo != GCRA {
				lim = Limit{Rate: 4, Period: time.Minute}
			}
			prefix := testPrefix(t)
			cached := newLimiter(t, sc, Options{Algorithm: algo, Limit: lim, Prefix: prefix})
			direct := newLimiter(t, sc, Options{Algorithm: algo, Limit: lim, Prefix: prefix, DisableDenyCache: true})
			for range 4 {
				allow(t, cached, "k", 1)
			}
			if res := allow(t, cached, "k", 1); res.Allowed {
				t.Fatalf("fifth call allowed: %+v", res)
			}
			got := allow(t, cached, "k", 3) // from the cache (or Redis, for the sliding window)
			want := allow(t, direct, "k", 3)
			if got.Allowed || want.Allowed {
				t.Fatalf("cost 3 allowed: cached %+v, Redis %+v", got, want)
			}
			// want was computed after got, so it may be a little shorter.
			if got.RetryAfter < want.RetryAfter-20*time.Millisecond || got.RetryAfter > want.RetryAfter+time.Second {
				t.Fatalf("cost 3: RetryAfter %v from the deny cache, Redis says %v", got.RetryAfter, want.RetryAfter)
			}
		})
	}
	t.Run("policies", func(t *testing.T) {
		prefix := testPrefix(t)
		ps, err := NewPolicies(
			Policy{Name: "tight", Algorithm: FixedWindow, Limit: Limit{Rate: 2, Period: time.Minute}},
			Policy{Name: "loose", Algorithm: GCRA, Limit: Limit{Rate: 3, Period: time.Minute}},
		)
		if err != nil {
			t.Fatal(err)
		}
		cached := newLimiter(t, sc, Options{Limit: PerMinute(1), Prefix: prefix})
		direct := newLimiter(t, sc, Options{Limit: PerMinute(1), Prefix: prefix, DisableDenyCache: true})
		for range 2 {
			if _, err := cached.AllowPolicies(ctx, "k", 1, ps); err != nil {
				t.Fatal(err)
			}
		}
		if d, err := cached.AllowPolicies(ctx, "k", 1, ps); err != nil || d.Allowed {
			t.Fatalf("third call: %+v, %v; want denied by tight", d, err)
		}
		// loose has 1 left: room for cost 1, none for cost 2.
		got, err := cached.AllowPolicies(ctx, "k", 2, ps)
		if err != nil {
			t.Fatal(err)
		}
		want, err := direct.AllowPolicies(ctx, "k", 2, ps)
		if err != nil {
			t.Fatal(err)
		}
		if got.Results[1].Allowed != want.Results[1].Allowed || got.Results[1].Allowed {
			t.Fatalf("cost 2: loose policy had room %v from the deny cache, Redis says %v (1 left)", got.Results[1].Allowed, want.Results[1].Allowed)
		}
	})
}
