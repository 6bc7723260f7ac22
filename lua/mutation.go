//go:build sluice_mutation

package lua

import (
	"io/fs"
	"os"
)

// DirEnv names the directory a mutation test binary reads the scripts from
// (every NAME.lua, one of them mutated); unset, the embedded ones.
const DirEnv = "SLUICE_MUTATION_LUA_DIR"

// scripts is, in a mutation test binary only, the directory DirEnv names:
// the runner writes one mutant's scripts there and reruns the binary it
// built once, instead of building one per mutant.
func scripts() fs.FS {
	if dir := os.Getenv(DirEnv); dir != "" {
		return os.DirFS(dir)
	}
	return files
}

// Embedded returns the embedded scripts whatever DirEnv says: tests that
// mutate a script on purpose (redistest.MutatedScripts) start from the
// real one.
func Embedded() fs.FS { return files }
