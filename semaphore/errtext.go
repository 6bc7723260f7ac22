package semaphore

import "github.com/sluicekit/sluice/internal/errtext"

// inner readies err, which may be another error of this package, for
// wrapping in one: the message names the package once ("semaphore: permit
// not held: permit lost: ..."), and errors.Is still finds every sentinel.
func inner(err error) error { return errtext.Inner(err, "semaphore: ") }
