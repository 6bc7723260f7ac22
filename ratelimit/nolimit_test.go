package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestLimiterWithoutLimit checks a Limiter made without a Limit of its own,
// for Policies sets only: what needs its own Limit is refused with
// ErrNoLimit (at construction where it can be: a middleware without a
// PolicyFunc), never sent to Redis and never taken for an outage, and what
// needs only the sets works.
func TestLimiterWithoutLimit(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	ctx := context.Background()
	if _, err := New(sc, Options{Algorithm: FixedWindow, Prefix: testPrefix(t)}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("New with an Algorithm and no Limit: %v, want ErrInvalidOptions", err)
	}
	l := newLimiter(t, sc, Options{})
	gold, err := NewPolicies(Policy{Name: "gold", Algorithm: FixedWindow, Limit: PerMinute(1)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx, "k"); !errors.Is(err, ErrNoLimit) || Unavailable(err) {
		t.Fatalf("Allow: %v, want ErrNoLimit (and no outage)", err)
	}
	if err := l.Reset(ctx, "k"); !errors.Is(err, ErrNoLimit) {
		t.Fatalf("Reset without sets: %v, want ErrNoLimit", err)
	}
	for i, want := range []bool{true, false} {
		d, err := l.AllowPolicies(ctx, "k", 1, gold)
		if err != nil || d.Allowed != want {
			t.Fatalf("AllowPolicies %d: %+v, %v; want allowed %v", i+1, d, err, want)
		}
	}
	if err := l.Reset(ctx, "k", gold); err != nil {
		t.Fatalf("Reset with the set: %v", err)
	}
	if d, err := l.AllowPolicies(ctx, "k", 1, gold); err != nil || !d.Allowed {
		t.Fatalf("AllowPolicies after Reset: %+v, %v; want allowed", d, err)
	}

	if _, err := NewMiddleware(l, MiddlewareOptions{}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("NewMiddleware without a PolicyFunc: %v, want ErrInvalidOptions", err)
	}
	errs := &errRecorder{}
	mw, err := NewMiddleware(l, MiddlewareOptions{
		KeyFunc: func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil },
		PolicyFunc: func(r *http.Request) (*Policies, error) {
			if r.Header.Get("X-Plan") == "gold" {
				return gold, nil
			}
			return nil, nil // a mistake: this Limiter has no Limit of its own
		},
		OnError: errs.record,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(okHandler)
	for i, want := range []int{200, 429} {
		if w := serve(h, request("203.0.113.7:1", "X-User", "ann", "X-Plan", "gold")); w.Code != want {
			t.Fatalf("gold request %d: %d, want %d", i+1, w.Code, want)
		}
	}
	// Fail-open is for outages: a missing limit is a 500, told to OnError.
	if w := serve(h, request("203.0.113.7:1", "X-User", "bob")); w.Code != http.StatusInternalServerError {
		t.Fatalf("request without a set: %d, want 500", w.Code)
	}
	if es := errs.list(); len(es) != 1 || !errors.Is(es[0], ErrNoLimit) {
		t.Fatalf("OnError told %v, want one ErrNoLimit", es)
	}

	c, err := NewChecker(l, CheckerOptions{FallbackLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Check(ctx, "k", nil); !errors.Is(err, ErrNoLimit) {
		t.Fatalf("Check without a set: %v, want ErrNoLimit", err)
	}
}
