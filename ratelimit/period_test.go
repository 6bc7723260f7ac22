package ratelimit

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestPeriodPrecision is issue 31, item 7: the window limiters cut Period
// to whole milliseconds, so a Period of 1.999 ms ran as a 1 ms window
// (nearly twice the rate). Each algorithm must keep its Period to the
// precision of its script's clock, or refuse it: the sliding window counts
// on TIME's microseconds, the fixed window's window is a TTL in
// milliseconds, GCRA's interval may be fractional.
func TestPeriodPrecision(t *testing.T) {
	const odd = 1999 * time.Microsecond
	for _, tt := range []struct {
		name    string
		algo    Algorithm
		period  time.Duration
		refused string // what the error must say; "" for accepted
		arg1    string // the window argument, if accepted
		arg0    string // GCRA's interval, if accepted
	}{
		{"fixed, whole ms", FixedWindow, 2 * time.Millisecond, "", "2", ""},
		{"fixed, 1.999ms", FixedWindow, odd, "whole number of milliseconds", "", ""},
		{"sliding, 1.999ms", SlidingWindow, odd, "", "1999", ""},
		{"sliding, whole s", SlidingWindow, time.Second, "", "1000000", ""},
		{"sliding, 1.9995ms", SlidingWindow, odd + 500*time.Nanosecond, "whole number of microseconds", "", ""},
		{"gcra, 1.999ms", GCRA, odd, "", "", "1999"},
		{"gcra, 1.9995ms", GCRA, odd + 500*time.Nanosecond, "", "", "1999.5"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := compile(tt.algo, Limit{Rate: 1, Period: tt.period})
			if tt.refused != "" {
				if !errors.Is(err, ErrInvalidLimit) || !strings.Contains(err.Error(), tt.refused) {
					t.Fatalf("compile(%v) = %v; want ErrInvalidLimit saying %q", tt.period, err, tt.refused)
				}
				return
			}
			if err != nil {
				t.Fatalf("compile(%v) = %v", tt.period, err)
			}
			if tt.arg1 != "" && c.arg1 != tt.arg1 {
				t.Errorf("window argument %q; want %q", c.arg1, tt.arg1)
			}
			if tt.arg0 != "" && c.arg0 != tt.arg0 {
				t.Errorf("GCRA interval %q µs; want %q", c.arg0, tt.arg0)
			}
		})
	}
}

// TestSlidingPeriodOnServer runs a sliding window of 1,999,999 µs on a
// real server, alone and as a policy of AllowPolicies, and reads the index
// of the window the script stored: it must be the server's time in
// microseconds divided by 1999999, not by 1999000 (the whole milliseconds
// it ran as before). A window of seconds, not of 2 ms: the state lives two
// windows, and a loaded machine took longer than 4 ms to read it.
func TestSlidingPeriodOnServer(t *testing.T) {
	srv := redistest.Single(t)
	sc := newCache(t, srv.Addr())
	const periodUS = 1_999_999
	lim := Limit{Rate: 1000, Period: periodUS * time.Microsecond}
	l := newLimiter(t, sc, Options{Algorithm: SlidingWindow, Limit: lim, Prefix: testPrefix(t), DisableDenyCache: true})
	ps := newPolicies(t, Policy{Name: "fine", Algorithm: SlidingWindow, Limit: lim})
	c := raw(sc)
	ctx := context.Background()
	serverMicros := func() int64 {
		tm, err := c.Do(ctx, c.B().Time().Build()).AsStrSlice()
		if err != nil || len(tm) != 2 {
			t.Fatalf("TIME = %v, %v", tm, err)
		}
		s, _ := strconv.ParseInt(tm[0], 10, 64)
		us, _ := strconv.ParseInt(tm[1], 10, 64)
		return s*1_000_000 + us
	}
	check := func(what string, idx int64, after int64) {
		t.Helper()
		// The call came before TIME was read, by less than 10 s however
		// loaded the machine.
		if start := idx * periodUS; start > after || after-start > 10_000_000 {
			t.Errorf("%s: window index %d starts at %d µs, server time %d µs: not a window of %d µs", what, idx, start, after, periodUS)
		}
	}
	if res := allow(t, l, "k", 1); !res.Allowed {
		t.Fatalf("Allow = %+v; want allowed", res)
	}
	after := serverMicros()
	w, err := c.Do(ctx, c.B().Hget().Key(keyspace.Key(l.prefix, "k", l.suffix)).Field("w").Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	check("Allow", w, after)

	if d := allowPolicies(t, l, "k", 1, ps); !d.Allowed {
		t.Fatalf("AllowPolicies = %+v; want allowed", d)
	}
	after = serverMicros()
	out, err := srv.Do("EVAL", `return {cmsgpack.unpack(redis.call('GET', KEYS[1]))}`, "1", keyspace.Key(l.prefix, "k", ps.suffix))
	if err != nil {
		t.Fatal(err)
	}
	st := strings.Split(out, "\n")
	idx, err := strconv.ParseInt(st[0], 10, 64)
	if err != nil || len(st) != 3 {
		t.Fatalf("state %q: want a window index, its count and the previous one", st)
	}
	check("AllowPolicies", idx, after)
}
