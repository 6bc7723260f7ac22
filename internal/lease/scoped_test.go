package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/sluicekit/sluice/internal/lease"
)

// TestDoErrAnySentinel: DoErr applies its rule to whichever loss sentinel
// the primitive passes (mutex.ErrLost, semaphore.ErrLost): a loss found at
// the release counts, one the client declared after fn (expired, closed)
// does not, and another primitive's sentinel is just an error.
func TestDoErrAnySentinel(t *testing.T) {
	errLost := errors.New("x: lost")
	errOther := errors.New("y: lost")
	loss := func(cause error) error { return fmt.Errorf("%w: %w", errLost, cause) }
	found := loss(errors.New("found not held at release"))
	for _, c := range []struct {
		name        string
		during      error
		uerr        error
		lost, other bool
	}{
		{name: "found at release", uerr: found, lost: true},
		{name: "expired after fn", uerr: loss(lease.ErrExpired)},
		{name: "closed after fn", uerr: loss(lease.ErrClosed)},
		{name: "lost during fn", during: loss(lease.ErrExpired), uerr: found, lost: true},
		{name: "another sentinel", uerr: errOther, other: true},
	} {
		got := lease.DoErr(errLost, nil, c.during, c.uerr)
		if errors.Is(got, errLost) != c.lost || errors.Is(got, errOther) != c.other {
			t.Errorf("%s: DoErr = %v, want loss %v, other %v", c.name, got, c.lost, c.other)
		}
		if c.during != nil && errors.Is(got, c.uerr) {
			t.Errorf("%s: DoErr = %v, want the release's loss left out after the loss during fn", c.name, got)
		}
	}
}

// TestScopes: End cancels every live context with its cause; Add drops
// the contexts already done, so a long hold does not keep them all.
func TestScopes(t *testing.T) {
	var s lease.Scopes
	done, cancelDone := context.WithCancelCause(context.Background())
	s.Add(done, cancelDone)
	cancelDone(context.Canceled)
	live, cancelLive := context.WithCancelCause(context.Background())
	s.Add(live, cancelLive)
	if len(s) != 1 {
		t.Fatalf("after a done context and a live one: %d kept, want 1", len(s))
	}
	cause := errors.New("hold ended")
	s.End(cause)
	if got := context.Cause(live); got != cause || len(s) != 0 { //nolint:errorlint // the cause itself is what is checked
		t.Fatalf("after End: cause %v, %d kept; want %v and none", got, len(s), cause)
	}
}
