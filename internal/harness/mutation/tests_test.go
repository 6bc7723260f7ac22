package main

import (
	"context"
	"os"
	"path/filepath"
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
