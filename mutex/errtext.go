package mutex

import "github.com/sluicekit/sluice/internal/errtext"

// inner readies err, which may be another error of this package, for
// wrapping in one: the message names the package once ("mutex: not held:
// lock lost: ..."), and errors.Is still finds every sentinel.
func inner(err error) error { return errtext.Inner(err, "mutex: ") }
