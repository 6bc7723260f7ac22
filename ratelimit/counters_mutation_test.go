package ratelimit

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// Tests of ratelimit_counters written against the mutants of issue 32's
// run on the rate limiter (internal/harness/mutation/REPORT.md): every
// figure a counter reports, at exact instants of a stopped clock, in the
// states its branches tell apart (fresh, counted, the previous window
// only, full), alone and beside a counter that denies the call.

// counterStep is one call of a counter scenario on a stopped clock: at
// start + at, the subject counter with a cost (0: a peek), alone or beside
// a full gate counter that denies the call; want is the subject's Result
// (its Limit left out) and allowed the call's decision.
type counterStep struct {
	at      time.Duration
	cost    int
	gated   bool
	allowed bool
	want    Result
}

// runCounterSteps runs steps on miniredis, whose clock stands still
// between SetTime calls.
func runCounterSteps(t *testing.T, start time.Time, subject Counter, steps []counterStep) {
	t.Helper()
	l, mr := newFrozenLimiter(t, Options{Limit: PerSecond(1), DisableDenyCache: true}, start)
	gate := Counter{Key: "gate", Policy: Policy{Algorithm: FixedWindow, Limit: PerHour(1)}}
	if d := allowCounters(t, l, "g", gate); !d.Allowed {
		t.Fatalf("filling the gate: %+v", d)
	}
	for i, s := range steps {
		mr.SetTime(start.Add(s.at))
		c := subject
		c.Cost, c.Peek = s.cost, s.cost == 0
		cs := []Counter{c}
		if s.gated {
			cs = append(cs, gate)
		}
		d := allowCounters(t, l, "g", cs...)
		got := d.Results[0]
		got.Limit = 0
		if d.Allowed != s.allowed || got != s.want {
			t.Fatalf("step %d (at %v, cost %d, gated %v): allowed %v, subject %+v; want %v, %+v", i, s.at, s.cost, s.gated, d.Allowed, got, s.allowed, s.want)
		}
	}
}

// room is a Result with room: remaining and reset.
func room(remaining int, reset time.Duration) Result {
	return Result{Allowed: true, Remaining: remaining, ResetAfter: reset}
}

// full is a Result without room: remaining, the wait and the reset.
func full(remaining int, retry, reset time.Duration) Result {
	return Result{Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
}

// TestCountersSlidingFigures: a sliding-window counter, 4 per 10s, through
// a full window, the next one (where the previous window's count weighs
// by the share of it still inside the sliding window), one where only the
// previous window counts, and one where nothing does. ResetAfter is the
// time until the estimate is back to 0: two windows less the elapsed part
// with a count in the current window, one window less it with only the
// previous, 0 with neither; a counter that did not count the call
// reports its state as it is.
func TestCountersSlidingFigures(t *testing.T) {
	s := time.Second
	runCounterSteps(t, window10s, Counter{Key: "k", Policy: Policy{Algorithm: SlidingWindow, Limit: Limit{Rate: 4, Period: 10 * s}}}, []counterStep{
		{9 * s, 1, false, true, room(3, 11*s)},
		{9 * s, 1, false, true, room(2, 11*s)},
		{9 * s, 1, false, true, room(1, 11*s)},
		{9 * s, 1, false, true, room(0, 11*s)},
		// Full: the next window, where these 4 must weigh at most 3:
		// 1s, then 2.5s more.
		{9 * s, 1, false, false, full(0, 3500*time.Millisecond, 11*s)},
		// 5s into the next window: the previous 4 weigh 2. A cost of 4
		// fits when they weigh nothing, at the window's end.
		{15 * s, 4, false, false, full(2, 5*s, 5*s)},
		{15 * s, 0, false, true, room(2, 5*s)},
		{15 * s, 1, false, true, room(1, 15*s)},
		// The previous window still weighs 2: the state keeps it.
		{15 * s, 1, false, true, room(0, 15*s)},
		// 2 + 2 of 4: the previous share must shrink to 1, 2.5s on.
		{15 * s, 1, false, false, full(0, 2500*time.Millisecond, 15*s)},
		// The next window: the previous 2 weigh 1.
		{25 * s, 1, true, false, room(3, 5*s)},
		{25 * s, 0, false, true, room(3, 5*s)},
		{25 * s, 1, false, true, room(2, 15*s)},
		{25 * s, 1, true, false, room(2, 15*s)},
		// The previous window held 1, which weighs 0.5.
		{35 * s, 0, false, true, room(3, 5*s)},
		{35 * s, 1, true, false, room(3, 5*s)},
		// Nothing in this window or the one before.
		{55 * s, 0, false, true, room(4, 0)},
		{55 * s, 1, true, false, room(4, 0)},
	})
}

// TestCountersFixedFigures: a fixed window starts at its first counted
// request (a peek or a denied call starts none) and ends a Period later,
// the instant it ends included; ResetAfter is 0 while nothing is counted.
func TestCountersFixedFigures(t *testing.T) {
	s := time.Second
	runCounterSteps(t, window10s, Counter{Key: "k", Policy: Policy{Algorithm: FixedWindow, Limit: Limit{Rate: 4, Period: 10 * s}}}, []counterStep{
		{1 * s, 0, false, true, room(4, 0)},
		{1 * s, 1, true, false, room(4, 0)},
		{6 * s, 1, false, true, room(3, 10*s)},
		{6 * s, 1, true, false, room(3, 10*s)},
		// The window's end: a new window.
		{16 * s, 1, false, true, room(3, 10*s)},
		{16 * s, 3, false, true, room(0, 10*s)},
		{16 * s, 1, false, false, full(0, 10*s, 10*s)},
		{20 * s, 1, false, false, full(0, 6*s, 6*s)},
	})
	// The shortest window, 1ms, is a fixed window too.
	runCounterSteps(t, window10s, Counter{Key: "k", Policy: Policy{Algorithm: FixedWindow, Limit: Limit{Rate: 1, Period: time.Millisecond}}}, []counterStep{
		{0, 1, false, true, room(0, time.Millisecond)},
		{0, 1, false, false, full(0, time.Millisecond, time.Millisecond)},
		{time.Millisecond, 1, false, true, room(0, time.Millisecond)},
	})
}

// TestCountersAlignedFigures: an aligned window ends at the next whole
// multiple of its Period; ResetAfter is 0 while nothing is counted in it.
func TestCountersAlignedFigures(t *testing.T) {
	s := time.Second
	runCounterSteps(t, window10s, Counter{Key: "k", Policy: Policy{Algorithm: FixedWindow, Limit: Limit{Rate: 4, Period: 10 * s}}, Aligned: true}, []counterStep{
		{4 * s, 0, false, true, room(4, 0)},
		{4 * s, 1, true, false, room(4, 0)},
		{4 * s, 1, false, true, room(3, 6*s)},
		{4 * s, 1, true, false, room(3, 6*s)},
		{4 * s, 3, false, true, room(0, 6*s)},
		{4 * s, 1, false, false, full(0, 6*s, 6*s)},
		{10 * s, 1, false, true, room(3, 10*s)},
	})
}

// TestCountersGCRAFigures: a bucket of one (a GCRA counter whose Burst is
// 1), and one whose emission interval is under a microsecond (2,000,000
// per second, burst 10): at one instant exactly the burst passes, however
// small the interval.
func TestCountersGCRAFigures(t *testing.T) {
	s := time.Second
	runCounterSteps(t, window10s, Counter{Key: "k", Policy: Policy{Algorithm: GCRA, Limit: Limit{Rate: 1, Period: 10 * s}}}, []counterStep{
		{0, 0, false, true, room(1, 0)},
		{0, 1, true, false, room(1, 0)},
		{0, 1, false, true, room(0, 10*s)},
		{4 * s, 1, false, false, full(0, 6*s, 6*s)},
		{4 * s, 0, false, true, room(0, 6*s)},
		{10 * s, 1, false, true, room(0, 10*s)},
	})
	var steps []counterStep
	for i := range 10 {
		// After i+1 calls the bucket is (i+1)/2 µs ahead.
		steps = append(steps, counterStep{0, 1, false, true, room(9-i, time.Duration((i+2)/2)*time.Microsecond)})
	}
	steps = append(steps, counterStep{0, 1, false, false, full(0, time.Microsecond, 5*time.Microsecond)})
	runCounterSteps(t, window10s, Counter{Key: "k", Policy: Policy{Algorithm: GCRA, Limit: Limit{Rate: 2_000_000, Period: s, Burst: 10}}}, steps)
}

// TestCountersStateAsDocumented: on a server, each counter's state is the
// numbers ratelimit_counters documents, in MessagePack, and lives no
// longer than its counter needs: GCRA its TAT until the bucket is full
// again, a fixed window its count and end until the end, a sliding window
// its window's index, count and the previous count until the next window
// ends, an aligned window its index and count until its end.
func TestCountersStateAsDocumented(t *testing.T) {
	srv := redistest.Single(t)
	l := newLimiter(t, newCache(t, srv.Addr()), Options{Limit: PerSecond(1), DisableDenyCache: true})
	const period = 10 * time.Second
	for _, tc := range []struct {
		name    string
		c       Counter
		numbers int
		count   int           // where the count is among them (-1: none)
		live    time.Duration // the most the key may live
	}{
		{"gcra", Counter{Key: "k", Policy: Policy{Algorithm: GCRA, Limit: Limit{Rate: 2, Period: period}}}, 1, -1, period / 2},
		{"fixed", Counter{Key: "k", Policy: Policy{Algorithm: FixedWindow, Limit: Limit{Rate: 2, Period: period}}}, 2, 0, period},
		{"sliding", Counter{Key: "k", Policy: Policy{Algorithm: SlidingWindow, Limit: Limit{Rate: 2, Period: period}}}, 3, 1, 2 * period},
		{"aligned", Counter{Key: "k", Policy: Policy{Algorithm: FixedWindow, Limit: Limit{Rate: 2, Period: period}}, Aligned: true}, 2, 1, period},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := allowCounters(t, l, "g", tc.c); !d.Allowed {
				t.Fatalf("first call: %+v", d)
			}
			p, err := l.prepareCounters("g", []Counter{tc.c})
			if err != nil {
				t.Fatal(err)
			}
			key := p.keys[0]
			out, err := srv.Do("EVAL", `return {cmsgpack.unpack(redis.call('GET', KEYS[1]))}`, "1", key)
			if err != nil {
				t.Fatal(err)
			}
			nums := strings.Fields(out)
			if len(nums) != tc.numbers {
				t.Fatalf("state %q: %d numbers, want %d", out, len(nums), tc.numbers)
			}
			if tc.count >= 0 && nums[tc.count] != "1" {
				t.Errorf("state %q: count %s, want 1", out, nums[tc.count])
			}
			pttl, err := srv.Do("PTTL", key)
			if err != nil {
				t.Fatal(err)
			}
			ms, err := strconv.ParseInt(strings.TrimSpace(pttl), 10, 64)
			if err != nil {
				t.Fatalf("PTTL %q: %v", pttl, err)
			}
			if d := time.Duration(ms) * time.Millisecond; d <= 0 || d > tc.live {
				t.Errorf("PTTL %v, want in (0, %v]", d, tc.live)
			}
		})
	}
}
