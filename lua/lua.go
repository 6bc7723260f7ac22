// Package lua holds every Redis script sluice runs, one script per .lua file.
//
// Each file opens with a comment block that states what the script does, its
// KEYS and ARGV, what it returns and its time complexity. Scripts read time
// from Redis (TIME), never from the client, and take user data only through
// KEYS and ARGV. Package scriptcache loads them by file name without the
// .lua extension.
package lua

import (
	"embed"
	"io/fs"
)

//go:embed *.lua
var files embed.FS

// FS returns the read-only file system of all scripts, named NAME.lua. It
// is a function, not a variable, so that no importer can swap the scripts
// every other importer runs.
//
// Test binaries built with the build tag sluice_mutation (the mutation
// runner's, internal/harness/mutation) read the scripts from the directory
// named by SLUICE_MUTATION_LUA_DIR instead, when it is set; no other build
// contains that switch (mutation.go).
func FS() fs.FS { return scripts() }
