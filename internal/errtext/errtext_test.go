package errtext

import (
	"errors"
	"fmt"
	"io"
	"testing"
)

func TestInner(t *testing.T) {
	errLost := errors.New("p: lost")
	errNotHeld := errors.New("p: not held")
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: %w", errNotHeld, Inner(fmt.Errorf("%w: %q: %w", errLost, "p: a", io.EOF), "p: ")), `p: not held: lost: "p: a": EOF`},
		{fmt.Errorf("%w: %w", errNotHeld, Inner(io.EOF, "p: ")), "p: not held: EOF"},
		{fmt.Errorf("p: x: %w", Inner(errLost, "p: ")), "p: x: lost"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("got %q; want %q", got, tc.want)
		}
		if !errors.Is(tc.err, errNotHeld) && !errors.Is(tc.err, errLost) {
			t.Errorf("%q: errors.Is false for the sentinels", tc.err)
		}
	}
	if err := fmt.Errorf("%w: %w", errNotHeld, Inner(errLost, "p: ")); !errors.Is(err, errLost) || !errors.Is(err, errNotHeld) {
		t.Errorf("errors.Is lost through Inner: %v", err)
	}
	if Inner(nil, "p: ") != nil {
		t.Error("Inner(nil) != nil")
	}
	if err := Inner(io.EOF, "p: "); err != io.EOF { //nolint:errorlint // the error itself, unwrapped, is what is checked
		t.Errorf("Inner of an error without the prefix: %#v; want it unchanged", err)
	}
}
