// Command mutation is sluice's mutation runner: it makes mutants nobody
// chose of the Lua scripts (its own generator, lua.go) and of the runtime
// Go (listed by gremlins), runs each against the fastest tests that can
// kill it, sends the unit tests' survivors to the chaos harness, and
// writes a markdown report with the scores.
//
//	cd internal/harness && go run ./mutation                   # everything
//	cd internal/harness && go run ./mutation -set lua -sample 10 -seed 1
//
// It never touches the work tree: it copies the tree's tracked files to a
// scratch directory and builds there. Lua mutants need no rebuild: test
// binaries built with -tags sluice_mutation read the scripts from
// SLUICE_MUTATION_LUA_DIR. Each test of the test packages is first run
// alone once (cached per tree content) to learn its time, the scripts it
// runs and the lines it covers; a mutant then runs only the tests that
// reach it, fastest first, with -test.failfast and a timeout scaled from
// their time (a timeout counts as killed). Mutants listed in
// equivalent.txt are left out of the scores.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// Statuses of a mutant.
const (
	statusKilled     = "killed"
	statusTimeout    = "timed out"
	statusSurvived   = "survived"
	statusEquivalent = "equivalent"
	statusNotViable  = "not viable"
)

// A Mutant is one small change of one file.
type Mutant struct {
	ID         string // file:linekey:col:operator (see lineKeys): stable while the line's text is
	Lang       string // lua or go
	File       string // relative to the repository
	Line, Col  int
	Op         string
	Start, End int // byte range replaced
	Orig, Repl string

	Status string
	By     string // the test (package.Test) or harness run that killed it
	How    string
	Tests  int      // tests selected
	Flaky  []string // tests that failed once and passed on the confirming run
	Secs   float64
	// Harness is the chaos harness's verdict on a unit-test survivor
	// ("" if not run), HarnessBy its first violation.
	Harness, HarnessBy string
	// Alone is the verdict of the harness with probes off, for the
	// sampled Lua mutants ("" if not sampled).
	Alone, AloneBy string
	Equiv          string // reason, if listed as equivalent
	Src            string // the original line, trimmed
	Fallback       bool   // Go: no test covers it; its package's tests that run its file ran
}

func (m *Mutant) killed() bool { return m.Status == statusKilled || m.Status == statusTimeout }

type runner struct {
	root, work, tree, cacheDir string
	par                        int
	timeoutScale, batchSecs    float64
	budget                     float64 // seconds of measured test time per Go mutant (a Lua mutant has none: selectTests)
	harnessPar                 int
	aloneBaseline              string // the unmutated tree's harness run, probes off
	mapFile                    string // -map: the test map to use (and write)
	tests                      *testMap
	mapTook                    time.Duration
	logMu                      sync.Mutex
	chaosBin                   string
	hash                       string // the tree's content
	journal                    *os.File
	journalMu                  sync.Mutex
}

// A journalEntry is one mutant's verdict of the unit tests, appended as
// it comes to a file per tree content: an interrupted run (-resume)
// picks up where it stopped.
type journalEntry struct {
	ID, Status, By, How string
	Tests               int
	Secs                float64
	Flaky               []string
}

func (r *runner) openJournal(resume bool, ms []*Mutant) error {
	path := filepath.Join(r.cacheDir, "results-"+r.hash+".jsonl")
	if resume {
		if b, err := os.ReadFile(path); err == nil {
			byID := map[string]*Mutant{}
			for _, m := range ms {
				byID[m.ID] = m
			}
			n := 0
			for _, l := range strings.Split(string(b), "\n") {
				var e journalEntry
				if json.Unmarshal([]byte(l), &e) != nil {
					continue
				}
				if m := byID[e.ID]; m != nil && m.Status == "" {
					m.Status, m.By, m.How, m.Tests, m.Secs, m.Flaky = e.Status, e.By, e.How, e.Tests, e.Secs, e.Flaky
					n++
				}
			}
			r.logf("resumed %d verdicts from %s", n, path)
		}
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	r.journal = f
	return err
}

func (r *runner) record(m *Mutant) {
	if r.journal == nil || m.Status == "" {
		return
	}
	b, _ := json.Marshal(journalEntry{m.ID, m.Status, m.By, m.How, m.Tests, m.Secs, m.Flaky})
	r.journalMu.Lock()
	defer r.journalMu.Unlock()
	_, _ = r.journal.Write(append(b, '\n'))
}

func (r *runner) logf(format string, args ...any) {
	r.logMu.Lock()
	defer r.logMu.Unlock()
	fmt.Fprintf(os.Stderr, "[%s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func main() {
	set := flag.String("set", "lua,go", "which mutants: lua, go or both (comma-separated)")
	pkgFlag := flag.String("pkg", "", "only mutants whose file path contains one of these (comma-separated; e.g. lua/mutex_,scriptcache)")
	testPkgFlag := flag.String("test-pkgs", "", "run only these packages' tests (comma-separated directories; default: every mutated package's)")
	only := flag.String("id", "", "only the mutants with these ids (comma-separated)")
	sample := flag.Int("sample", 0, "run a seeded random sample of this many mutants of each set (0: all)")
	goSample := flag.Int("go-sample", -1, "the sample size of the Go set, if not -sample's")
	seed := flag.Uint64("seed", 1, "seed of the samples")
	par := flag.Int("par", 1, "mutants run at once (the machine is shared: 1 or 2)")
	harness := flag.Bool("harness", true, "send the unit tests' survivors to the chaos harness (single server, seed 1; and the cluster for cluster code)")
	alone := flag.Int("alone", 0, "also run this many sampled Lua mutants through the harness alone, probes off, for the harness-alone score (-1: all)")
	report := flag.String("report", "", "write the markdown report here (default: print it)")
	equivFile := flag.String("equivalent", "", "the equivalent mutants' file (default: equivalent.txt beside this command's source)")
	work := flag.String("work", "", "scratch directory (default: a new temporary one, removed at the end)")
	cache := flag.String("cache", "", "directory of the per-tree test maps (default: the user cache directory)")
	scale := flag.Float64("timeout-scale", 4, "a batch's timeout: this many times its tests' measured time, plus 20 s")
	batch := flag.Float64("batch", 3, "seconds of tests run in one binary start at most (a slower test runs alone)")
	resume := flag.Bool("resume", false, "reuse the unit-test verdicts an earlier run of this tree recorded (the harness phases run again)")
	harnessPar := flag.Int("harness-par", 1, "harness runs at once (its oracle allows for a loaded machine, not for two runs sharing two cores: keep 1)")
	budget := flag.Float64("budget", 90, "seconds of measured test time a Go mutant's selected tests may take, fastest first (0: no limit); a Lua mutant runs every test that runs its script")
	minScore := flag.Float64("min-score", 0, "exit with status 3 if a set's score (killed / (viable - equivalent)) is below this fraction")
	units := flag.Bool("units", true, "run the unit tests on the mutants (false: only the harness phases asked for, e.g. -alone)")
	mapFlag := flag.String("map", "", "use (or write) this test map file instead of the per-tree cache (a map of another tree is only as good as its tests are the same)")
	list := flag.Bool("list", false, "list the mutants (after -set, -pkg, -sample) and exit")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	root, err := gitRoot()
	check(err)
	commit := gitHead(root)
	r := &runner{root: root, par: max(*par, 1), timeoutScale: *scale, batchSecs: *batch, budget: *budget, harnessPar: max(*harnessPar, 1), mapFile: *mapFlag}
	if *work == "" {
		r.work, err = os.MkdirTemp("", "sluice-mutation-")
		check(err)
		defer os.RemoveAll(r.work)
	} else {
		r.work = *work
		check(os.MkdirAll(r.work, 0o755))
	}
	r.cacheDir = *cache
	if r.cacheDir == "" {
		d, err := os.UserCacheDir()
		check(err)
		r.cacheDir = filepath.Join(d, "sluice-mutation")
	}
	r.tree = filepath.Join(r.work, "tree")
	check(copyTree(root, r.tree))
	if *equivFile == "" {
		*equivFile = filepath.Join(root, "internal", "harness", "mutation", "equivalent.txt")
	}
	equiv, err := readEquivalents(*equivFile)
	check(err)

	sets := map[string]bool{}
	for _, s := range strings.Split(*set, ",") {
		sets[strings.TrimSpace(s)] = true
	}
	var luaMs, goMs []*Mutant
	if sets["lua"] {
		luaMs, err = allLuaMutants(r.tree)
		check(err)
	}
	if sets["go"] {
		bin, err := gremlinsBinary(filepath.Join(r.work, "bin"))
		check(err)
		pkgs := goPackages
		if *pkgFlag != "" {
			// Ask gremlins only about the packages -pkg can match.
			pkgs = nil
			for _, p := range goPackages {
				for _, f := range strings.Split(*pkgFlag, ",") {
					if f != "" && (strings.Contains(p, f) || strings.Contains(f, p)) {
						pkgs = append(pkgs, p)
						break
					}
				}
			}
		}
		goMs, err = goMutants(r.tree, bin, r.work, pkgs)
		check(err)
	}
	generated := map[string]int{"lua": len(luaMs), "go": len(goMs)}
	filter := func(ms []*Mutant, sample int) []*Mutant {
		var out []*Mutant
		ids := map[string]bool{}
		for _, id := range strings.Split(*only, ",") {
			if id != "" {
				ids[id] = true
			}
		}
		for _, m := range ms {
			if len(ids) > 0 && !ids[m.ID] {
				continue
			}
			if *pkgFlag != "" {
				hit := false
				for _, p := range strings.Split(*pkgFlag, ",") {
					hit = hit || (p != "" && strings.Contains(m.File, p))
				}
				if !hit {
					continue
				}
			}
			out = append(out, m)
		}
		if sample > 0 && sample < len(out) {
			rng := rand.New(rand.NewPCG(*seed, uint64(len(out))))
			rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
			out = out[:sample]
			sort.SliceStable(out, func(i, j int) bool { return out[i].ID < out[j].ID })
		}
		return out
	}
	if *goSample < 0 {
		*goSample = *sample
	}
	luaMs, goMs = filter(luaMs, *sample), filter(goMs, *goSample)
	if *list {
		for _, m := range append(luaMs, goMs...) {
			fmt.Printf("%s\t%q -> %q\n", m.ID, m.Orig, m.Repl)
		}
		return
	}
	all := append(append([]*Mutant{}, luaMs...), goMs...)
	for _, m := range all {
		if line, err := r.srcLine(m); err == nil {
			m.Src = strings.TrimSpace(line)
		}
		if reason, ok := equiv[m.ID]; ok {
			m.Status, m.Equiv = statusEquivalent, reason
		}
	}
	r.logf("%d Lua and %d Go mutants to run (of %d and %d generated); scratch %s", len(luaMs), len(goMs), generated["lua"], generated["go"], r.work)

	// The test packages: every mutated Go package's, which between them
	// reach every script.
	testPkgs := goPackages
	if *testPkgFlag != "" {
		testPkgs = strings.Split(*testPkgFlag, ",")
	}
	r.logf("building %d test binaries (tagged, with coverage)", len(testPkgs))
	for _, pkg := range testPkgs {
		if out, err := buildTest(ctx, r.tree, pkg, r.coverBin(pkg), true); err != nil {
			check(fmt.Errorf("building %s: %w\n%s", pkg, err, out))
		}
	}
	r.tests, err = r.mapTests(ctx, testPkgs)
	check(err)
	if *harness || *alone != 0 {
		r.chaosBin = filepath.Join(r.work, "bin", "chaos.test")
		if out, err := buildChaos(ctx, r.tree, r.chaosBin); err != nil {
			check(fmt.Errorf("building the harness: %w\n%s", err, out))
		}
	}

	check(r.openJournal(*resume, all))
	luaStart := time.Now()
	if len(luaMs) > 0 {
		check(r.luaViable(luaMs))
		if *units {
			r.runAll(ctx, luaMs, r.runLua)
		}
	}
	luaTook := time.Since(luaStart)
	goStart := time.Now()
	if len(goMs) > 0 && *units {
		r.runAll(ctx, goMs, r.runGo)
	}
	goTook := time.Since(goStart)
	harnessStart := time.Now()
	if *harness {
		r.harnessSurvivors(ctx, all)
	}
	harnessTook := time.Since(harnessStart)
	aloneStart := time.Now()
	var aloneSample []*Mutant
	if *alone != 0 && len(luaMs) > 0 {
		aloneSample = r.harnessAlone(ctx, luaMs, *alone, *seed)
	}
	aloneTook := time.Since(aloneStart)

	rep := &reportData{
		Command:   "cd internal/harness && go run ./mutation " + strings.Join(os.Args[1:], " "),
		Commit:    commit,
		Started:   start,
		Took:      time.Since(start),
		MapTook:   r.mapTook,
		Phases:    map[string]time.Duration{"lua": luaTook, "go": goTook, "harness": harnessTook, "alone": aloneTook},
		Lua:       luaMs,
		Go:        goMs,
		Generated: generated,
		Alone:     aloneSample,
		Sampled:   [2]int{*sample, *goSample},
		Budget:    *budget,
		Baseline:  r.aloneBaseline,
		Seed:      *seed,
		Tests:     len(r.tests.Tests),
		TestPkgs:  testPkgs,
	}
	text := rep.markdown()
	if *report == "" {
		fmt.Print(text)
	} else {
		check(os.WriteFile(*report, []byte(text), 0o644))
		r.logf("report written to %s", *report)
	}
	if ctx.Err() != nil {
		os.Exit(1)
	}
	low := false
	for name, ms := range map[string][]*Mutant{"Lua": luaMs, "Go": goMs} {
		s := scoreOf(ms)
		if *minScore > 0 && s.denom() > 0 && float64(s.killed) < *minScore*float64(s.denom()) {
			r.logf("%s score %d/%d is below -min-score %.2f", name, s.killed, s.denom(), *minScore)
			low = true
		}
	}
	if low {
		os.Exit(3)
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutation:", err)
		os.Exit(2)
	}
}

func gitRoot() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	return strings.TrimSpace(string(out)), err
}

func gitHead(root string) string {
	out, _ := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	dirty, _ := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output()
	s := strings.TrimSpace(string(out))
	if len(strings.TrimSpace(string(dirty))) > 0 {
		s += " (with uncommitted changes)"
	}
	return s
}

// copyTree copies the tracked files of the work tree at root (as they are
// on disk) to dst, and adds mutation.work: a workspace of the core and
// goredis only, for gremlins.
func copyTree(root, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	cmd := exec.Command("sh", "-c", "git ls-files -z | tar --null -T - -cf - | tar -xf - -C "+shellQuote(dst))
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("copying the tree: %w\n%s", err, out)
	}
	work := "go 1.26.0\n\nuse (\n\t.\n\t./goredis\n)\n\nreplace (\n\tgithub.com/sluicekit/sluice v0.1.0 => ./\n\tgithub.com/sluicekit/sluice/goredis v0.1.0 => ./goredis\n)\n"
	return os.WriteFile(filepath.Join(dst, "mutation.work"), []byte(work), 0o644)
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// readEquivalents reads "ID reason" lines ('#' starts a comment).
func readEquivalents(path string) (map[string]string, error) {
	m := map[string]string{}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		id, reason, _ := strings.Cut(l, " ")
		m[id] = strings.TrimSpace(reason)
	}
	return m, sc.Err()
}

func buildChaos(ctx context.Context, tree, out string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "nice", "-n", "10", "go", "test", "-c", "-tags", "sluice_mutation", "-o", out, "./chaos")
	cmd.Dir = filepath.Join(tree, "internal", "harness")
	return cmd.CombinedOutput()
}

// runAll runs fn on each mutant not already decided, r.par at a time;
// worker k owns scratch k.
func (r *runner) runAll(ctx context.Context, ms []*Mutant, fn func(ctx context.Context, k int, m *Mutant)) {
	ch := make(chan *Mutant)
	var wg sync.WaitGroup
	var done sync.Mutex
	n := 0
	for k := range r.par {
		wg.Go(func() {
			for m := range ch {
				t0 := time.Now()
				fn(ctx, k, m)
				m.Secs = time.Since(t0).Seconds()
				if ctx.Err() == nil {
					r.record(m)
				}
				done.Lock()
				n++
				r.logf("%d/%d %s %s %s (%.0fs, %d tests)", n, len(ms), m.ID, m.Status, m.By, m.Secs, m.Tests)
				done.Unlock()
			}
		})
	}
	for _, m := range ms {
		if m.Status != "" || ctx.Err() != nil {
			continue
		}
		ch <- m
	}
	close(ch)
	wg.Wait()
}

// luaViable marks the Lua mutants Redis refuses to load (a syntax error)
// as not viable, and the ones that change nothing.
func (r *runner) luaViable(ms []*Mutant) error {
	s, err := redistest.StartServer()
	if err != nil {
		return err
	}
	defer s.Stop()
	for _, m := range ms {
		if m.Status != "" {
			continue
		}
		if m.Orig == m.Repl {
			m.Status, m.By = statusNotViable, "changes nothing"
			continue
		}
		body, err := r.mutated(m)
		if err != nil {
			return err
		}
		if _, err := s.Do("SCRIPT", "LOAD", body); err != nil {
			m.Status, m.By = statusNotViable, "Redis refuses to load it: "+clip(err.Error(), 100)
		}
	}
	_, _ = s.Do("SCRIPT", "FLUSH")
	return nil
}

// mutated returns m's file with m applied.
func (r *runner) mutated(m *Mutant) (string, error) {
	b, err := os.ReadFile(filepath.Join(r.tree, m.File))
	if err != nil {
		return "", err
	}
	src := string(b)
	if src[m.Start:m.End] != m.Orig {
		return "", fmt.Errorf("%s: the tree changed under the mutant (%q, want %q)", m.ID, src[m.Start:m.End], m.Orig)
	}
	return src[:m.Start] + m.Repl + src[m.End:], nil
}

// luaDir writes worker k's script directory: every script, m applied.
func (r *runner) luaDir(k int, m *Mutant) (string, error) {
	dir := filepath.Join(r.work, fmt.Sprintf("lua%d", k))
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	files, err := filepath.Glob(filepath.Join(r.tree, "lua", "*.lua"))
	if err != nil {
		return "", err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		if "lua/"+filepath.Base(f) == m.File {
			s, err := r.mutated(m)
			if err != nil {
				return "", err
			}
			b = []byte(s)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

func (r *runner) runLua(ctx context.Context, k int, m *Mutant) {
	dir, err := r.luaDir(k, m)
	if err != nil {
		m.Status, m.By = statusNotViable, err.Error()
		return
	}
	sel := r.selectTests(m)
	r.killWithTests(ctx, m, sel, []string{"SLUICE_MUTATION_LUA_DIR=" + dir}, func(pkg string) (string, error) {
		return r.coverBin(pkg), nil
	})
}

// goTree returns worker k's copy of the tree for Go mutants.
func (r *runner) goTree(k int) (string, error) {
	dir := filepath.Join(r.work, fmt.Sprintf("gotree%d", k))
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	return dir, copyTree(r.root, dir)
}

// applyGo writes m into worker k's tree and returns the function that
// restores the file.
func (r *runner) applyGo(k int, m *Mutant) (string, func(), error) {
	tree, err := r.goTree(k)
	if err != nil {
		return "", nil, err
	}
	body, err := r.mutated(m)
	if err != nil {
		return "", nil, err
	}
	path := filepath.Join(tree, m.File)
	orig, err := os.ReadFile(path)
	if err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		return "", nil, err
	}
	return tree, func() { _ = os.WriteFile(path, orig, 0o644) }, nil
}

func (r *runner) runGo(ctx context.Context, k int, m *Mutant) {
	sel := r.selectTests(m)
	if len(sel) == 0 {
		m.Status, m.By = statusSurvived, "no test reaches it"
		return
	}
	tree, restore, err := r.applyGo(k, m)
	if err != nil {
		m.Status, m.By = statusNotViable, err.Error()
		return
	}
	defer restore()
	built := map[string]string{}
	r.killWithTests(ctx, m, sel, nil, func(pkg string) (string, error) {
		if p, ok := built[pkg]; ok {
			return p, nil
		}
		out := filepath.Join(r.work, fmt.Sprintf("gobin%d", k), strings.ReplaceAll(pkg, "/", "_")+".test")
		if b, err := buildTest(ctx, tree, pkg, out, false); err != nil {
			return "", fmt.Errorf("does not build: %s", lastLines(b, 1))
		}
		built[pkg] = out
		return out, nil
	})
}

// clusterCode reports whether a mutant sits in code only a cluster runs:
// a script's choice of SPUBLISH; Go that only tests with Cluster in their
// name reach, or the slot arithmetic.
func (r *runner) clusterCode(m *Mutant) bool {
	if m.Lang == "lua" {
		// A script's cluster-only code is its choice of SPUBLISH.
		line, _ := r.srcLine(m)
		return strings.Contains(line, "SPUBLISH") || strings.Contains(line, "== 's'")
	}
	if strings.HasPrefix(m.File, "internal/keyspace/") {
		return true
	}
	sel := r.selectTests(m)
	if len(sel) == 0 {
		return false
	}
	for _, t := range sel {
		if !strings.Contains(strings.ToLower(t.Name), "cluster") {
			return false
		}
	}
	return true
}

// srcLine returns the line of the tree's file that m changes.
func (r *runner) srcLine(m *Mutant) (string, error) {
	b, err := os.ReadFile(filepath.Join(r.tree, m.File))
	if err != nil {
		return "", err
	}
	lines := strings.Split(string(b), "\n")
	if m.Line < 1 || m.Line > len(lines) {
		return "", fmt.Errorf("%s: no line %d", m.File, m.Line)
	}
	return lines[m.Line-1], nil
}

// harnessSurvivors runs the chaos harness (seed 1, probes on) on every
// unit-test survivor: the single server, and the cluster for cluster code.
func (r *runner) harnessSurvivors(ctx context.Context, all []*Mutant) {
	var surv []*Mutant
	for _, m := range all {
		if m.Status == statusSurvived {
			surv = append(surv, m)
		}
	}
	r.logf("harness: %d survivors of the unit tests", len(surv))
	r.runAll2(ctx, surv, func(ctx context.Context, k int, m *Mutant) {
		env, bin, cleanup, err := r.harnessFor(ctx, k, m)
		if err != nil {
			m.Harness, m.HarnessBy = "error", err.Error()
			return
		}
		defer cleanup()
		variants := []string{"single"}
		if r.clusterCode(m) {
			variants = append(variants, "cluster")
		}
		m.Harness = statusSurvived
		for _, v := range variants {
			caught, how := r.chaos(ctx, bin, v, 1, true, env)
			if how == interrupted {
				m.Harness = ""
				return
			}
			if caught {
				m.Harness, m.HarnessBy = statusKilled, "chaos "+v+" seed 1: "+how
				m.Status, m.By, m.How = statusKilled, "harness ("+v+", seed 1)", how
				return
			}
		}
	})
}

// harnessFor prepares a harness run of m: its environment and binary.
func (r *runner) harnessFor(ctx context.Context, k int, m *Mutant) (env []string, bin string, cleanup func(), err error) {
	if m.Lang == "lua" {
		dir, err := r.luaDir(k, m)
		return []string{"SLUICE_MUTATION_LUA_DIR=" + dir}, r.chaosBin, func() {}, err
	}
	tree, restore, err := r.applyGo(k, m)
	if err != nil {
		return nil, "", nil, err
	}
	bin = filepath.Join(r.work, fmt.Sprintf("gobin%d", k), "chaos.test")
	if out, err := buildChaos(ctx, tree, bin); err != nil {
		restore()
		return nil, "", nil, fmt.Errorf("harness does not build: %s", lastLines(out, 1))
	}
	return nil, bin, restore, nil
}

// harnessAlone runs a seeded sample of n viable, non-equivalent Lua
// mutants (all if n < 0) through the harness alone with its probes off.
func (r *runner) harnessAlone(ctx context.Context, ms []*Mutant, n int, seed uint64) []*Mutant {
	var pool []*Mutant
	for _, m := range ms {
		if m.Status != statusNotViable && m.Status != statusEquivalent {
			pool = append(pool, m)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0xa10e))
	rng.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
	if n >= 0 && n < len(pool) {
		pool = pool[:n]
	}
	sort.SliceStable(pool, func(i, j int) bool { return pool[i].ID < pool[j].ID })
	// The unmutated tree first: a run that fails without a mutant makes
	// the sample's catches worthless.
	if caught, how := r.chaos(ctx, r.chaosBin, "single", 1, false, nil); how == interrupted {
		return nil
	} else if caught {
		r.aloneBaseline = "FAILED on the unmutated tree: " + how
	} else {
		r.aloneBaseline = "passed on the unmutated tree"
	}
	r.logf("harness alone, baseline: %s", r.aloneBaseline)
	r.logf("harness alone (probes off): %d Lua mutants", len(pool))
	r.runAll2(ctx, pool, func(ctx context.Context, k int, m *Mutant) {
		dir, err := r.luaDir(k, m)
		if err != nil {
			m.Alone = "error"
			return
		}
		caught, how := r.chaos(ctx, r.chaosBin, "single", 1, false, []string{"SLUICE_MUTATION_LUA_DIR=" + dir})
		if how == interrupted {
			return
		}
		m.Alone, m.AloneBy = statusSurvived, ""
		if caught {
			m.Alone, m.AloneBy = statusKilled, how
		}
	})
	return pool
}

// runAll2 is runAll for the harness phases, which set their own fields.
func (r *runner) runAll2(ctx context.Context, ms []*Mutant, fn func(ctx context.Context, k int, m *Mutant)) {
	ch := make(chan *Mutant)
	var wg sync.WaitGroup
	var mu sync.Mutex
	n := 0
	for k := range r.harnessPar {
		wg.Go(func() {
			for m := range ch {
				t0 := time.Now()
				fn(ctx, k, m)
				mu.Lock()
				n++
				r.logf("harness %d/%d %s %s%s %s (%.0fs)", n, len(ms), m.ID, m.Harness, m.Alone, clip(m.HarnessBy+m.AloneBy, 100), time.Since(t0).Seconds())
				mu.Unlock()
			}
		})
	}
	for _, m := range ms {
		if ctx.Err() != nil {
			break
		}
		ch <- m
	}
	close(ch)
	wg.Wait()
}

// wilson is the 95% Wilson score interval of k successes in n.
func wilson(k, n int) (lo, hi float64) {
	if n == 0 {
		return 0, 1
	}
	z := 1.96
	p := float64(k) / float64(n)
	d := 1 + z*z/float64(n)
	c := (p + z*z/(2*float64(n))) / d
	w := z * math.Sqrt(p*(1-p)/float64(n)+z*z/(4*float64(n)*float64(n))) / d
	return math.Max(0, c-w), math.Min(1, c+w)
}
