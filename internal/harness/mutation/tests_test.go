package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// fakeTestBinary stands for a package's test binary: it fails test A the
// first time it runs it and passes it after (a flaky test), passes B, and
// always fails C. Like a real binary under -test.failfast, a run stops at
// its first failure, and a run of A|B|C runs A first.
const fakeTestBinary = `#!/bin/sh
run=""
while [ $# -gt 0 ]; do
  case "$1" in -test.run) run="$2"; shift;; esac
  shift
done
case "$run" in *A*)
  if [ ! -e "$STATE/a-ran" ]; then
    : > "$STATE/a-ran"
    echo "--- FAIL: A (0.00s)"; echo "    x_test.go:1: by chance"; exit 1
  fi;;
esac
case "$run" in *C*) echo "--- FAIL: C (0.00s)"; echo "    x_test.go:2: the mutant"; exit 1;; esac
exit 0
`

// TestFlakyFailureRunsRestOfBatch: when a test fails and then passes
// alone (it failed by chance), the other tests of its batch still run.
// Before, the runner went on to the next batch: -test.failfast had
// stopped the batch at the chance failure, so the tests after it never
// ran, and a mutant only they kill counted as survived.
func TestFlakyFailureRunsRestOfBatch(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "pkg.test")
	if err := os.WriteFile(bin, []byte(fakeTestBinary), 0o755); err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "pkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &runner{tree: tree, timeoutScale: 4, batchSecs: 3}
	// One batch: A, B and C are fast tests of one package.
	sel := []*testInfo{{Pkg: "pkg", Name: "A", Secs: 0.1}, {Pkg: "pkg", Name: "B", Secs: 0.1}, {Pkg: "pkg", Name: "C", Secs: 0.1}}
	if n := len(batches(sel, r.batchSecs)); n != 1 {
		t.Fatalf("%d batches; the test needs A, B and C in one", n)
	}
	m := &Mutant{ID: "x"}
	r.killWithTests(context.Background(), m, sel, []string{"STATE=" + dir}, func(string) (string, error) { return bin, nil })
	if m.Status != statusKilled || m.By != "pkg.C" {
		t.Fatalf("status %q by %q (flaky %v); want killed by pkg.C", m.Status, m.By, m.Flaky)
	}
	if len(m.Flaky) != 1 || m.Flaky[0] != "pkg.A" {
		t.Errorf("flaky %v; want [pkg.A]", m.Flaky)
	}
}

// TestSelectTestsBudget: a Lua mutant runs every passing test that runs
// its script, fastest first, however long they take together (seed 10's
// budget of 90 s cut TestQueueScriptPaths, the one test that killed two
// of its survivors); a Go mutant's covering tests stop at the budget.
func TestSelectTestsBudget(t *testing.T) {
	goBlock := map[string][][4]int32{"pkg/x.go": {{10, 1, 20, 1}}}
	r := &runner{budget: 90, tests: &testMap{Tests: []*testInfo{
		{Pkg: "pkg", Name: "SlowClass", Secs: 28, Passed: true, Scripts: []string{"x"}, Blocks: goBlock},
		{Pkg: "pkg", Name: "Fast", Secs: 1, Passed: true, Scripts: []string{"w", "x"}, Blocks: goBlock},
		{Pkg: "pkg", Name: "Mid1", Secs: 40, Passed: true, Scripts: []string{"x"}, Blocks: goBlock},
		{Pkg: "pkg", Name: "Mid2", Secs: 40, Passed: true, Scripts: []string{"x"}, Blocks: goBlock},
		{Pkg: "pkg", Name: "Other", Secs: 1, Passed: true, Scripts: []string{"w"}},
		{Pkg: "pkg", Name: "Failing", Secs: 1, Passed: false, Scripts: []string{"x"}, Blocks: goBlock},
		{Pkg: "goredis", Name: "GoRedis", Secs: 1, Passed: true, Scripts: []string{"x"}},
	}}}
	names := func(sel []*testInfo) []string {
		var out []string
		for _, t := range sel {
			out = append(out, t.Name)
		}
		return out
	}
	lua := names(r.selectTests(&Mutant{Lang: "lua", File: "lua/x.lua"}))
	if want := []string{"Fast", "SlowClass", "Mid1", "Mid2"}; !slices.Equal(lua, want) {
		t.Errorf("Lua mutant selects %v; want %v (every passing test of its script, fastest first, past the budget)", lua, want)
	}
	gom := names(r.selectTests(&Mutant{Lang: "go", File: "pkg/x.go", Line: 15, Col: 3}))
	if want := []string{"Fast", "SlowClass", "Mid1"}; !slices.Equal(gom, want) {
		t.Errorf("Go mutant selects %v; want %v (the covering tests up to the first past 90 s)", gom, want)
	}
	r.budget = 0
	gom = names(r.selectTests(&Mutant{Lang: "go", File: "pkg/x.go", Line: 15, Col: 3}))
	if want := []string{"Fast", "SlowClass", "Mid1", "Mid2"}; !slices.Equal(gom, want) {
		t.Errorf("Go mutant, no budget, selects %v; want %v", gom, want)
	}
}
