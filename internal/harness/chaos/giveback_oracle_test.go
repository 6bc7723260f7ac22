package chaos

import (
	"context"
	"testing"
	"time"
)

// TestGiveBackVerdict checks the give-back oracle of giveBackWaited
// (giveBackFrom, giveBackLate) on the rounds of the CI failures it got
// wrong, and on those it must still call late. Times are ms from the
// abandoned attempt's call; the bound is a quarter of the default lease.
func TestGiveBackVerdict(t *testing.T) {
	const bound = 500 * time.Millisecond
	t0 := time.Unix(1000, 0)
	at := func(ms float64) time.Time {
		if ms < 0 {
			return time.Time{} // no probe: the attempt won
		}
		return t0.Add(time.Duration(ms * float64(time.Millisecond)))
	}
	for _, tc := range []struct {
		name                      string
		aEnd, bCall, probed, bRet float64
		stalled                   time.Duration
		late                      bool
	}{
		// The server answered the attempt (and the read behind it) 750 ms
		// late; the give-back and the waiter's grant took 114 ms more. The
		// old oracle counted from aEnd: 862 ms, late.
		{"reply held up by the server", 1.2, 3.3, 750, 864, 0, false},
		// The waiter's own deadline (a lease) ended inside 1.53 s of this
		// process's stalls: the old oracle called any error late.
		{"waiter cut by its deadline within stalls", 0.8, 0.8, 10, 2000, 1530 * time.Millisecond, false},
		// What the lanes must still catch: no give-back (the waiter waits
		// out the lease) and no wake-up (a fair waiter's refresh, a third
		// of a lease), with the read back at once.
		{"no give-back: waiter cut by its deadline", 0.8, 0.8, 2, 2000, 0, true},
		{"no give-back, some stalls", 0.8, 0.8, 2, 2000, 300 * time.Millisecond, true},
		{"no wake-up: a refresh's period", 0.8, 1.1, 3, 670, 0, true},
		{"attempt won: from its release, no probe", 5, 1, -1, 600, 0, true},
		{"attempt won, waiter served", 5, 1, -1, 40, 0, false},
		{"waiter called after the read", 0.8, 30, 3, 520, 0, false},
		// Core, seed 2, under hogs: the read took 205 ms, the waiter's
		// subscription and attempt again as long; 459 ms of stalls.
		{"round trips of 205 ms", 0.7, 138.6, 205.4, 1198, 459 * time.Millisecond, false},
		{"round trips of 205 ms, no give-back", 0.7, 138.6, 205.4, 2139, 100 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			from := giveBackFrom(at(tc.aEnd), at(tc.bCall), at(tc.probed))
			var rtt time.Duration
			if tc.probed >= 0 {
				rtt = at(tc.probed).Sub(at(tc.aEnd))
			}
			if got := giveBackLate(at(tc.bRet).Sub(from), tc.stalled, rtt, bound); got != tc.late {
				t.Errorf("late = %v after %v (from %v), want %v", got, at(tc.bRet).Sub(from), from.Sub(t0), tc.late)
			}
		})
	}
}

// deadlineOnly is a context whose deadline has passed while its Err is
// still nil: the moment before its timer fires.
type deadlineOnly struct {
	context.Context
	d time.Time
}

func (c deadlineOnly) Deadline() (time.Time, bool) { return c.d, true }

// TestRunOver checks that a call cut by the run's own deadline is the
// run's end even before ctx.Err() says so (go-redis, ContextTimeoutEnabled,
// seed 1: an ACL lane's Unlock failed 53 ms after its call, at the run's
// 16 s, and was called a violation).
func TestRunOver(t *testing.T) {
	past, future := time.Now().Add(-time.Millisecond), time.Now().Add(time.Hour)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		over bool
	}{
		{"no deadline", context.Background(), false},
		{"deadline ahead", deadlineOnly{context.Background(), future}, false},
		{"deadline passed, timer not fired", deadlineOnly{context.Background(), past}, true},
		{"cancelled", cancelled, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := runOver(tc.ctx); got != tc.over {
				t.Errorf("runOver = %v, want %v", got, tc.over)
			}
		})
	}
}
