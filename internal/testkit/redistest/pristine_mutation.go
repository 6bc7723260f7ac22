//go:build sluice_mutation

package redistest

import (
	"io/fs"

	"github.com/sluicekit/sluice/lua"
)

// pristine is the embedded scripts, not the mutation runner's: a test's
// own mutant must start from the real script, whatever mutant the runner
// put in lua.FS.
func pristine() fs.FS { return lua.Embedded() }
