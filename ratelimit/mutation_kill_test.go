package ratelimit

import (
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
