package linearizability

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/rueidis"
	"golang.org/x/sys/unix"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// NewCache returns a script cache, built with opts, on a new client of the
// server at addrs (one address) or of the Redis Cluster whose nodes are at
// addrs (several). The client must be closed when t ends (t.Cleanup). It
// is called in the helper processes, once per process: the primitives
// under test run on that client.
type NewCache func(t testing.TB, addrs []string, opts ...scriptcache.Option) *scriptcache.Cache

// Run records the histories of the real primitives (mutex, semaphore and
// every rate-limit algorithm) on one server and on a 3-master cluster, the
// primitives running on clients made by newCache, and checks each history
// with porcupine. The subtests are mutex/single, mutex/cluster,
// semaphore/single and so on.
//
// The operations are made by helper processes that re-execute the test
// binary, running only the test that called Run; in them Run is the
// helper's body and returns at once to the test. So:
//
//   - call Run first thing in a test function (or a subtest of one), with
//     nothing costly before it: in the helpers that test runs too;
//   - the package needs redistest.Main as its TestMain (the helpers check
//     for leaked goroutines as the tests do).
//
// Test-side instruments (the counter read and written in the critical
// section, the round trip that holds a permit) run on a rueidis client of
// their own, whatever the client under test.
func Run(t *testing.T, newCache NewCache) {
	s, helper := begin(t, newCache)
	if helper {
		return
	}
	sc := histScale()
	n := sc.procs * sc.goroutines * sc.ops
	t.Run("mutex", func(t *testing.T) {
		for _, tg := range targets {
			t.Run(tg.name, func(t *testing.T) {
				hists := s.runHelpers(t, config{Role: "mutex", Addrs: tg.addrs(t), Name: uniqueName(t)}, sc)
				wantLinearizable(t, "lock", lockModel, hists[histLock], 2*n)
				wantLinearizable(t, "counter", counterModel, hists[histCounter], n)
			})
		}
	})
	t.Run("semaphore", func(t *testing.T) {
		for _, tg := range targets {
			t.Run(tg.name, func(t *testing.T) {
				hists := s.runHelpers(t, config{Role: "semaphore", Addrs: tg.addrs(t), Name: uniqueName(t), Capacity: semCapacity}, sc)
				wantLinearizable(t, "semaphore", semaphoreModel(semCapacity), hists[histSemaphore], 2*n)
			})
		}
	})
	t.Run("ratelimit", func(t *testing.T) {
		limit := limiterLimit(sc)
		for _, tg := range targets {
			t.Run(tg.name, func(t *testing.T) {
				hists := s.runHelpers(t, config{
					Role: "ratelimit", Addrs: tg.addrs(t), Name: uniqueName(t),
					Limit: limit, PeriodMs: limiterPeriod().Milliseconds(),
				}, sc)
				for _, ls := range limiterSetups {
					wantLinearizable(t, ls.hist, limiterModel(int64(limit)), hists[ls.hist], n)
				}
			})
		}
	})
}

// suite starts the helper processes of one test: run is the -test.run
// pattern that selects, in the test binary, the test (or subtest) that
// called begin, and nothing else.
type suite struct{ run string }

// begin is the start of every test that records histories. In a helper
// process (helperEnv is set) it runs the helper's body, with the primitives
// on caches made by newCache, and reports true: the caller returns. In the
// parent it returns the suite that starts helpers running the calling test.
func begin(t *testing.T, newCache NewCache) (s suite, helper bool) {
	if raw := os.Getenv(helperEnv); raw != "" {
		helperProcess(t, raw, newCache)
		return suite{}, true
	}
	parts := strings.Split(t.Name(), "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return suite{run: strings.Join(parts, "/")}, false
}

// target is a Redis deployment the histories are recorded against.
type target struct {
	name  string
	addrs func(t *testing.T) []string
}

var targets = []target{
	{"single", func(t *testing.T) []string { return []string{redistest.Single(t).Addr()} }},
	{"cluster", func(t *testing.T) []string { return redistest.SharedCluster(t).Addrs() }},
}

// scale is the size of one recorded history.
type scale struct {
	procs, goroutines, ops int
}

// defaultScale keeps a run quick on a small CI machine: 12 clients in 3
// processes, 360 critical sections (or acquisitions, or requests) per
// history.
var defaultScale = scale{procs: 3, goroutines: 4, ops: 30}

// histScale is the size of the real primitives' histories: SLUICE_LONG=1
// records bigger, more contended ones (32 clients in 4 processes, 2560).
func histScale() scale {
	if os.Getenv("SLUICE_LONG") == "1" {
		return scale{procs: 4, goroutines: 8, ops: 80}
	}
	return defaultScale
}

// brokenScale is the size of the broken implementations' histories, the
// default one even with SLUICE_LONG=1: they only have to show that the
// checker catches them, and proving a history illegal means ruling out every
// order of its operations, which grows exponentially with the number of
// clients that run at once (32 clients made the broken limiter's check run
// past a minute).
var brokenScale = defaultScale

// now reads CLOCK_MONOTONIC in nanoseconds. Unlike time.Now's monotonic
// reading, which is private to a process, this clock is one for every
// process on the machine, so the call and return times the helpers record
// can be compared with each other. It never steps, unlike the wall clock.
func now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// record is one completed operation, as a helper prints it (one JSON line).
type record struct {
	// Hist names the history the operation belongs to (one run can record
	// several, such as the lock and the counter it protects).
	Hist   string `json:"h"`
	Client int    `json:"c"`
	Op     string `json:"op"`
	// Val is the operation's number: a fencing token, a weight, the value
	// read, a cost.
	Val int64 `json:"v"`
	// OK is a rate limiter's decision.
	OK   bool  `json:"ok,omitempty"`
	Call int64 `json:"call"`
	Ret  int64 `json:"ret"`
}

// recorder collects one client's (goroutine's) operations. A client runs one
// operation at a time, which porcupine requires of a client id.
type recorder struct {
	client int
	recs   []record
}

// do times fn as operation op of history hist. fn returns the operation's
// number and decision.
func (r *recorder) do(hist, op string, fn func() (int64, bool)) {
	call := now()
	v, ok := fn()
	r.recs = append(r.recs, record{Hist: hist, Client: r.client, Op: op, Val: v, OK: ok, Call: call, Ret: now()})
}

// config is what the parent tells a helper process, as JSON in helperEnv.
type config struct {
	Role       string   `json:"role"`
	Addrs      []string `json:"addrs"`
	Name       string   `json:"name"` // key or lock name, unique per run
	Proc       int      `json:"proc"`
	Goroutines int      `json:"goroutines"`
	Ops        int      `json:"ops"`
	Capacity   int64    `json:"capacity,omitempty"` // semaphore
	Limit      int      `json:"limit,omitempty"`    // rate limiter
	PeriodMs   int64    `json:"period_ms,omitempty"`
	Mutant     string   `json:"mutant,omitempty"` // see mutants
}

const helperEnv = "SLUICE_LINEARIZABILITY_HELPER"

// proc is what a role gets in its helper process.
type proc struct {
	cfg config
	// c is the instruments' client (the critical section's counter, the
	// round trip that holds a permit), rueidis whatever the client under
	// test. The broken implementations run on it too.
	c        rueidis.Client
	newCache NewCache
}

// cache returns the script cache the primitives under test run on: on a
// client made by newCache, with the scripts cacheOptions gives for
// cfg.Mutant.
func (p proc) cache(t *testing.T) *scriptcache.Cache {
	return p.newCache(t, p.cfg.Addrs, cacheOptions(t, p.cfg)...)
}

// cacheOptions returns the options of the script cache of a helper with
// cfg: none, unless the mutants (in the package's own tests) replace it to
// load mutated scripts.
var cacheOptions = func(t *testing.T, cfg config) []scriptcache.Option {
	if cfg.Mutant != "" {
		t.Fatalf("mutant %q: this test binary has no mutants", cfg.Mutant)
	}
	return nil
}

// A role is the body of a helper process. It sets up what its goroutines
// share, then calls start, which waits for the parent's go, runs worker in
// cfg.Goroutines goroutines and returns their records. Everything a role
// opens must be closed by the time the helper's test ends (t.Cleanup is
// fine): the helper's own TestMain runs goleak. Workers report errors with
// t.Error (not Fatal: they are not the test goroutine) and stop.
type role func(t *testing.T, p proc, start func(worker func(r *recorder)) []record) []record

// roles are the helper process bodies, by config.Role: the real primitives
// here; the package's own tests add the broken implementations.
var roles = map[string]role{
	"mutex":     mutexRole,
	"semaphore": semaphoreRole,
	"ratelimit": ratelimitRole,
}

// helperProcess is the body of a helper process: it runs the role that raw
// (the JSON config from the parent) names and prints its records.
func helperProcess(t *testing.T, raw string, newCache NewCache) {
	var cfg config
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatal(err)
	}
	role := roles[cfg.Role]
	if role == nil {
		t.Fatalf("unknown role %q", cfg.Role)
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: cfg.Addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	start := func(worker func(r *recorder)) []record {
		// Tell the parent we are set up, and wait until every helper is: a
		// history is only interesting where the processes overlap.
		fmt.Println("ready")
		if line, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil || line != "go\n" {
			t.Fatalf("waiting for go: %q, %v", line, err)
		}
		recs := make([]*recorder, cfg.Goroutines)
		var wg sync.WaitGroup
		for g := range recs {
			recs[g] = &recorder{client: cfg.Proc*cfg.Goroutines + g}
			wg.Go(func() { worker(recs[g]) })
		}
		wg.Wait()
		var all []record
		for _, r := range recs {
			all = append(all, r.recs...)
		}
		return all
	}
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for _, rec := range role(t, proc{cfg: cfg, c: client, newCache: newCache}, start) {
		if err := enc.Encode(rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := out.Flush(); err != nil {
		t.Fatal(err)
	}
}

// helperTimeout bounds a run of helpers, so that a hang fails the test with
// the helpers' output instead of the whole binary timing out.
const helperTimeout = 90 * time.Second

// overlapTries is how many runs of helpers runHelpers makes to get one in
// which they all ran at once. The helpers start on a "go" the parent sends
// to each in turn; on a loaded machine one of them may not get a core until
// the others have finished a short run (the broken limiter's takes about
// 50 ms), and its history would show no contention.
const overlapTries = 3

// runHelpers runs sc.procs helper processes of role cfg.Role against addrs,
// starts them together, and returns the merged records by history name. A
// run in which some helper finished before another started proves little;
// it is repeated, on fresh keys, up to overlapTries times in all.
func (s suite) runHelpers(t *testing.T, cfg config, sc scale) map[string][]record {
	t.Helper()
	name := cfg.Name
	for try := 1; ; try++ {
		if try > 1 {
			cfg.Name = fmt.Sprintf("%s:try%d", name, try)
		}
		hists := s.runHelpersOnce(t, cfg, sc)
		first, last := overlap(hists, sc)
		if slices.Max(first) < slices.Min(last) {
			return hists
		}
		if try == overlapTries {
			t.Fatalf("in %d runs the helpers never all ran at once (last run: first calls %v, last returns %v)", try, first, last)
		}
		t.Logf("run %d: the helpers did not all run at once (first calls %v, last returns %v); running again", try, first, last)
	}
}

// runHelpersOnce is one run of runHelpers.
func (s suite) runHelpersOnce(t *testing.T, cfg config, sc scale) map[string][]record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), helperTimeout)
	defer cancel()
	cfg.Goroutines, cfg.Ops = sc.goroutines, sc.ops
	type helper struct {
		cmd   *exec.Cmd
		in    io.WriteCloser
		out   *bufio.Scanner
		noise []string // lines that are not records, shown on failure
	}
	helpers := make([]*helper, sc.procs)
	defer func() {
		for _, h := range helpers {
			if h != nil && h.cmd.ProcessState == nil {
				_ = h.cmd.Process.Kill() // cleanup of a helper process
				_ = h.cmd.Wait()
			}
		}
	}()
	for i := range helpers {
		c := cfg
		c.Proc = i
		raw, _ := json.Marshal(c)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+s.run, "-test.count=1",
			"-test.timeout="+helperTimeout.String())
		cmd.Env = append(os.Environ(), helperEnv+"="+string(raw))
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		h := &helper{cmd: cmd, in: in, out: bufio.NewScanner(out)}
		h.out.Buffer(nil, 1<<20)
		helpers[i] = h
	}
	fail := func(i int, what string) {
		h := helpers[i]
		for h.out.Scan() {
			h.noise = append(h.noise, h.out.Text())
		}
		err := h.cmd.Wait()
		t.Fatalf("helper %d (%s) %s: %v\n%s", i, cfg.Role, what, err, strings.Join(h.noise, "\n"))
	}
	for i, h := range helpers {
		ready := false
		for !ready && h.out.Scan() {
			ready = h.out.Text() == "ready"
			if !ready {
				h.noise = append(h.noise, h.out.Text())
			}
		}
		if !ready {
			fail(i, "exited before it was ready")
		}
	}
	for i, h := range helpers {
		if _, err := io.WriteString(h.in, "go\n"); err != nil {
			fail(i, "did not take go")
		}
		h.in.Close()
	}
	hists := map[string][]record{}
	for i, h := range helpers {
		for h.out.Scan() {
			line := h.out.Bytes()
			if len(line) == 0 || line[0] != '{' {
				h.noise = append(h.noise, string(line))
				continue
			}
			var rec record
			if err := json.Unmarshal(line, &rec); err != nil {
				t.Fatalf("helper %d: bad record %q: %v", i, line, err)
			}
			hists[rec.Hist] = append(hists[rec.Hist], rec)
		}
		if err := h.cmd.Wait(); err != nil {
			t.Fatalf("helper %d (%s): %v\n%s", i, cfg.Role, err, strings.Join(h.noise, "\n"))
		}
	}
	return hists
}

// overlap returns, per helper, its first call and its last return. The
// helpers all ran at once if the latest first call came before the
// earliest last return.
func overlap(hists map[string][]record, sc scale) (first, last []int64) {
	first = make([]int64, sc.procs)
	last = make([]int64, sc.procs)
	for _, recs := range hists {
		for _, r := range recs {
			p := r.Client / sc.goroutines
			if first[p] == 0 || r.Call < first[p] {
				first[p] = r.Call
			}
			last[p] = max(last[p], r.Ret)
		}
	}
	return first, last
}

// uniqueName returns a key or lock name no earlier run has used, so every
// history starts from a fresh state in Redis.
func uniqueName(t *testing.T) string {
	return "lin:" + strings.ReplaceAll(t.Name(), "/", ":") + ":" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// operations turns records into porcupine's form; the record is the input
// and the models read everything from it.
func operations(recs []record) []porcupine.Operation {
	ops := make([]porcupine.Operation, len(recs))
	for i, r := range recs {
		ops[i] = porcupine.Operation{ClientId: r.Client, Input: r, Call: r.Call, Output: nil, Return: r.Ret}
	}
	return ops
}

// checkTimeout bounds one porcupine check. The histories here are checked in
// milliseconds; reaching it means something pathological, and Unknown is
// treated as a failure.
const checkTimeout = 60 * time.Second

// wantLinearizable fails t unless porcupine finds the history linearizable.
// On failure it writes porcupine's visualization (an HTML page showing the
// longest linearizable prefixes) next to the system's temp files and logs
// where.
func wantLinearizable(t *testing.T, what string, model porcupine.Model, recs []record, want int) {
	t.Helper()
	checkCount(t, what, recs, want)
	begin := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, operations(recs), checkTimeout)
	t.Logf("%s: %d operations over %v, checked in %v: %s", what, len(recs), span(recs), time.Since(begin), res)
	if res == porcupine.Ok {
		return
	}
	where := "(no visualization)"
	if f, err := os.CreateTemp("", "sluice-linearizability-*.html"); err == nil {
		if porcupine.Visualize(model, info, f) == nil {
			where = f.Name()
		}
		f.Close()
	}
	t.Errorf("%s: history of %d operations is %s, want %s; visualization: %s", what, len(recs), res, porcupine.Ok, where)
}

// wantIllegal fails t unless porcupine proves the history not linearizable.
func wantIllegal(t *testing.T, what string, model porcupine.Model, recs []record, want int) {
	t.Helper()
	checkCount(t, what, recs, want)
	begin := time.Now()
	res := porcupine.CheckOperationsTimeout(model, operations(recs), checkTimeout)
	t.Logf("%s: %d operations over %v, checked in %v: %s", what, len(recs), span(recs), time.Since(begin), res)
	if res != porcupine.Illegal {
		t.Errorf("%s: history of %d operations from a broken implementation is %s, want %s: the checker missed it",
			what, len(recs), res, porcupine.Illegal)
	}
}

// span returns how long a history lasted, from the first call to the last
// return.
func span(recs []record) time.Duration {
	if len(recs) == 0 {
		return 0
	}
	first, last := recs[0].Call, recs[0].Ret
	for _, r := range recs {
		first, last = min(first, r.Call), max(last, r.Ret)
	}
	return time.Duration(last - first)
}

// checkCount fails t unless recs holds want operations apart from failed
// tries (whose number depends on the run): a helper that stopped early would
// leave a short history that proves less.
func checkCount(t *testing.T, what string, recs []record, want int) {
	t.Helper()
	got := 0
	for _, r := range recs {
		if r.Op != opBusy {
			got++
		}
	}
	if got != want {
		t.Errorf("%s: %d operations recorded (not counting failed tries), want %d", what, got, want)
	}
}
