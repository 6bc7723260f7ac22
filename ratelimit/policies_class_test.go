package ratelimit

import (
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestPoliciesClassRoomBesideDenial (issue 32, ratelimit_multi as a
// class, on a real server): when one policy denies a call, every other
// policy is decided again and reports whether it had room, both ways at
// the boundary. Each algorithm's policy P takes a first call of cost 2
// beside a gate of 2 per hour, which that call fills; the second call of
// cost 2 is denied by the gate. With P's limit 4 the call fits P exactly
// (2 + 2 = 4): P has room, reports 2 remaining (the denied call is not
// counted) and no wait. With P's limit 3 it does not: P has no room, 1
// remaining, and a wait of its own. The allowed path's boundary is
// checked on the first call (2 of 2 fill the gate exactly). A mutant of
// the denial's pass that decided room with < for <= (fixed or sliding
// window) told the caller that P, which had room, would have refused the
// call too; the tests on miniredis filled no window exactly beside a
// denial.
func TestPoliciesClassRoomBesideDenial(t *testing.T) {
	const h = time.Hour
	srv := redistest.Single(t)
	for _, tc := range []struct {
		name  string
		algo  Algorithm
		limit int
		// P's Result for the denied call: room, Remaining, and
		// RetryAfter and ResetAfter (for a sliding window, from the
		// start of the current window).
		room         bool
		remaining    int
		retry, reset time.Duration
	}{
		{"fixed, fits exactly", FixedWindow, 4, true, 2, 0, h},
		{"fixed, one over", FixedWindow, 3, false, 1, h, h},
		// The current window's 2 count until the end of the next one.
		{"sliding, fits exactly", SlidingWindow, 4, true, 2, 0, 2 * h},
		// 4 > 3 in this window: wait for the next, where this one's 2
		// must weigh 1 (half of it gone).
		{"sliding, one over", SlidingWindow, 3, false, 1, 3 * h / 2, 2 * h},
		// 900s a token: 2 used are 1800s ahead, 2 more fill 3600s.
		{"gcra, fits exactly", GCRA, 4, true, 2, 0, h / 2},
		// 1200s a token: 2 used are 2400s ahead, 2 more need 4800s of
		// 3600s.
		{"gcra, one over", GCRA, 3, false, 1, h / 3, 2 * h / 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLimiter(t, newCache(t, srv.Addr()), Options{Limit: PerSecond(1), DisableDenyCache: true})
			ps := newPolicies(t,
				Policy{Name: "p", Algorithm: tc.algo, Limit: PerHour(tc.limit)},
				Policy{Name: "gate", Algorithm: FixedWindow, Limit: PerHour(2)},
			)
			if tc.algo == SlidingWindow {
				// Windows are hours of the Unix epoch: keep both calls in
				// one (a turn between them would weigh the first call's
				// count from the previous window).
				if left := h - time.Duration(time.Now().UnixMicro()%h.Microseconds())*time.Microsecond; left < 5*time.Second {
					time.Sleep(left)
				}
			}
			start := time.Now()
			first := allowPolicies(t, l, "k", 2, ps)
			if !first.Allowed || first.Results[0].Remaining != tc.limit-2 || !first.Results[1].Allowed || first.Results[1].Remaining != 0 {
				t.Fatalf("first call, cost 2 = %+v; want allowed, the gate filled exactly and %d left in p", first, tc.limit-2)
			}
			d := allowPolicies(t, l, "k", 2, ps)
			slack := time.Since(start) + time.Second
			got := d.Results[0]
			if d.Allowed || d.Results[1].Allowed {
				t.Fatalf("second call = %+v; want denied by the gate", d)
			}
			if got.Allowed != tc.room || got.Remaining != tc.remaining {
				t.Errorf("p beside the denial: room %v, remaining %d; want room %v, %d remaining", got.Allowed, got.Remaining, tc.room, tc.remaining)
			}
			retry, reset := tc.retry, tc.reset
			if tc.algo == SlidingWindow {
				// Both count from the start of this window.
				gone := time.Duration(time.Now().UnixMicro()%h.Microseconds()) * time.Microsecond
				reset -= gone
				if !tc.room {
					retry -= gone
				}
			}
			for _, f := range []struct {
				what      string
				got, want time.Duration
			}{{"RetryAfter", got.RetryAfter, retry}, {"ResetAfter", got.ResetAfter, reset}} {
				if f.got < f.want-slack || f.got > f.want+slack {
					t.Errorf("p's %s = %v, want %v (within %v)", f.what, f.got, f.want, slack)
				}
			}
		})
	}
}
