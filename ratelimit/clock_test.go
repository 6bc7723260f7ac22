package ratelimit

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// Tests in this file run the scripts on miniredis, whose clock (the TIME
// the scripts read) only moves when the test sets it, so that exact values
// and boundary timings hold on any machine, however loaded.

// window10s is the start of a 10-second window in the scripts' alignment
// (multiples of the window since the Unix epoch).
var window10s = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

// newFrozenLimiter returns a limiter on a fresh miniredis whose clock is
// stopped at at, and the server to move it.
func newFrozenLimiter(t *testing.T, opts Options, at time.Time) (*Limiter, *miniredis.Miniredis) {
	t.Helper()
	mr := miniredis.RunT(t)
	mr.SetTime(at)
	sc := newCache(t, mr.Addr())
	return newLimiter(t, sc, opts), mr
}

// TestDenialHeadersAgree checks that on a denial the RateLimit field's t
// is the time until quota is available again and names the same second as
// Retry-After, for every algorithm, including GCRA and the sliding window
// whose ResetAfter (time until the key is back to full) is later.
func TestDenialHeadersAgree(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		at      time.Time
		allowed int
		want    string // RateLimit of the denial
		retry   string // its Retry-After
	}{
		// Rate 1 per 10s, burst 3: the fourth call waits 10s for one
		// token; the bucket is full again only after 30s.
		{"gcra", Options{Limit: Limit{Rate: 1, Period: 10 * time.Second, Burst: 3}}, window10s, 3, `"default";r=0;t=10`, "10"},
		// 2 per 10s, called 5s into a window: the third call must wait for
		// the next window (5s) and for this window's 2 to weigh at most 1
		// there (5s more); the estimate is 0 only after 15s.
		{"sliding window", Options{Algorithm: SlidingWindow, Limit: Limit{Rate: 2, Period: 10 * time.Second}}, window10s.Add(5 * time.Second), 2, `"default";r=0;t=10`, "10"},
		{"fixed window", Options{Algorithm: FixedWindow, Limit: Limit{Rate: 2, Period: 10 * time.Second}}, window10s, 2, `"default";r=0;t=10`, "10"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, _ := newFrozenLimiter(t, tt.opts, tt.at)
			// A generous timeout: miniredis is slow, and a loaded machine
			// must not turn an answer into a timeout.
			h := MustNewMiddleware(l, MiddlewareOptions{Timeout: time.Minute, OnError: func(_ *http.Request, err error) { t.Errorf("OnError: %v", err) }})(okHandler)
			for i := range tt.allowed {
				if w := serve(h, request("192.0.2.1:1")); w.Code != http.StatusOK {
					t.Fatalf("request %d: status %d; want 200", i+1, w.Code)
				}
			}
			// The second denial comes from the local deny cache, whose
			// deadline runs on the local clock: its value depends on how
			// long the first took, but t and Retry-After must still agree.
			for i := range 2 {
				w := serve(h, request("192.0.2.1:1"))
				if w.Code != http.StatusTooManyRequests {
					t.Fatalf("denial %d: status %d; want 429", i+1, w.Code)
				}
				rl, retry := w.Header().Get("RateLimit"), w.Header().Get("Retry-After")
				if i == 0 && (rl != tt.want || retry != tt.retry) {
					t.Errorf("denial %d: RateLimit %q, Retry-After %q; want %q, %q", i+1, rl, retry, tt.want, tt.retry)
				}
				if !strings.HasSuffix(rl, ";t="+retry) {
					t.Errorf("denial %d: RateLimit %q and Retry-After %q name different times", i+1, rl, retry)
				}
			}
		})
	}
}

// TestSlidingWindowBoundaryBound demonstrates the bound the documentation
// gives: when the previous window's Rate requests all came at its very end,
// the weighted estimate lets Rate-1 more through before the current window
// ends, so 2*Rate-1 pass within one Period. It also checks that no aligned
// window passes more than Rate, and that nothing more passes in that Period.
func TestSlidingWindowBoundaryBound(t *testing.T) {
	const rate = 10
	period := 10 * time.Second
	l, mr := newFrozenLimiter(t, Options{Algorithm: SlidingWindow, Limit: Limit{Rate: rate, Period: period}, DisableDenyCache: true}, window10s)
	first := window10s.Add(period - time.Millisecond) // the previous window's last millisecond
	mr.SetTime(first)
	passed := 0
	for allow(t, l, "k", 1).Allowed {
		passed++
	}
	if passed != rate {
		t.Fatalf("first window: %d passed; want %d", passed, rate)
	}
	// Walk the next window in 100ms steps up to one Period after the
	// first request, taking whatever is allowed at each step.
	for at := first.Add(time.Millisecond); at.Before(first.Add(period)); at = at.Add(100 * time.Millisecond) {
		mr.SetTime(at)
		for allow(t, l, "k", 1).Allowed {
			passed++
		}
	}
	// The last step is 9.999s into the window: 10 * 0.0001 + 9 <= 10.
	if passed != 2*rate-1 {
		t.Fatalf("%d passed within one period across the boundary; want %d (2*Rate-1, the documented bound)", passed, 2*rate-1)
	}
}

// TestSlidingWindowRetryAfterIsEnough checks on the frozen clock that
// waiting exactly RetryAfter after a denial is enough, and that waiting a
// microsecond less is not.
func TestSlidingWindowRetryAfterIsEnough(t *testing.T) {
	l, mr := newFrozenLimiter(t, Options{Algorithm: SlidingWindow, Limit: Limit{Rate: 3, Period: 10 * time.Second}, DisableDenyCache: true}, window10s.Add(4*time.Second))
	for range 3 {
		allow(t, l, "k", 1)
	}
	denied := allow(t, l, "k", 1)
	if denied.Allowed || denied.RetryAfter <= 0 {
		t.Fatalf("call 4: got %+v; want denied with a RetryAfter", denied)
	}
	at := window10s.Add(4 * time.Second)
	mr.SetTime(at.Add(denied.RetryAfter - time.Microsecond))
	if res := allow(t, l, "k", 1); res.Allowed {
		t.Fatalf("just before RetryAfter (%v): got %+v; want denied", denied.RetryAfter, res)
	}
	mr.SetTime(at.Add(denied.RetryAfter))
	if res := allow(t, l, "k", 1); !res.Allowed {
		t.Fatalf("at RetryAfter (%v): got %+v; want allowed", denied.RetryAfter, res)
	}
}
