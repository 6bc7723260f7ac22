package chaos

import (
	"testing"
	"time"

	"github.com/sluicekit/sluice/ratelimit"
)

// TestRoomInDenial checks the exact model's judgement of a policy that a
// denied decision reports with room: the deny cache may report it up to
// the round trip of the denial it keeps early (cacheSlack), and no more.
func TestRoomInDenial(t *testing.T) {
	const tat = int64(1_795_906_473_624_708) // µs: the GCRA bucket's theoretical arrival time
	// GCRA of 8 a second, burst 4: a request of cost 1 fits from
	// tat - 3 emission intervals (375 ms) on.
	fits := tat - 375_000
	tests := []struct {
		name       string
		short      int64 // µs: how far the latest corner is from fitting
		cacheSlack int64 // µs: the kept denial's round trip, and slackUS
		wrong      bool
	}{
		// The cached answer of the go-redis run: room 12 µs before the
		// latest corner, after a denial that took 17 ms.
		{name: "early within the kept denial's round trip", short: 12, cacheSlack: 19_000},
		{name: "early with no denial kept", short: 12, cacheSlack: 0, wrong: true},
		{name: "early past the kept denial's round trip", short: 25_000, cacheSlack: 19_000, wrong: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newModel(limiterSpec{algo: ratelimit.GCRA, limit: ratelimit.Limit{Rate: 8, Period: time.Second, Burst: 4}})
			m.lo.tat, m.hi.tat = float64(tat), float64(tat)
			m.cacheSlack = tt.cacheSlack
			b := fits - slackUS - tt.short // the call returned then
			v := m.judge(b-100, b, 1)
			if !v.mustDeny {
				t.Fatalf("the model allows the request at its latest corner: %+v", v)
			}
			got := m.roomWrong(v, b-100, b, 1, outcome{allowed: true, rem: 0, reset: tat - b})
			if (got != "") != tt.wrong {
				t.Errorf("roomWrong = %q, want wrong: %v", got, tt.wrong)
			}
		})
	}
}

// TestDenialResetAfter checks the exact model's judgement of a denial's
// ResetAfter: a full fixed window reports the time left of it (the deny
// cache's early by the kept denial's round trip), not none and not more.
func TestDenialResetAfter(t *testing.T) {
	const end = int64(1_795_906_473_624_708) // µs: the window's end
	const b = end - 400_000                  // the call returned then
	tests := []struct {
		name       string
		reset      int64 // µs
		cacheSlack int64
		wrong      bool
	}{
		{name: "the time left of the window", reset: 400_000},
		{name: "none, with the window full", reset: 0, wrong: true},
		{name: "past the window's end", reset: 450_000, wrong: true},
		{name: "early by the kept denial's round trip", reset: 390_000, cacheSlack: 12_000},
		{name: "early with no denial kept", reset: 390_000, wrong: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newModel(limiterSpec{algo: ratelimit.FixedWindow, limit: ratelimit.Limit{Rate: 6, Period: time.Second}})
			m.lo, m.hi = lstate{count: 6, end: end}, lstate{count: 6, end: end}
			m.cacheSlack = tt.cacheSlack
			v := m.judge(b-100, b, 1)
			if !v.mustDeny {
				t.Fatalf("the model allows the request: %+v", v)
			}
			got := m.fieldsWrong(v, outcome{rem: 0, retry: 400_000, reset: tt.reset}, 1, false)
			if (got != "") != tt.wrong {
				t.Errorf("fieldsWrong = %q, want wrong: %v", got, tt.wrong)
			}
		})
	}
}
