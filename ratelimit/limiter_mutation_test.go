package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// Tests of the single-limit scripts (ratelimit_fixed, ratelimit_gcra)
// written against the mutants of issue 32's run on the rate limiter
// (internal/harness/mutation/REPORT.md).

// TestPeekReadsOnly: AllowN with n == 0 only reads, for every algorithm: on
// a fresh key it reports the whole limit, no wait and no reset, and writes
// no key; on a full key it reports no room left but is itself allowed (a
// request of cost 0 always fits), and leaves the key full. Mutants that
// wrote a GCRA peek (an error on a fresh key: an expiry of 0) or denied a
// peek at a full fixed window survived every other test.
func TestPeekReadsOnly(t *testing.T) {
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			sc := newCache(t, redistest.Single(t).Addr())
			l := newLimiter(t, sc, Options{Algorithm: algo, Limit: PerMinute(2), DisableDenyCache: true})
			if res := allow(t, l, "k", 0); res != (Result{Allowed: true, Limit: 2, Remaining: 2}) {
				t.Fatalf("peek at a fresh key = %+v, want allowed with all 2 remaining and no reset", res)
			}
			if d := ttl(t, sc, l, "k"); d != -2*time.Millisecond {
				t.Fatalf("PTTL after a peek at a fresh key %v, want -2ms (no key)", d)
			}
			allow(t, l, "k", 2)
			res := allow(t, l, "k", 0)
			// A sliding window is back to 0 two windows after the current
			// one began.
			if !res.Allowed || res.Remaining != 0 || res.RetryAfter != 0 || res.ResetAfter <= 0 || res.ResetAfter > 2*time.Minute {
				t.Fatalf("peek at a full key = %+v, want allowed with 0 remaining, no wait, a reset to come", res)
			}
			if res := allow(t, l, "k", 1); res.Allowed {
				t.Fatalf("a request after the peek = %+v, want denied: the peek must leave the key full", res)
			}
		})
	}
}

// TestFixedWindowEndNeverMoves: a fixed window ends one Period after its
// first request, however many requests it denies, including one that
// arrives in the window's last millisecond (the counter's PTTL is 0 then):
// a denial's ResetAfter never reaches past that end. A mutant that took a
// PTTL of 0 for a counter without a TTL gave the full window again to a
// request denied in that last millisecond, so that a client sending
// without pause could stay denied for good; no test sent at a window's
// end. The windows are short, so that many ends pass within the test.
func TestFixedWindowEndNeverMoves(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	const window = 10 * time.Millisecond
	l := newLimiter(t, sc, Options{Algorithm: FixedWindow, Limit: Limit{Rate: 1, Period: window}, DisableDenyCache: true})
	ctx := context.Background()
	var opened time.Time // the local time the allowed call's reply came: the window opened before it
	windows, denials := 0, 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) || windows < 20; {
		sent := time.Now()
		res, err := l.Allow(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			opened = time.Now()
			windows++
			continue
		}
		denials++
		if opened.IsZero() {
			continue
		}
		// The window ends at most Period after opened; the server's clock
		// counts whole milliseconds, hence a little slack.
		if end := window - sent.Sub(opened) + 2*time.Millisecond; res.ResetAfter > end {
			t.Fatalf("a denial %v after the window opened says ResetAfter %v, past the window's end (at most %v from now): the window was extended",
				sent.Sub(opened), res.ResetAfter, end)
		}
	}
	t.Logf("%d windows, %d denials", windows, denials)
}

// TestGCRAIntervalUnderAMicrosecond: a GCRA limit of 2,000,000 per second
// (an emission interval of half a microsecond), burst 10, lets exactly 10
// requests through at one instant, as a single limit and in a Policies
// set. A mutant that took a bucket less than a microsecond ahead for an
// empty one let every request through; only a stopped clock shows it.
func TestGCRAIntervalUnderAMicrosecond(t *testing.T) {
	lim := Limit{Rate: 2_000_000, Period: time.Second, Burst: 10}
	t.Run("limiter", func(t *testing.T) {
		l, _ := newFrozenLimiter(t, Options{Limit: lim, DisableDenyCache: true}, window10s)
		for i := range 11 {
			res := allow(t, l, "k", 1)
			if res.Allowed != (i < 10) || res.Remaining != max(9-i, 0) {
				t.Fatalf("request %d at one instant = %+v, want allowed %v with %d remaining", i+1, res, i < 10, max(9-i, 0))
			}
		}
	})
	t.Run("policies", func(t *testing.T) {
		l, _ := newFrozenLimiter(t, Options{Limit: PerSecond(1), DisableDenyCache: true}, window10s)
		ps := newPolicies(t, Policy{Name: "fast", Limit: lim})
		for i := range 11 {
			d := allowPolicies(t, l, "k", 1, ps)
			if d.Allowed != (i < 10) || d.Results[0].Remaining != max(9-i, 0) {
				t.Fatalf("request %d at one instant = %+v, want allowed %v with %d remaining", i+1, d, i < 10, max(9-i, 0))
			}
		}
	})
}
