// Package errtext keeps error messages from naming their package twice.
//
// Each package's errors start with its name ("mutex: not held"). When one of
// them wraps another of the same package, fmt.Errorf("%w: %w", ErrNotHeld,
// lost) would read "mutex: not held: mutex: lock lost: ...". Inner drops the
// inner error's prefix from the text while errors.Is and errors.As still
// see the inner error, so the message reads "mutex: not held: lock lost:
// ...".
package errtext

import "strings"

// Inner returns err for wrapping inside another error of the package whose
// errors start with prefix ("mutex: "): an error that reads as err without
// that leading prefix, and unwraps to err. It returns err itself when its
// text does not start with prefix, and nil for nil.
func Inner(err error, prefix string) error {
	if err == nil {
		return nil
	}
	text := err.Error()
	if !strings.HasPrefix(text, prefix) {
		return err
	}
	return &inner{err: err, text: text[len(prefix):]}
}

type inner struct {
	err  error
	text string
}

func (e *inner) Error() string { return e.text }
func (e *inner) Unwrap() error { return e.err }
