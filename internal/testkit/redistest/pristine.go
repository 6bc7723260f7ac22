//go:build !sluice_mutation

package redistest

import (
	"io/fs"

	"github.com/sluicekit/sluice/lua"
)

// pristine is package lua's scripts, the ones MutatedScripts mutates.
func pristine() fs.FS { return lua.FS() }
