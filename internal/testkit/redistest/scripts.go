package redistest

import (
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
)

// MutatedScripts returns package lua's scripts with, in the script named
// script, each pair's old text replaced by its new text, for a mutant that
// a check must catch (pass it to scriptcache.WithFS). Each old text must
// occur exactly once, or t fails: a change to a script must not silently
// turn a mutant into the real thing.
func MutatedScripts(t testing.TB, script string, oldNew ...string) fs.FS {
	t.Helper()
	if len(oldNew)%2 != 0 {
		t.Fatalf("MutatedScripts: %d texts, want old/new pairs", len(oldNew))
	}
	files := fstest.MapFS{}
	entries, err := fs.ReadDir(pristine(), ".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := fs.ReadFile(pristine(), e.Name())
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == script+".lua" {
			for i := 0; i < len(oldNew); i += 2 {
				if n := strings.Count(string(b), oldNew[i]); n != 1 {
					t.Fatalf("mutant of %s: %q occurs %d times, want once; update the mutant", e.Name(), oldNew[i], n)
				}
				b = []byte(strings.Replace(string(b), oldNew[i], oldNew[i+1], 1))
			}
		}
		files[e.Name()] = &fstest.MapFile{Data: b}
	}
	if _, ok := files[script+".lua"]; !ok {
		t.Fatalf("mutant: no script %s", script)
	}
	return files
}

// FewestAllocs is the fewest allocations per call of f over five runs of
// testing.AllocsPerRun. AllocsPerRun counts the whole process's
// allocations, other goroutines' too (a client's, a watchdog's, earlier
// tests' stragglers), which can only add: the fewest of several runs is
// f's own.
func FewestAllocs(f func()) float64 {
	best := testing.AllocsPerRun(200, f)
	for range 4 {
		best = min(best, testing.AllocsPerRun(200, f))
	}
	return best
}
