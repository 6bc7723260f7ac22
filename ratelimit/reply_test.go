package ratelimit

import (
	"context"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestAllowedReplyShapes: the GCRA and sliding window scripts answer an
// allowed call with one integer (remaining * radix + reset) when that is
// exact in a double, and with the array otherwise; AllowN decodes both to
// the same figures. Each case checks which shape the server sent (so the
// huge limits do reach the array) and exact figures for a peek and a first
// call on a fresh key; a radix on the client other than the script's
// would move Remaining and ResetAfter. Two GCRA cases sit at the limit,
// (burst + 1) * radix just at 2^53 and just past it: a mutant of
// ratelimit_gcra whose "<=" there became "<" sent the array for the
// product of exactly 2^53, and only limits far from it were tried.
func TestAllowedReplyShapes(t *testing.T) {
	const year = 366 * 24 * time.Hour
	us := func(n int64) time.Duration { return time.Duration(n) * time.Microsecond }
	cases := []struct {
		name   string
		algo   Algorithm
		limit  Limit
		packed bool
		// first call on a fresh key: Remaining, and ResetAfter within
		// [resetMin, resetMax]
		remaining          int
		resetMin, resetMax time.Duration
	}{
		{"gcra", GCRA, Limit{Rate: 10, Period: time.Second, Burst: 20}, true, 19, 100 * time.Millisecond, 100 * time.Millisecond},
		// interval 333333.33...us: ResetAfter is its ceiling.
		{"gcra fractional interval", GCRA, Limit{Rate: 3, Period: time.Second}, true, 2, us(333334), us(333334)},
		// interval 31622.4us, radix about 3.2e13: (burst + 1) * radix
		// passes 2^53.
		{"gcra huge", GCRA, Limit{Rate: maxRate, Period: year}, false, maxRate - 1, us(31623), us(31623)},
		// The limit itself: burst 511 and a radix of 2^44 make (burst + 1)
		// * radix exactly 2^53, whose integers are all still exact: one
		// integer. A microsecond more of period, and the array.
		{"gcra at 2^53", GCRA, Limit{Rate: 511, Period: us(17592186044415)}, true, 510, us(34426978561), us(34426978561)},
		{"gcra past 2^53", GCRA, Limit{Rate: 511, Period: us(17592186044416)}, false, 510, us(34426978561), us(34426978561)},
		{"sliding", SlidingWindow, Limit{Rate: 10, Period: time.Second}, true, 9, time.Second + time.Microsecond, 2 * time.Second},
		{"sliding huge", SlidingWindow, Limit{Rate: maxRate, Period: year}, false, maxRate - 1, year + time.Microsecond, 2 * year},
	}
	sc := newCache(t, redistest.Single(t).Addr())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLimiter(t, sc, Options{Algorithm: tc.algo, Limit: tc.limit, DisableDenyCache: true})
			c := raw(sc)
			m, err := c.Do(context.Background(), c.B().Evalsha().Sha1(l.script.SHA1()).Numkeys(1).Key(l.RedisKey("shape")).Arg(l.args1...).Build()).ToMessage()
			if err != nil {
				t.Fatal(err)
			}
			if m.IsInt64() != tc.packed {
				t.Fatalf("an allowed call's reply is an integer: %v; want %v (%v)", m.IsInt64(), tc.packed, m)
			}
			if packed := l.radix*int64(l.capacity+1) <= 1<<53; tc.algo == GCRA && packed != tc.packed {
				t.Fatalf("the client's radix %d with burst %d packs: %v; want %v", l.radix, l.capacity, packed, tc.packed)
			}
			capacity := l.capacity
			if res := allow(t, l, "k", 0); res != (Result{Allowed: true, Limit: capacity, Remaining: capacity}) {
				t.Fatalf("peek at a fresh key = %+v; want allowed with all %d remaining and no reset", res, capacity)
			}
			res := allow(t, l, "k", 1)
			if !res.Allowed || res.Limit != capacity || res.Remaining != tc.remaining || res.RetryAfter != 0 ||
				res.ResetAfter < tc.resetMin || res.ResetAfter > tc.resetMax {
				t.Fatalf("first call = %+v; want allowed, %d remaining, ResetAfter in [%v, %v]", res, tc.remaining, tc.resetMin, tc.resetMax)
			}
		})
	}
}
