package ratelimit

import (
	"testing"
	"time"
)

// TestSlidingScriptFigures (issue 32, ratelimit_sliding as a class, on a
// stopped clock): every figure the single-key sliding window reports, for
// each state its branches tell apart: nothing counted, a count in the
// current window, a count only in the previous window (1 exactly, the
// smallest count there is, and more), both, full at the bound and one
// past it. Each state is read by a peek (cost 0, which writes nothing and
// reports the state as it is) and by a counted call, so that ResetAfter
// (the time until the estimate is back to 0: two windows less the elapsed
// part with a count in this window, one window less it with only the
// previous one, 0 with neither) and Remaining are checked on both of the
// script's paths, and what must be allowed is checked beside what must be
// refused. TestCountersSlidingFigures does the same for ratelimit_counters;
// a mutant that read a previous count of 1 as none (prev > 1 for prev > 0)
// survived a fresh sample of this script.
func TestSlidingScriptFigures(t *testing.T) {
	s := time.Second
	l, mr := newFrozenLimiter(t, Options{Algorithm: SlidingWindow, Limit: Limit{Rate: 4, Period: 10 * s}, DisableDenyCache: true}, window10s)
	for i, step := range []struct {
		at   time.Duration // from window10s
		cost int
		want Result // Limit left out
	}{
		// Nothing counted: a peek reports the full limit and no reset.
		{2 * s, 0, room(4, 0)},
		// One counted 2s into the window: it weighs until the next
		// window ends.
		{2 * s, 1, room(3, 18*s)},
		{6 * s, 0, room(3, 14*s)},
		// Exactly the limit fits (1 + 3 = 4), and then nothing.
		{6 * s, 3, room(0, 14*s)},
		{6 * s, 1, full(0, 4*s+2500*time.Millisecond, 14*s)},
		{6 * s, 0, room(0, 14*s)},
		// The next window, 5s in: the previous 4 weigh 2, nothing
		// counted in this one, so the estimate is 0 when it ends.
		{15 * s, 0, room(2, 5*s)},
		// 2 + 2 = 4 fits exactly; 2 + 3 does not, and must wait until
		// the previous 4 weigh 1: at 7.5s.
		{15 * s, 3, full(2, 2500*time.Millisecond, 5*s)},
		{15 * s, 2, room(0, 15*s)},
		// The window after: the previous window held 2, weighing 1 at
		// 5s in, and one more fits only to the limit.
		{25 * s, 0, room(3, 5*s)},
		{25 * s, 1, room(2, 15*s)},
		// Two windows on, one counted; then a window with the previous
		// window's count exactly 1 (weighing 0.8 at 2s in), and nothing
		// in this one: reset is the rest of this window.
		{45 * s, 1, room(3, 15*s)},
		{52 * s, 0, room(3, 8*s)},
		{52 * s, 4, full(3, 8*s, 8*s)},
		// The last microsecond of that window: the 1 weighs 1e-7.
		{60*s - time.Microsecond, 0, room(3, time.Microsecond)},
		// Nothing in this window or the one before.
		{65 * s, 0, room(4, 0)},
		{65 * s, 4, room(0, 15*s)},
	} {
		mr.SetTime(window10s.Add(step.at))
		got := allow(t, l, "k", step.cost)
		got.Limit = 0
		if got != step.want {
			t.Fatalf("step %d (at %v, cost %d): %+v; want %+v", i, step.at, step.cost, got, step.want)
		}
	}
}
