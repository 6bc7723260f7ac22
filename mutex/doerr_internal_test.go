package mutex

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sluicekit/sluice/internal/lease"
)

// TestDoErrRule: the rule every Do applies to the release's error. A loss
// the client declared on its own after fn returned (its lease ran out, its
// Locker closed) is left out; one found in Redis (by the release, a
// renewal, a nested Lock) is reported, as is any other release error; a
// loss during fn is reported once.
func TestDoErrRule(t *testing.T) {
	errWork := errors.New("work failed")
	loss := func(cause error) error {
		return fmt.Errorf("%w: %w", ErrNotHeld, fmt.Errorf("%w: %q: %w", ErrLost, "x", cause))
	}
	during := fmt.Errorf("%w: %q: %w", ErrLost, "x", lease.ErrExpired)
	conn := errors.New("connection reset")
	for _, c := range []struct {
		name         string
		err, during  error
		uerrs        []error
		want, absent []error
		same         bool // fn's error itself
	}{
		{name: "clean", err: errWork, same: true},
		{name: "expired after fn", err: errWork, uerrs: []error{loss(lease.ErrExpired)}, same: true},
		{name: "closed after fn", uerrs: []error{loss(lease.ErrClosed)}, absent: []error{ErrLost}},
		{name: "found at release", uerrs: []error{loss(errors.New("found not held at unlock"))}, want: []error{ErrLost}},
		{name: "found by renewal", uerrs: []error{loss(lease.ErrGone)}, want: []error{ErrLost}},
		{name: "found by nested lock", err: errWork, uerrs: []error{loss(errFoundNotHeld)}, want: []error{errWork, ErrLost}},
		{name: "release failed", err: errWork, uerrs: []error{conn}, want: []error{errWork, conn}, absent: []error{ErrLost}},
		{name: "lost during fn", during: during, uerrs: []error{loss(lease.ErrExpired)}, want: []error{ErrLost}, absent: []error{ErrNotHeld}},
		{name: "members", uerrs: []error{loss(lease.ErrExpired), loss(lease.ErrGone), conn}, want: []error{ErrLost, lease.ErrGone, conn}, absent: []error{lease.ErrExpired}},
		{name: "members after fn", uerrs: []error{loss(lease.ErrExpired), loss(lease.ErrClosed)}, absent: []error{ErrLost}},
	} {
		got := doErr(c.err, c.during, c.uerrs...)
		if c.same && got != c.err { //nolint:errorlint // fn's error itself, unwrapped, is what is checked
			t.Errorf("%s: doErr = %v, want fn's error itself", c.name, got)
		}
		for _, w := range c.want {
			if !errors.Is(got, w) {
				t.Errorf("%s: doErr = %v, want it to wrap %v", c.name, got, w)
			}
		}
		for _, a := range c.absent {
			if errors.Is(got, a) {
				t.Errorf("%s: doErr = %v, want it not to wrap %v", c.name, got, a)
			}
		}
	}
}
