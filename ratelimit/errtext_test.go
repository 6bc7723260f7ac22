package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// TestErrorText checks that representative errors, including those of
// the concurrency middleware that come from package semaphore, name each
// package once and wrap their sentinels.
func TestErrorText(t *testing.T) {
	ctx := context.Background()
	sc := newCache(t, redistest.Single(t).Addr())
	l := newLimiter(t, sc, Options{Algorithm: FixedWindow, Limit: PerMinute(2)})
	_, errLimit := New(sc, Options{Limit: Limit{Rate: 0, Period: time.Second}})
	_, errKey := l.Allow(ctx, "")
	_, errCost := l.AllowN(ctx, "k", 3)
	_, errMiddleware := NewMiddleware(l, MiddlewareOptions{Timeout: -1})
	// A Manager closed under the concurrency middleware: its error is
	// semaphore's, passed to OnError as it is.
	mgr := newManager(t)
	var got error
	mw, err := NewConcurrencyMiddleware(mgr, ConcurrencyOptions{Limit: 1, OnError: func(_ *http.Request, err error) { got = err }})
	if err != nil {
		t.Fatal(err)
	}
	mgr.Close()
	serve(mw(okHandler), request("192.0.2.30:1"))
	for _, tc := range []struct {
		err  error
		want string
		is   error
	}{
		{errLimit, "ratelimit: invalid limit: rate 0 is not between 1 and", ErrInvalidLimit},
		{errKey, "ratelimit: invalid key: name is empty", ErrInvalidKey},
		{errCost, "ratelimit: cost exceeds the limit: 3 > 2", ErrCostTooHigh},
		{errMiddleware, "ratelimit: invalid options: negative Timeout -1ns", ErrInvalidOptions},
		{got, "semaphore: manager closed", semaphore.ErrClosed},
	} {
		if tc.err == nil || !strings.HasPrefix(tc.err.Error(), tc.want) || !errors.Is(tc.err, tc.is) {
			t.Errorf("got %v; want an error starting %q wrapping %v", tc.err, tc.want, tc.is)
			continue
		}
		for _, p := range []string{"ratelimit: ", "semaphore: ", "scriptcache: "} {
			if n := strings.Count(tc.err.Error(), p); n > 1 {
				t.Errorf("%q names %q %d times; want once", tc.err, p, n)
			}
		}
	}
}
