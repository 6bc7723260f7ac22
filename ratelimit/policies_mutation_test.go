package ratelimit

import (
	"testing"
	"time"
)

// Tests of ratelimit_multi written against the mutants of issue 32's run
// on the rate limiter (internal/harness/mutation/REPORT.md): a policy's
// figures at exact instants of a stopped clock, alone and beside a full
// policy that denies the call.

// policyStep is one call of a Policies scenario on a stopped clock: at
// start + at, with a cost (0: a peek); want is the first policy's Result
// (its Limit left out) and allowed the decision.
type policyStep struct {
	at      time.Duration
	cost    int
	allowed bool
	want    Result
}

// runPolicySteps runs steps on miniredis, whose clock stands still between
// SetTime calls, with the set ps.
func runPolicySteps(t *testing.T, start time.Time, ps *Policies, steps []policyStep) {
	t.Helper()
	l, mr := newFrozenLimiter(t, Options{Limit: PerSecond(1), DisableDenyCache: true}, start)
	for i, s := range steps {
		mr.SetTime(start.Add(s.at))
		d := allowPolicies(t, l, "k", s.cost, ps)
		got := d.Results[0]
		got.Limit = 0
		if d.Allowed != s.allowed || got != s.want {
			t.Fatalf("step %d (at %v, cost %d): allowed %v, first policy %+v; want %v, %+v", i, s.at, s.cost, d.Allowed, got, s.allowed, s.want)
		}
	}
}

// gatePolicy is a policy that one request fills for an hour: beside it,
// every later call is denied, and the other policies report their state
// without the call.
var gatePolicy = Policy{Name: "gate", Algorithm: FixedWindow, Limit: PerHour(1)}

// TestPoliciesSlidingFigures: a sliding-window policy, 4 per 10s, through
// a full window, the next one (where the previous window's count weighs by
// the share of it still inside the sliding window, and the state keeps it
// after a write), one where only the previous window counts, and one where
// nothing does. ResetAfter is the time until the estimate is back to 0.
// The same figures as a counter's (TestCountersSlidingFigures).
func TestPoliciesSlidingFigures(t *testing.T) {
	s := time.Second
	ps := newPolicies(t, Policy{Name: "s", Algorithm: SlidingWindow, Limit: Limit{Rate: 4, Period: 10 * s}})
	runPolicySteps(t, window10s, ps, []policyStep{
		{9 * s, 1, true, room(3, 11*s)},
		{9 * s, 1, true, room(2, 11*s)},
		{9 * s, 1, true, room(1, 11*s)},
		{9 * s, 1, true, room(0, 11*s)},
		{9 * s, 1, false, full(0, 3500*time.Millisecond, 11*s)},
		{15 * s, 4, false, full(2, 5*s, 5*s)},
		{15 * s, 0, true, room(2, 5*s)},
		{15 * s, 1, true, room(1, 15*s)},
		{15 * s, 1, true, room(0, 15*s)},
		{15 * s, 1, false, full(0, 2500*time.Millisecond, 15*s)},
		{25 * s, 0, true, room(3, 5*s)},
		{25 * s, 1, true, room(2, 15*s)},
		{35 * s, 0, true, room(3, 5*s)},
		{55 * s, 0, true, room(4, 0)},
	})
}

// TestPoliciesFixedFigures: a fixed-window policy's window starts at its
// first counted request (a peek starts none) and ends a Period later, the
// instant it ends included; ResetAfter is 0 while nothing is counted. The
// shortest window, 1ms, is a fixed window too.
func TestPoliciesFixedFigures(t *testing.T) {
	s := time.Second
	runPolicySteps(t, window10s, newPolicies(t, Policy{Name: "f", Algorithm: FixedWindow, Limit: Limit{Rate: 4, Period: 10 * s}}), []policyStep{
		{1 * s, 0, true, room(4, 0)},
		{6 * s, 1, true, room(3, 10*s)},
		{16 * s, 1, true, room(3, 10*s)},
		{16 * s, 3, true, room(0, 10*s)},
		{16 * s, 1, false, full(0, 10*s, 10*s)},
		{20 * s, 1, false, full(0, 6*s, 6*s)},
	})
	runPolicySteps(t, window10s, newPolicies(t, Policy{Name: "f", Algorithm: FixedWindow, Limit: Limit{Rate: 1, Period: time.Millisecond}}), []policyStep{
		{0, 1, true, room(0, time.Millisecond)},
		{0, 1, false, full(0, time.Millisecond, time.Millisecond)},
		{time.Millisecond, 1, true, room(0, time.Millisecond)},
	})
}

// TestPoliciesBesideDenial: a policy with room beside one that denies
// reports its state without the denied request, at the edges of its
// algorithm: a GCRA bucket the request would exactly fill (it has room),
// a bucket less than a microsecond ahead, a fixed window at the instant
// it ends, a sliding window whose previous window alone counts.
func TestPoliciesBesideDenial(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name   string
		policy Policy
		at     time.Duration // of the denied call; the first is at 0
		want   Result
	}{
		// 2 per 10s: the first request leaves the bucket 5s ahead; a
		// second would fill it exactly.
		{"gcra", Policy{Name: "p", Limit: Limit{Rate: 2, Period: 10 * s}}, 0, room(1, 5*s)},
		{"gcra under a microsecond", Policy{Name: "p", Limit: Limit{Rate: 2_000_000, Period: s, Burst: 10}}, 0, room(9, time.Microsecond)},
		// The instant the window ends: a new one.
		{"fixed, window over", Policy{Name: "p", Algorithm: FixedWindow, Limit: Limit{Rate: 4, Period: s}}, s, room(4, 0)},
		{"fixed", Policy{Name: "p", Algorithm: FixedWindow, Limit: Limit{Rate: 4, Period: 10 * s}}, 4 * s, room(3, 6*s)},
		// The first request at 9s, the denied one 5s into the next
		// window: it weighs 0.5.
		{"sliding, previous window", Policy{Name: "p", Algorithm: SlidingWindow, Limit: Limit{Rate: 4, Period: 10 * s}}, 6 * s, room(3, 5*s)},
		{"sliding", Policy{Name: "p", Algorithm: SlidingWindow, Limit: Limit{Rate: 4, Period: 10 * s}}, 0, room(3, 11*s)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := window10s
			if tc.policy.Algorithm == SlidingWindow {
				start = start.Add(9 * s)
			}
			l, mr := newFrozenLimiter(t, Options{Limit: PerSecond(1), DisableDenyCache: true}, start)
			ps := newPolicies(t, tc.policy, gatePolicy)
			if d := allowPolicies(t, l, "k", 1, ps); !d.Allowed {
				t.Fatalf("first request = %+v, want allowed", d)
			}
			mr.SetTime(start.Add(tc.at))
			d := allowPolicies(t, l, "k", 1, ps)
			got := d.Results[0]
			got.Limit = 0
			if d.Allowed || got != tc.want {
				t.Fatalf("beside the full gate %v later: allowed %v, policy %+v; want denied, %+v", tc.at, d.Allowed, got, tc.want)
			}
		})
	}
}
