package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice"
)

// The physical ceiling: how many calls per second the server itself can run
// of the script a limiter's hot path runs, with no library in the way and the
// network round trips amortised by pipelining. A library cannot beat it; the
// fraction of it that a library reaches says how much the library costs.

// scriptArgs are the ARGV the ceiling passes to each script: the generous
// rate of the throughput workloads (1,000,000 per second, cost 1), so that
// every call takes the allowed path, as in ratelimit.allow.x64.
var scriptArgs = map[string][]string{
	"ratelimit_fixed":   {"1000000", "1000", "1"},    // limit, window ms, cost
	"ratelimit_sliding": {"1000000", "1000000", "1"}, // limit, window µs, cost
	"ratelimit_gcra":    {"1", "1000000", "1"},       // interval µs, burst, cost
}

// ceiling is one way of measuring the ceiling for one script.
type ceiling struct {
	Script    string  `json:"script"`
	Method    string  `json:"method"`
	OpsPerSec float64 `json:"ops_per_sec"`
	Err       string  `json:"error,omitempty"`
}

// fraction is a library's share of the best ceiling measured for its script.
type fraction struct {
	Impl      string  `json:"impl"`
	Script    string  `json:"script"`
	OpsPerSec float64 `json:"ops_per_sec"`
	Ceiling   float64 `json:"ceiling_ops_per_sec"`
	Fraction  float64 `json:"fraction"`
}

// measureCeilings measures each script: always with pipelined EVALSHA from
// Go, and with redis-benchmark too when it is on PATH and the server is a
// single real one. redis-benchmark runs a number of calls, not a time, so it
// is given about as many as the Go measurement managed in 2*duration: a
// loaded machine then makes it slower, not longer.
func measureCeilings(ctx context.Context, b *bench, scripts []string) []ceiling {
	client, err := b.srv.rueidis()
	if err != nil {
		return []ceiling{{Method: "setup", Err: err.Error()}}
	}
	defer client.Close()
	cache, err := sluice.New(ctx, client)
	if err != nil {
		return []ceiling{{Method: "setup", Err: err.Error()}}
	}
	_, lookErr := exec.LookPath("redis-benchmark")
	useBenchmark := lookErr == nil && b.srv.embedded == nil && !b.srv.cluster

	var out []ceiling
	for _, name := range scripts {
		s, err := cache.Script(name)
		if err != nil {
			continue // not in this checkout's lua/ yet
		}
		args := scriptArgs[name]
		d := 2 * b.duration
		b.prog.show("ceiling", name, "pipelined EVALSHA")
		c := ceiling{Script: name, Method: "rueidis pipelined EVALSHA, batches of 16"}
		c.OpsPerSec, err = pipelined(ctx, client, s.SHA1(), args, b.ns+"ceiling:"+name+":", d)
		if err != nil {
			c.Err = err.Error()
		}
		out = append(out, c)
		if useBenchmark {
			b.prog.show("ceiling", name, "redis-benchmark")
			n := min(max(int(c.OpsPerSec*d.Seconds()), 20_000), 1_000_000)
			c := ceiling{Script: name, Method: "redis-benchmark -P 16"}
			c.OpsPerSec, err = redisBenchmark(ctx, b.srv, s.SHA1(), args, b.ns+"ceiling-rb:"+name+":", n)
			if err != nil {
				c.Err = err.Error()
			}
			out = append(out, c)
		}
	}
	return out
}

// redisBenchmark runs n EVALSHA calls of sha with 50 connections and 16
// commands in flight per connection, on random keys starting with ns, and
// returns the rate.
func redisBenchmark(ctx context.Context, s *server, sha string, args []string, ns string, n int) (float64, error) {
	host, port, ok := strings.Cut(s.addrs[0], ":")
	if !ok {
		return 0, fmt.Errorf("address %q has no port", s.addrs[0])
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	argv := []string{"-h", host, "-p", port, "-P", "16", "-n", strconv.Itoa(n), "-r", "100000", "--csv"}
	if s.username != "" {
		argv = append(argv, "--user", s.username)
	}
	if s.password != "" {
		argv = append(argv, "-a", s.password)
	}
	argv = append(argv, "EVALSHA", sha, "1", ns+"__rand_int__")
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, "redis-benchmark", argv...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	// --csv prints a header and one row: "test","rps",...
	rows, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil || len(rows) < 2 || len(rows[len(rows)-1]) < 2 {
		return 0, fmt.Errorf("redis-benchmark: unexpected output %q", out)
	}
	return strconv.ParseFloat(rows[len(rows)-1][1], 64)
}

// pipelined sends batches of 16 EVALSHA from 8 goroutines for d. rueidis
// writes each batch in one go and merges concurrent batches on the wire.
func pipelined(ctx context.Context, client rueidis.Client, sha string, args []string, ns string, d time.Duration) (float64, error) {
	const goroutines, batch = 8, 16
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int64
		first error
	)
	deadline := time.Now().Add(d)
	start := time.Now()
	for g := range goroutines {
		wg.Go(func() {
			var n int64
			var err error
			cmds := make(rueidis.Commands, batch)
			for i := 0; i < maxOpsPerGoroutine/batch && time.Now().Before(deadline) && err == nil; i++ {
				for j := range cmds {
					key := ns + strconv.Itoa(g) + ":" + strconv.Itoa(j)
					cmds[j] = client.B().Evalsha().Sha1(sha).Numkeys(1).Key(key).Arg(args...).Build()
				}
				for _, r := range client.DoMulti(ctx, cmds...) {
					if e := r.Error(); e != nil && err == nil {
						err = e
					}
				}
				n += batch
			}
			mu.Lock()
			total += n
			first = errors.Join(first, err)
			mu.Unlock()
		})
	}
	wg.Wait()
	if first != nil {
		return 0, first
	}
	return float64(total) / time.Since(start).Seconds(), nil
}

// fractions compares every non-peer limiter's Allow rate at 64 goroutines
// with the best ceiling measured for its script.
func fractions(results []result, ceilings []ceiling, scriptOf map[string]string) []fraction {
	best := map[string]float64{}
	for _, c := range ceilings {
		if c.Err == "" {
			best[c.Script] = max(best[c.Script], c.OpsPerSec)
		}
	}
	var out []fraction
	for _, r := range results {
		script := scriptOf[r.Impl]
		if r.Workload != "ratelimit.allow.x64" || r.Kind == peer || script == "" || best[script] == 0 || r.Ops == 0 {
			continue
		}
		out = append(out, fraction{
			Impl: r.Impl, Script: script, OpsPerSec: r.OpsPerSec,
			Ceiling: best[script], Fraction: r.OpsPerSec / best[script],
		})
	}
	return out
}

// printCeilings writes the ceiling section of the table. Against the
// embedded server the fractions mean nothing (it shares this process's CPU
// and gains little from pipelining), so they are left out.
func printCeilings(w io.Writer, ceilings []ceiling, fr []fraction, embedded bool) {
	if len(ceilings) == 0 {
		return
	}
	fmt.Fprintf(w, "\nserver ceiling for the same scripts (no library, pipelined)\n")
	for _, c := range ceilings {
		if c.Err != "" {
			fmt.Fprintf(w, "  %-18s %-42s failed: %s\n", c.Script, c.Method, c.Err)
			continue
		}
		fmt.Fprintf(w, "  %-18s %-42s %10s ops/s\n", c.Script, c.Method, rateString(c.OpsPerSec))
	}
	if embedded {
		fmt.Fprintln(w, "  (fractions left out: the embedded server shares this process's CPU)")
		return
	}
	for _, f := range fr {
		fmt.Fprintf(w, "  %s Allow x64: %s ops/s = %.0f%% of the %s ceiling\n",
			f.Impl, rateString(f.OpsPerSec), f.Fraction*100, f.Script)
	}
}
