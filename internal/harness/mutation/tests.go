package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

const modulePath = "github.com/sluicekit/sluice/"

// A testInfo is what the mapping run learnt of one top-level test, run
// alone once on the tree as it is.
type testInfo struct {
	Pkg     string                `json:"pkg"`
	Name    string                `json:"name"`
	Secs    float64               `json:"secs"`
	Passed  bool                  `json:"passed"`
	Scripts []string              `json:"scripts"` // script names it ran
	Blocks  map[string][][4]int32 `json:"blocks"`  // file -> covered blocks (start line, col, end line, col)
}

// testMap is every test of the test packages, per package.
type testMap struct {
	Tests []*testInfo `json:"tests"`
}

// pkgDir is the directory a test package's binary runs in, and the
// module directory its build runs in.
func pkgDirs(tree, pkg string) (run, build, target string) {
	if pkg == "goredis" {
		return filepath.Join(tree, "goredis"), filepath.Join(tree, "goredis"), "."
	}
	return filepath.Join(tree, pkg), tree, "./" + pkg
}

// buildTest compiles pkg's test binary from tree into out (tagged, so
// that it reads the scripts from SLUICE_MUTATION_LUA_DIR), with
// coverage of every mutated package when cover is set.
func buildTest(ctx context.Context, tree, pkg, out string, cover bool) ([]byte, error) {
	_, dir, target := pkgDirs(tree, pkg)
	args := []string{"test", "-c", "-tags", "sluice_mutation", "-o", out}
	if cover {
		var cp []string
		for _, p := range goPackages {
			cp = append(cp, modulePath+p)
		}
		args = append(args, "-cover", "-coverpkg", strings.Join(cp, ","))
	}
	args = append(args, target)
	cmd := exec.CommandContext(ctx, "nice", append([]string{"-n", "10", "go"}, args...)...)
	cmd.Dir = dir
	return cmd.CombinedOutput()
}

// treeHash identifies the tree's content, for the mapping cache.
func treeHash(tree string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(tree, p)
		if strings.HasPrefix(filepath.ToSlash(rel), "internal/harness/mutation/") {
			return nil // the runner itself: its changes do not change a test
		}
		ext := filepath.Ext(p)
		if ext != ".go" && ext != ".lua" && ext != ".mod" && ext != ".sum" && ext != ".work" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))[:16], err
}

// listTests lists a binary's top-level tests, examples and fuzz targets.
func listTests(bin, dir string) ([]string, error) {
	cmd := exec.Command(bin, "-test.list", ".")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s -test.list: %w", bin, err)
	}
	var names []string
	for _, l := range strings.Fields(string(out)) {
		if strings.HasPrefix(l, "Test") || strings.HasPrefix(l, "Example") || strings.HasPrefix(l, "Fuzz") {
			names = append(names, l)
		}
	}
	return names, nil
}

// mapTests runs every test of pkgs alone once, with coverage and the
// script trace, on par goroutines. The result is cached by tree content.
func (r *runner) mapTests(ctx context.Context, pkgs []string) (*testMap, error) {
	hash, err := treeHash(r.tree)
	if err != nil {
		return nil, err
	}
	r.hash = hash
	cacheDir := r.cacheDir
	cache := filepath.Join(cacheDir, "map-"+hash+"-"+strings.ReplaceAll(strings.Join(pkgs, "+"), "/", "_")+".json")
	if r.mapFile != "" {
		cache = r.mapFile
	}
	if b, err := os.ReadFile(cache); err == nil {
		var m testMap
		if json.Unmarshal(b, &m) == nil {
			r.logf("test map: cached %s (%d tests)", cache, len(m.Tests))
			return &m, nil
		}
	}
	start := time.Now()
	m := &testMap{}
	type job struct {
		pkg, name string
	}
	var jobs []job
	for _, pkg := range pkgs {
		bin := r.coverBin(pkg)
		run, _, _ := pkgDirs(r.tree, pkg)
		names, err := listTests(bin, run)
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			jobs = append(jobs, job{pkg, n})
		}
	}
	r.logf("test map: running %d tests one by one (once per tree)", len(jobs))
	var mu sync.Mutex
	ch := make(chan job)
	var wg sync.WaitGroup
	for range r.par {
		wg.Go(func() {
			for j := range ch {
				ti, err := r.mapOne(ctx, j.pkg, j.name)
				if err != nil {
					r.logf("map %s %s: %v", j.pkg, j.name, err)
					continue
				}
				mu.Lock()
				m.Tests = append(m.Tests, ti)
				if len(m.Tests)%25 == 0 {
					r.logf("test map: %d/%d (%s)", len(m.Tests), len(jobs), time.Since(start).Round(time.Second))
				}
				mu.Unlock()
			}
		})
	}
	for _, j := range jobs {
		ch <- j
	}
	close(ch)
	wg.Wait()
	sort.Slice(m.Tests, func(i, j int) bool {
		return m.Tests[i].Pkg+" "+m.Tests[i].Name < m.Tests[j].Pkg+" "+m.Tests[j].Name
	})
	r.mapTook = time.Since(start)
	if err := os.MkdirAll(cacheDir, 0o755); err == nil {
		if b, err := json.Marshal(m); err == nil {
			_ = os.WriteFile(cache, b, 0o644)
		}
	}
	return m, ctx.Err()
}

func (r *runner) coverBin(pkg string) string {
	return filepath.Join(r.work, "bin", strings.ReplaceAll(pkg, "/", "_")+".cover.test")
}

func (r *runner) mapOne(ctx context.Context, pkg, name string) (*testInfo, error) {
	dir := filepath.Join(r.work, "map", strings.ReplaceAll(pkg, "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	trace := filepath.Join(dir, name+".trace")
	cov := filepath.Join(dir, name+".cov")
	_ = os.Remove(trace)
	run, _, _ := pkgDirs(r.tree, pkg)
	t0 := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, "nice", "-n", "10", r.coverBin(pkg), "-test.run", "^"+name+"$", "-test.count=1",
		"-test.coverprofile="+cov, "-test.timeout=8m")
	cmd.Dir = run
	cmd.Env = append(os.Environ(), "SLUICE_REQUIRE_REDIS=1", "SLUICE_MUTATION_TRACE="+trace)
	out, err := cmd.CombinedOutput()
	ti := &testInfo{Pkg: pkg, Name: name, Secs: time.Since(t0).Seconds(), Passed: err == nil, Blocks: map[string][][4]int32{}}
	if err != nil {
		r.logf("baseline: %s %s fails alone on the unmutated tree (left out of every selection): %s", pkg, name, lastLines(out, 3))
	}
	if b, err := os.ReadFile(trace); err == nil {
		ti.Scripts = strings.Fields(string(b))
		sort.Strings(ti.Scripts)
	}
	if f, err := os.Open(cov); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// github.com/sluicekit/sluice/mutex/mutex.go:12.3,14.5 2 1
			l := sc.Text()
			colon := strings.LastIndex(l, ":")
			if colon < 0 || !strings.HasPrefix(l, modulePath) {
				continue
			}
			f := strings.TrimPrefix(l[:colon], modulePath)
			var sl, sc2, el, ec, n, cnt int
			if _, err := fmt.Sscanf(l[colon+1:], "%d.%d,%d.%d %d %d", &sl, &sc2, &el, &ec, &n, &cnt); err != nil || cnt == 0 {
				continue
			}
			ti.Blocks[f] = append(ti.Blocks[f], [4]int32{int32(sl), int32(sc2), int32(el), int32(ec)})
		}
		f.Close()
	}
	return ti, nil
}

func lastLines(b []byte, n int) string {
	ls := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, " | ")
}

// covers reports whether a test's coverage reaches file:line:col.
func (t *testInfo) covers(file string, line, col int) bool {
	for _, b := range t.Blocks[file] {
		sl, sc, el, ec := int(b[0]), int(b[1]), int(b[2]), int(b[3])
		if (line > sl || line == sl && col >= sc) && (line < el || line == el && col <= ec) {
			return true
		}
	}
	return false
}

// coversFile reports whether the test runs any statement of file.
func (t *testInfo) coversFile(file string) bool { return len(t.Blocks[file]) > 0 }

// selectTests returns the tests that can see m, fastest first: for a
// Lua mutant all of them, for a Go mutant those within the budget.
func (r *runner) selectTests(m *Mutant) []*testInfo {
	var sel []*testInfo
	for _, t := range r.tests.Tests {
		if !t.Passed {
			continue
		}
		if m.Lang == "lua" {
			if t.Pkg == "goredis" {
				// The same scripts through go-redis: scriptcache's
				// TestRueidisClient runs that suite on rueidis.
				continue
			}
			name := strings.TrimSuffix(filepath.Base(m.File), ".lua")
			for _, s := range t.Scripts {
				if s == name {
					sel = append(sel, t)
					break
				}
			}
		} else if t.covers(m.File, m.Line, m.Col) {
			sel = append(sel, t)
		}
	}
	if len(sel) == 0 && m.Lang == "go" {
		// Coverage sees statements only: a constant, a declaration or an
		// array length no test "covers" is still compiled into every test
		// of its package, which then runs them all (within the budget).
		pkg := filepath.ToSlash(filepath.Dir(m.File))
		for _, t := range r.tests.Tests {
			if t.Passed && t.Pkg == pkg && t.coversFile(m.File) {
				sel = append(sel, t)
			}
		}
		m.Fallback = len(sel) > 0
	}
	sort.SliceStable(sel, func(i, j int) bool { return sel[i].Secs < sel[j].Secs })
	if m.Lang == "lua" {
		// Every test a Lua mutant selects runs its script, and the ones
		// a budget would cut are the slowest: often the script's own
		// class test, which walks each of its paths (seed 10 counted
		// two mutants survived that TestQueueScriptPaths, cut at 90 s,
		// kills). A killed mutant stops at its first failure, so only a
		// survivor pays for the whole list (see budget in main.go).
		return sel
	}
	// Past the budget of measured test time, a Go mutant's slowest tests
	// are left out: the harness sees what survives.
	sum := 0.0
	for i, t := range sel {
		sum += t.Secs
		if r.budget > 0 && sum > r.budget && i > 0 {
			return sel[:i]
		}
	}
	return sel
}

// batches groups tests, fastest first, into runs of one binary: each
// batch is one package's tests taking at most about batchSecs together
// (a slower test runs alone), so that a mutant a fast test kills costs
// one short run.
func batches(sel []*testInfo, batchSecs float64) [][]*testInfo {
	var out [][]*testInfo
	used := make([]bool, len(sel))
	for i, t := range sel {
		if used[i] {
			continue
		}
		used[i] = true
		b := []*testInfo{t}
		sum := t.Secs
		for j := i + 1; j < len(sel); j++ {
			if !used[j] && sel[j].Pkg == t.Pkg && sum+sel[j].Secs <= max(batchSecs, 2*t.Secs) {
				used[j] = true
				b = append(b, sel[j])
				sum += sel[j].Secs
			}
		}
		out = append(out, b)
	}
	return out
}

var (
	failRe    = regexp.MustCompile(`(?m)^--- FAIL: (\S+)`)
	timeoutRe = regexp.MustCompile(`(?m)^panic: test timed out after`)
	runningRe = regexp.MustCompile(`(?m)^\s*running tests:\s*\n\s+(\S+)`)
)

// outcome of one batch run.
type outcome struct {
	interrupted bool // the run was stopped (SIGINT): no verdict
	failed      bool
	timeout     bool
	test        string // the failing test, if one is named
	how         string
}

// runBatch runs one batch of tests of a binary; env adds the mutant's
// settings.
func (r *runner) runBatch(ctx context.Context, bin string, b []*testInfo, env []string) outcome {
	return r.runBatchScaled(ctx, bin, b, env, r.timeoutScale)
}

// runBatchScaled is runBatch with the timeout scaled by scale.
func (r *runner) runBatchScaled(ctx context.Context, bin string, b []*testInfo, env []string, scale float64) outcome {
	var names []string
	sum := 0.0
	for _, t := range b {
		names = append(names, regexp.QuoteMeta(t.Name))
		sum += t.Secs
	}
	timeout := time.Duration(scale*sum*float64(time.Second)) + 20*time.Second
	run, _, _ := pkgDirs(r.tree, b[0].Pkg)
	cctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, "nice", "-n", "10", bin, "-test.run", "^("+strings.Join(names, "|")+")$",
		"-test.count=1", "-test.failfast", "-test.timeout="+timeout.String())
	cmd.Dir = run
	cmd.Env = append(append(os.Environ(), "SLUICE_REQUIRE_REDIS=1"), env...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return outcome{interrupted: true}
	}
	if err == nil {
		return outcome{}
	}
	o := outcome{failed: true}
	if timeoutRe.Match(out) || cctx.Err() != nil {
		o.timeout = true
		if m := runningRe.FindSubmatch(out); m != nil {
			o.test = string(m[1])
		}
		o.how = "timed out after " + timeout.String()
		return o
	}
	if m := failRe.FindSubmatch(out); m != nil {
		o.test = string(m[1])
	}
	o.how = firstReason(out)
	return o
}

// firstReason picks a line that says why a run failed.
func firstReason(out []byte) string {
	for _, l := range strings.Split(string(out), "\n") {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "goleak:") || strings.HasPrefix(t, "panic:") {
			return clip(t, 160)
		}
		if strings.Contains(l, "_test.go:") || strings.HasPrefix(t, "at ") {
			return clip(t, 160)
		}
	}
	return clip(lastLines(out, 1), 160)
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// killWithTests runs the mutant's selected tests, batch by batch, and
// records the first failure. bin gives the binary of a package (built on
// demand for a Go mutant; nil means the package's binary does not build).
// A failure is confirmed by running the failing test alone once more: a
// test that passes then failed by chance, and the rest of its batch runs
// again (-test.failfast stopped it at the failure) before the next
// batches.
func (r *runner) killWithTests(ctx context.Context, m *Mutant, sel []*testInfo, env []string, bin func(pkg string) (string, error)) {
	m.Tests = len(sel)
	if len(sel) == 0 {
		m.Status, m.By = statusSurvived, "no test reaches it"
		return
	}
	queue := batches(sel, r.batchSecs)
	for len(queue) > 0 {
		b := queue[0]
		queue = queue[1:]
		if ctx.Err() != nil {
			return
		}
		// again puts the tests of b other than the one that failed by
		// chance back at the head of the queue: the failure stopped b
		// before they ran, or while they did.
		again := func(flaky string) {
			if rest := without(b, flaky); len(rest) > 0 {
				queue = append([][]*testInfo{rest}, queue...)
			}
		}
		path, err := bin(b[0].Pkg)
		if err != nil {
			m.Status, m.By = statusNotViable, clip(err.Error(), 160)
			return
		}
		o := r.runBatch(ctx, path, b, env)
		if o.interrupted {
			return
		}
		if !o.failed {
			continue
		}
		if o.timeout && o.test != "" {
			// A loaded machine can stretch a test past its timeout: the
			// test alone, with twice the time, must time out (or fail)
			// again.
			var one []*testInfo
			for _, t := range b {
				if t.Name == o.test {
					one = append(one, t)
				}
			}
			if len(one) == 1 {
				retry := r.runBatchScaled(ctx, path, one, env, 2*r.timeoutScale)
				if retry.interrupted {
					return
				}
				if !retry.failed {
					m.Flaky = append(m.Flaky, b[0].Pkg+"."+o.test+" (timed out once)")
					again(o.test)
					continue
				}
				o = retry
			}
		}
		if o.timeout {
			who := o.test
			if who == "" {
				who = "(one of " + strconv.Itoa(len(b)) + " tests from " + b[0].Name + ")"
			}
			m.Status, m.By, m.How = statusTimeout, b[0].Pkg+"."+who, o.how
			return
		}
		if o.test != "" && !strings.Contains(o.how, "goleak") {
			var one []*testInfo
			for _, t := range b {
				if t.Name == o.test {
					one = append(one, t)
				}
			}
			if len(one) == 1 {
				if retry := r.runBatch(ctx, path, one, env); retry.interrupted {
					return
				} else if !retry.failed {
					m.Flaky = append(m.Flaky, b[0].Pkg+"."+o.test)
					again(o.test)
					continue
				}
			}
		}
		who := o.test
		if who == "" {
			who = "(" + strings.SplitN(o.how, ":", 2)[0] + ")"
		}
		m.Status, m.By, m.How = statusKilled, b[0].Pkg+"."+who, o.how
		return
	}
	if ctx.Err() == nil {
		m.Status, m.By = statusSurvived, ""
	}
}

// without returns the tests of b but the one named name.
func without(b []*testInfo, name string) []*testInfo {
	var out []*testInfo
	for _, t := range b {
		if t.Name != name {
			out = append(out, t)
		}
	}
	return out
}

// interrupted is chaos's how when the run was stopped: no verdict.
const interrupted = "interrupted"

// chaos runs the harness's short run of one seed on the variant (single
// or cluster), probes on or off, with the mutant's environment. It
// reports whether the run failed (a violation, a panic, goleak) and how.
func (r *runner) chaos(ctx context.Context, bin string, variant string, seed int, probes bool, env []string) (bool, string) {
	cctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, "nice", "-n", "10", bin, "-test.run", "TestChaos/"+variant+"$", "-test.count=1", "-test.timeout=3m")
	cmd.Dir = filepath.Join(r.tree, "internal", "harness", "chaos")
	cmd.Env = append(append(os.Environ(), "SLUICE_REQUIRE_REDIS=1", "SLUICE_CHAOS_SEED="+strconv.Itoa(seed)), env...)
	if !probes {
		cmd.Env = append(cmd.Env, "SLUICE_CHAOS_PROBES=off")
	}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return false, interrupted
	}
	if err == nil {
		return false, ""
	}
	for _, l := range strings.Split(string(out), "\n") {
		if t := strings.TrimSpace(l); strings.HasPrefix(t, "at ") && strings.Contains(t, "s: ") {
			return true, clip(t, 160)
		}
	}
	if bytes.Contains(out, []byte("panic: test timed out")) {
		return true, "timed out"
	}
	return true, firstReason(out)
}
