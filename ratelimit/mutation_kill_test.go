package ratelimit

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// Tests written against mutants that escaped every other test (issue 32;
// internal/harness/mutation lists them). Each says which mutant it kills.

// TestFixedWindowLaterRequestKeepsItsEnd: a fixed window ends a Period
// after its first request, whatever comes later: the second request's
// ResetAfter is the first's less the time between them. A mutant of
// ratelimit_fixed that restarted the window's expiry on the second
// request (before == 1 for before == 0) moved the window's end and let
// the next window start late; no test compared two requests' resets.
func TestFixedWindowLaterRequestKeepsItsEnd(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	l := newLimiter(t, sc, Options{Algorithm: FixedWindow, Limit: Limit{Rate: 10, Period: time.Minute}})
	first := allow(t, l, "k", 1)
	if !first.Allowed || first.ResetAfter != time.Minute {
		t.Fatalf("first request = %+v, want allowed with the whole window to go", first)
	}
	// Let the server's clock move on: the second request's window must
	// be this much shorter.
	const gap = 100 * time.Millisecond
	time.Sleep(gap)
	second := allow(t, l, "k", 1)
	if !second.Allowed || second.ResetAfter > first.ResetAfter-gap/2 {
		t.Fatalf("second request %v later = %+v, want allowed with ResetAfter at most %v (the window's end did not move)",
			gap, second, first.ResetAfter-gap/2)
	}
}

// TestPoliciesDeniedReportsIdleSlidingPolicyReset: when a request is
// denied by one policy, a sliding-window policy with room reports its
// state without the request; with nothing counted in its current or
// previous window (both ran out), that state is at its full limit and its
// ResetAfter is 0. Two mutants of ratelimit_multi's denial path (the
// reset's conditions negated or loosened to prev >= 0) reported a reset
// to come, and no test looked at an idle policy beside a denying one.
func TestPoliciesDeniedReportsIdleSlidingPolicyReset(t *testing.T) {
	ctx := context.Background()
	sc := newCache(t, redistest.Single(t).Addr())
	l := newLimiter(t, sc, Options{Limit: Limit{Rate: 1, Period: time.Second}})
	ps, err := NewPolicies(
		Policy{Name: "tight", Algorithm: FixedWindow, Limit: Limit{Rate: 1, Period: time.Minute}},
		Policy{Name: "loose", Algorithm: SlidingWindow, Limit: Limit{Rate: 100, Period: 100 * time.Millisecond}},
	)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := l.AllowPolicies(ctx, "k", 1, ps); err != nil || !d.Allowed {
		t.Fatalf("first request = %+v, %v; want allowed", d, err)
	}
	// The loose policy's windows run out: two of them, so that neither its
	// current nor its previous window holds the first request.
	time.Sleep(250 * time.Millisecond)
	d, err := l.AllowPolicies(ctx, "k", 1, ps)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Results[0].Allowed {
		t.Fatalf("second request = %+v, want denied by the tight policy", d)
	}
	if r := d.Results[1]; !r.Allowed || r.Remaining != 100 || r.ResetAfter != 0 {
		t.Errorf("the idle sliding policy beside a denial = %+v, want room, Remaining 100 and ResetAfter 0", r)
	}
}

// TestPoliciesSlidingWeighsPreviousWindow: a sliding-window policy of a
// Policies set counts the previous window's requests, weighted by its
// share still inside the sliding window, as the single limiter does. On a
// frozen clock: 6 of 10 late in one window leave 5.4 one second into the
// next, so a request of 5 is denied there. Two mutants of ratelimit_multi
// that dropped the previous window's count (idx - 2 for idx - 1, and the
// test negated) allowed it, and no test crossed a window with a Policies
// set.
func TestPoliciesSlidingWeighsPreviousWindow(t *testing.T) {
	ctx := context.Background()
	l, mr := newFrozenLimiter(t, Options{Limit: Limit{Rate: 1, Period: time.Second}}, window10s.Add(9*time.Second))
	ps, err := NewPolicies(Policy{Name: "sliding", Algorithm: SlidingWindow, Limit: Limit{Rate: 10, Period: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := l.AllowPolicies(ctx, "k", 6, ps); err != nil || !d.Allowed {
		t.Fatalf("6 late in a window = %+v, %v; want allowed", d, err)
	}
	mr.SetTime(window10s.Add(11 * time.Second))
	d, err := l.AllowPolicies(ctx, "k", 5, ps)
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed {
		t.Fatalf("5 one second into the next window = %+v, want denied (the previous 6 still weigh 5.4 of 10)", d)
	}
	if r := d.Results[0]; r.Remaining != 4 {
		t.Errorf("the denial's Remaining = %d, want 4 (10 - 5.4, rounded down)", r.Remaining)
	}
}

// TestConcurrencyUnavailableRetryAfter: the concurrency middleware's
// FallbackClosed 503 carries no Retry-After by default and
// UnavailableRetryAfter, rounded up to seconds, when set, as the rate
// middleware's does. A Go mutant that inverted the test (== "") set an
// empty Retry-After by default and none when configured; only the rate
// middleware's 503 was checked.
func TestConcurrencyUnavailableRetryAfter(t *testing.T) {
	srv := redistest.NewServer(t)
	sc := newCache(t, srv.Addr())
	mgr, err := semaphore.NewManager(sc, semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	srv.Kill()
	var errs errRecorder
	for _, tc := range []struct {
		retry time.Duration
		want  []string
	}{{0, nil}, {1500 * time.Millisecond, []string{"2"}}} {
		mw, err := NewConcurrencyMiddleware(mgr, ConcurrencyOptions{Limit: 1, OnError: errs.record, Fallback: FallbackClosed, UnavailableRetryAfter: tc.retry})
		if err != nil {
			t.Fatal(err)
		}
		w := serve(mw(okHandler), request("192.0.2.13:1"))
		if got := w.Header().Values("Retry-After"); w.Code != http.StatusServiceUnavailable || !slices.Equal(got, tc.want) {
			t.Errorf("UnavailableRetryAfter %v: status %d, Retry-After %q; want 503, %q", tc.retry, w.Code, got, tc.want)
		}
	}
}
