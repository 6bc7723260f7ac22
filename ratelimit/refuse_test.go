package ratelimit

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestStatusErrorRefuses checks both middlewares' answer to a KeyFunc (or
// PolicyFunc) that returns a *StatusError: the request gets that client
// error, the handler does not run, nothing reaches OnError or a Fallback,
// and nothing is counted; a StatusError that is not a client error is the
// KeyFunc's mistake, a 500 told to OnError; a request with a key is still
// limited.
func TestStatusErrorRefuses(t *testing.T) {
	srv := redistest.NewServer(t)
	sc := newCache(t, srv.Addr())
	noUser := &StatusError{Code: http.StatusUnauthorized, Message: "no X-User"}
	keyFunc := func(r *http.Request) (string, error) {
		switch u := r.Header.Get("X-User"); u {
		case "":
			return "", noUser
		case "teapot":
			return "", &StatusError{Code: http.StatusTeapot} // no Message
		case "wrapped":
			return "", errors.Join(errors.New("lookup"), &StatusError{Code: http.StatusBadRequest, Message: "bad user"})
		case "server":
			return "", &StatusError{Code: http.StatusServiceUnavailable, Message: "not a client error"}
		default:
			return "user:" + u, nil
		}
	}
	l := newLimiter(t, sc, Options{Algorithm: FixedWindow, Limit: PerMinute(1)})
	for _, mw := range []struct {
		name string
		h    func(errs *errRecorder, fallback Fallback) http.Handler
	}{
		{"rate", func(errs *errRecorder, fallback Fallback) http.Handler {
			mw, err := NewMiddleware(l, MiddlewareOptions{KeyFunc: keyFunc, OnError: errs.record, Fallback: fallback})
			if err != nil {
				t.Fatal(err)
			}
			return mw(okHandler)
		}},
		{"rate, PolicyFunc", func(errs *errRecorder, fallback Fallback) http.Handler {
			mw, err := NewMiddleware(l, MiddlewareOptions{
				KeyFunc: func(r *http.Request) (string, error) { return "one", nil },
				PolicyFunc: func(r *http.Request) (*Policies, error) {
					_, err := keyFunc(r)
					return nil, err
				},
				OnError: errs.record, Fallback: fallback})
			if err != nil {
				t.Fatal(err)
			}
			return mw(okHandler)
		}},
		{"concurrency", func(errs *errRecorder, _ Fallback) http.Handler {
			mw, err := NewConcurrencyMiddleware(newManager(t), ConcurrencyOptions{Limit: 1, KeyFunc: keyFunc, OnError: errs.record})
			if err != nil {
				t.Fatal(err)
			}
			return mw(okHandler)
		}},
	} {
		t.Run(mw.name, func(t *testing.T) {
			for _, c := range []struct {
				user     string
				code     int
				body     string
				reported bool
			}{
				{"", 401, "no X-User", false},
				{"teapot", 418, "I'm a teapot", false},
				{"wrapped", 400, "bad user", false},
				{"server", 500, "", true},
			} {
				for _, fallback := range []Fallback{FallbackOpen, FallbackLocal} {
					errs := &errRecorder{}
					resetStats(t, srv)
					w := serve(mw.h(errs, fallback), request("203.0.113.7:1", "X-User", c.user))
					if w.Code != c.code || !strings.Contains(w.Body.String(), c.body) {
						t.Errorf("X-User %q, %v: %d %q; want %d with %q", c.user, fallback, w.Code, w.Body.String(), c.code, c.body)
					}
					if got := len(errs.list()) > 0; got != c.reported {
						t.Errorf("X-User %q: OnError told %v; want told %v", c.user, errs.list(), c.reported)
					}
					if n := evalshaCalls(t, srv); n != 0 {
						t.Errorf("X-User %q: %d scripts ran for a refused request; want none", c.user, n)
					}
				}
			}
			// A request with a key is limited as before (Limit 1 per key:
			// the rate's second request is refused; the concurrency
			// middleware's requests do not overlap, so both pass).
			errs := &errRecorder{}
			h := mw.h(errs, FallbackOpen)
			if w := serve(h, request("203.0.113.7:1", "X-User", "ann")); w.Code != 200 {
				t.Errorf("first request of ann: %d, want 200 (%v)", w.Code, errs.list())
			}
		})
	}
}
