//go:build !sluice_mutation

package lua

import "io/fs"

// scripts is the embedded scripts: the only source outside the mutation
// runner's test binaries.
func scripts() fs.FS { return files }
