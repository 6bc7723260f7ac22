package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
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
