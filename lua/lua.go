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

// FS is the read-only file system of all scripts, named NAME.lua.
var FS fs.FS = files
