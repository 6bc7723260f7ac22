// Command bench shows sluice's three use cases end to end in a few seconds,
// and with -full measures every primitive, on an embedded miniredis by
// default or on a real Redis or Redis Cluster; with -peers it compares them
// with the libraries people use for the same jobs.
//
//	go run .                                             # the three use cases, seconds, no setup
//	go run . -full                                       # every workload, about 2 minutes
//	go run -tags peers . -redis 127.0.0.1:6379 -peers     # real numbers, with peers
//	go run . -quick                                      # CI smoke test of everything, under 20 s
//	go run -tags peers . -redis ADDR -peers -svg cmp.svg # also draw the comparison
//	go run . -from results.json -svg cmp.svg             # draw an earlier -json run
//
// It is its own module so that the peers' dependencies never enter the
// library's go.mod, and the peers (with sluice on go-redis) are compiled
// in only with -tags peers, so that the demo downloads and builds nothing
// but sluice, rueidis and miniredis.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"slices"
	"time"
)

// envRedis names the environment variable that -redis defaults to.
const envRedis = "SLUICE_BENCH_REDIS"

// config is what the command line asks for.
type config struct {
	redis    string
	peers    bool
	quick    bool
	full     bool
	json     string
	svg      string
	from     string
	rounds   int
	duration time.Duration
	run      string
	cmdstats bool
}

func main() {
	var c config
	flag.StringVar(&c.redis, "redis", os.Getenv(envRedis),
		"Redis to run against: host:port, redis://[user:password@]host:port, or a comma-separated\n"+
			"cluster seed list; empty starts an embedded miniredis (env "+envRedis+")")
	flag.BoolVar(&c.peers, "peers", false, "also run the peer libraries on the same workloads, interleaved")
	flag.BoolVar(&c.quick, "quick", false, "one short round of everything, for CI (under 20 s)")
	flag.BoolVar(&c.full, "full", false, "after the use cases, measure every workload (implied by -peers, -quick, -run and -svg)")
	flag.StringVar(&c.json, "json", "", "also write the results as JSON to this `file`")
	flag.StringVar(&c.svg, "svg", "", "also draw the workloads' latencies per library as an SVG picture in this `file`")
	flag.StringVar(&c.from, "from", "", "run nothing: draw -svg from the results of an earlier -json `file`")
	flag.IntVar(&c.rounds, "rounds", 0, "rounds per workload; the median is reported (default 5, 1 with -quick)")
	flag.DurationVar(&c.duration, "duration", 0, "length of one measurement (default 300ms, 150ms with -quick)")
	flag.StringVar(&c.run, "run", "", "only run workloads whose name matches this `regexp` (e.g. lock, ratelimit.flood, ceiling, http)")
	flag.BoolVar(&c.cmdstats, "cmdstats", false, "under each row, the commands the server ran per operation and their time (from INFO commandstats;\nit resets nothing, but other clients' commands on the same server count too)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `bench shows sluice's three use cases end to end, and measures every primitive.

  go run .                                the three use cases on an embedded miniredis, in seconds
  go run . -full                          and every workload measured (about 2 minutes; not Redis numbers)
  go run -tags peers . -redis 127.0.0.1:6379 -peers
                                          a real Redis, compared with the peer libraries
                                          (-tags peers compiles them in, and sluice on go-redis)
  go run -tags peers . -redis 127.0.0.1:6379 -peers -svg cmp.svg
                                          and the comparison drawn as a picture
  go run . -from results.json -svg cmp.svg
                                          draw the results of an earlier -json run
  go run . -redis 127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002
                                          a Redis Cluster (the seed list)
  go run . -quick                         one short round, for CI

Flags:
`)
		flag.PrintDefaults()
	}
	flag.Parse()
	if c.peers && !peersBuilt {
		fmt.Fprintln(os.Stderr, "bench: -peers needs the peer libraries compiled in: go run -tags peers . -peers ...")
		os.Exit(2)
	}
	if c.from != "" {
		if err := redraw(c.from, c.svg); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := run(ctx, c, os.Stdout, newProgress(os.Stderr))
	if err == nil && c.json != "" {
		err = writeJSON(c.json, rep)
	}
	if err == nil && c.svg != "" {
		err = writeSVG(c.svg, rep)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// redraw draws the SVG picture of the results of an earlier run, saved
// with -json.
func redraw(from, svg string) error {
	if svg == "" {
		return errors.New("-from needs -svg FILE to draw into")
	}
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	var rep report
	if err := json.Unmarshal(data, &rep); err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	return writeSVG(svg, &rep)
}

// errScenario means a scenario's invariant did not hold.
var errScenario = errors.New("a scenario failed")

// run does the whole job and prints the tables to out.
func run(ctx context.Context, c config, out io.Writer, prog *progress) (*report, error) {
	// A hard bound on the whole run, whatever the flags say.
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()

	// Many short rounds make the median robust against bursts of load from
	// elsewhere on the machine.
	b := &bench{rounds: 5, duration: 300 * time.Millisecond, warmup: 100 * time.Millisecond, peers: c.peers, prog: prog}
	if c.quick {
		b.rounds, b.duration, b.warmup = 1, 150*time.Millisecond, 30*time.Millisecond
	}
	if c.rounds > 0 {
		b.rounds = c.rounds
	}
	if c.duration > 0 {
		b.duration = c.duration
	}
	if c.run != "" {
		re, err := regexp.Compile(c.run)
		if err != nil {
			return nil, fmt.Errorf("-run: %w", err)
		}
		b.filter = re
	}
	// Keys of this run never meet those of another run on the same server.
	b.ns = "sluice-bench:" + rand.Text()[:8] + ":"

	var err error
	if c.redis == "" {
		b.srv, err = startEmbedded()
	} else {
		b.srv, err = dialServer(ctx, c.redis)
	}
	if err != nil {
		return nil, err
	}
	defer b.srv.close()
	if c.cmdstats && b.srv.embedded == nil {
		sc, err := b.srv.rueidis()
		if err != nil {
			return nil, err
		}
		defer sc.Close()
		b.stats = &cmdStats{c: sc}
	}

	rep := &report{
		Server: b.srv.describe(), ServerKind: b.srv.kind(), Started: time.Now(),
		Rounds: b.rounds, Duration: b.duration.Seconds(), Peers: c.peers, Quick: c.quick,
		GoVersion: runtime.Version(),
	}
	fmt.Fprintf(out, "sluice bench on %s, GOMAXPROCS %d\n", rep.Server, runtime.GOMAXPROCS(0))
	if b.srv.embedded != nil {
		fmt.Fprintln(out, "The server is an embedded miniredis (Lua run in Go, in this process): every check below holds on")
		fmt.Fprintln(out, "it as on Redis, but its timings are not Redis timings. Real ones: go run -tags peers . -redis 127.0.0.1:6379 -peers")
	}

	for _, sr := range scenarioRunners {
		if b.selected("scenario." + sr.name) {
			prog.show("scenario."+sr.name, "sluice", "running")
			rep.Scenarios = append(rep.Scenarios, sr.run(ctx, b.srv, b.ns+sr.name+":", c.quick))
		}
	}
	prog.clear()
	printScenarios(out, rep.Scenarios)
	if !c.measures() {
		rep.Elapsed = time.Since(rep.Started).Seconds()
		fmt.Fprintf(out, "\ndone in %.1fs. That was the demo; to measure every primitive (about 2 minutes here):\n", rep.Elapsed)
		fmt.Fprintln(out, "  go run . -full                                        on this embedded server")
		fmt.Fprintln(out, "  go run -tags peers . -redis 127.0.0.1:6379 -peers -svg cmp.svg")
		fmt.Fprintln(out, "                                                        on a real Redis, against the peer libraries, drawn")
		return rep, scenarioErr(ctx, rep)
	}

	runGroup(ctx, b, lockImpls, lockWorkloads)
	runGroup(ctx, b, semaphoreImpls, semaphoreWorkloads)
	runGroup(ctx, b, limiterImpls, limiterWorkloads)
	runGroup(ctx, b, policyImpls, policyWorkloads)
	rep.Results = b.results
	for _, h := range httpLoads {
		if b.selected(h.name) {
			rep.HTTP = append(rep.HTTP, *runHTTPLoad(ctx, b, h.name, h.pace))
		}
	}
	if b.selected("http.attack") {
		rep.Attack = runAttack(ctx, b, c.quick)
	}

	if b.selected("ceiling") {
		scriptOf := map[string]string{}
		var scripts []string
		for _, im := range limiterImpls {
			if im.script != "" && im.kind != peer {
				scriptOf[im.name] = im.script
				if !slices.Contains(scripts, im.script) {
					scripts = append(scripts, im.script)
				}
			}
		}
		rep.Ceiling = measureCeilings(ctx, b, scripts)
		rep.Fractions = fractions(rep.Results, rep.Ceiling, scriptOf)
	}
	prog.clear()

	if len(rep.Results) > 0 {
		fmt.Fprintf(out, "\nworkloads: %d round(s) of %s each (hand-offs twice that), implementations interleaved,\n", b.rounds, b.duration)
		fmt.Fprintln(out, "median round shown; vs peer: how many times better than the best peer, by the figure in brackets")
		printResults(out, rep.Results)
	}
	printCeilings(out, rep.Ceiling, rep.Fractions, b.srv.embedded != nil)
	for _, h := range rep.HTTP {
		printHTTPLoad(out, &h, b.rounds, b.srv.embedded != nil)
	}
	printAttack(out, rep.Attack)
	rep.Notes = notes(b)
	if n := policyRatio(rep.Results); n != "" {
		rep.Notes = append(rep.Notes, n)
	}
	rep.Notes = append(rep.Notes, httpNotes(rep.HTTP, rep.Attack)...)
	fmt.Fprintln(out)
	for _, n := range rep.Notes {
		fmt.Fprintln(out, "note:", n)
	}
	rep.Elapsed = time.Since(rep.Started).Seconds()
	fmt.Fprintf(out, "\ndone in %.1fs\n", rep.Elapsed)

	return rep, scenarioErr(ctx, rep)
}

// measures says whether the run goes on from the use cases to the
// workloads: the demo alone takes seconds, everything about two minutes.
func (c config) measures() bool {
	return c.full || c.peers || c.quick || c.run != "" || c.svg != ""
}

// scenarioErr is the run's error: cut short, or a scenario whose invariant
// did not hold.
func scenarioErr(ctx context.Context, rep *report) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("run cut short: %w", err)
	}
	for _, sc := range rep.Scenarios {
		if !sc.OK {
			return fmt.Errorf("%w: %s", errScenario, sc.Name)
		}
	}
	return nil
}

// notes are the caveats a reader of the numbers needs, printed under the
// tables and kept in the JSON.
func notes(b *bench) []string {
	var ns []string
	if b.srv.embedded != nil {
		ns = append(ns, "embedded miniredis runs in this process: its work is in the allocation counts and it "+
			"runs Lua far slower than Redis; these are not Redis numbers")
	}
	ns = append(ns, "allocs/op count every allocation in the process during the round (clients' own goroutines "+
		"included), divided by the operations",
		"cpu/op c+s is the CPU time per operation in µs of this process (c: every client in it and the harness) "+
			"and of the Redis server processes (s), when they run on this machine; with client and server "+
			"sharing the cores, their sum bounds the throughput",
		"every operation gets a context with a deadline, as a request handler's would; some libraries take a "+
			"slower path for cancellable contexts than for context.Background()")
	if b.peers {
		ns = append(ns,
			"peers use their documented defaults except: redislock and redsync retry a taken lock every 10ms "+
				"(redsync's default is 50-250ms), rueidislock uses one key per lock (KeyMajority 1, like the others), "+
				"go-redis clients keep their default pool (10 per CPU)",
			"the polling ZSET semaphore is the common recipe (a script trims expired holders and adds the caller "+
				"below capacity), retried every 10ms")
	} else {
		ns = append(ns, "peers not run; go run -tags peers . -peers compares with rueidislock, redislock, redsync, "+
			"redis_rate, ulule/limiter (its limiter and its HTTP middleware) and a polling semaphore, and adds sluice on go-redis")
	}
	return ns
}
