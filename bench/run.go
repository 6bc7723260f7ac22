package main

import (
	"cmp"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"
)

// minJudgedRounds is the fewest rounds whose median a target is judged on:
// one round (-quick) is a smoke test, not a measurement.
const minJudgedRounds = 3

// bench holds one run's settings and collects its results.
type bench struct {
	srv      *server
	rounds   int
	duration time.Duration // of one measurement; long workloads get twice this
	warmup   time.Duration // untimed run of each implementation before round 1
	peers    bool
	filter   *regexp.Regexp // workloads to run, by name; nil runs all
	ns       string         // key prefix unique to this run
	prog     *progress
	stats    *cmdStats // nil unless -cmdstats

	results []result
}

// result is one implementation's figures for one workload: those of its
// median round.
type result struct {
	Workload    string        `json:"workload"`
	Title       string        `json:"title"`
	Impl        string        `json:"impl"`
	Kind        kind          `json:"kind"`
	Goroutines  int           `json:"goroutines"`
	Rate        string        `json:"rate,omitempty"`
	Ops         int64         `json:"ops"`
	Errors      int64         `json:"errors"`
	OpsPerSec   float64       `json:"ops_per_sec"`
	P50         time.Duration `json:"p50_ns"`
	P90         time.Duration `json:"p90_ns"`
	P99         time.Duration `json:"p99_ns"`
	AllocsPerOp float64       `json:"allocs_per_op"`
	// ClientCPU and ServerCPU are the CPU time per operation of this
	// process (every client in it, and the harness) and of the Redis
	// servers; ServerCPU is absent when the servers' processes are not
	// visible (another machine, or the embedded server in this process).
	ClientCPU time.Duration  `json:"client_cpu_ns_per_op"`
	ServerCPU *time.Duration `json:"server_cpu_ns_per_op,omitempty"`
	// VsBestPeer is how many times better than the best peer this is by
	// the workload's judge: ops/s over the best peer's, or the best peer's
	// latency over this one's. 0 when no peer ran.
	VsBestPeer float64 `json:"vs_best_peer,omitempty"`
	// Mark and MarkShare carry the workload's own count as a share of ops
	// (allowed requests, self re-acquisitions).
	Mark        string    `json:"mark,omitempty"`
	MarkShare   float64   `json:"mark_share,omitempty"`
	RoundsOpsPS []float64 `json:"rounds_ops_per_sec"`
	// Commands are the server's commands per operation in the median
	// round, with -cmdstats.
	Commands []cmdCost `json:"commands,omitempty"`
	JudgedBy judge     `json:"judged_by"`
	Err      string    `json:"error,omitempty"`
}

func (b *bench) selected(name string) bool {
	return b.filter == nil || b.filter.MatchString(name)
}

// runGroup runs every selected workload on every selected implementation.
func runGroup[T any](ctx context.Context, b *bench, impls []impl[T], wls []workload[T]) {
	var use []impl[T]
	for _, im := range impls {
		if im.kind != peer || b.peers {
			use = append(use, im)
		}
	}
	// Ours first, then the raw reference, then the peers.
	order := map[kind]int{ours: 0, reference: 1, peer: 2}
	slices.SortStableFunc(use, func(a, b impl[T]) int { return order[a.kind] - order[b.kind] })
	for _, w := range wls {
		in := slices.DeleteFunc(slices.Clone(use), func(im impl[T]) bool { return im.only != nil && !im.only(w.name) })
		if b.selected(w.name) && len(in) > 0 {
			b.results = append(b.results, runWorkload(ctx, b, in, w)...)
		}
	}
}

// entry is one implementation taking part in one workload.
type entry[T any] struct {
	impl    impl[T]
	xs      []T
	closers []func()
	samples []sample
	err     error
}

func (e *entry[T]) close() {
	for _, c := range e.closers {
		c()
	}
}

// runWorkload opens the implementations, warms each up, then measures them
// in interleaved rounds so that whatever else the machine does hits all of
// them alike.
func runWorkload[T any](ctx context.Context, b *bench, impls []impl[T], w workload[T]) []result {
	entries := make([]*entry[T], len(impls))
	for i, im := range impls {
		e := &entry[T]{impl: im}
		entries[i] = e
		for range max(w.instances, 1) {
			x, closeFn, err := im.open(ctx, b.srv, w.rate)
			if err != nil {
				e.err = fmt.Errorf("open: %w", err)
				break
			}
			e.xs = append(e.xs, x)
			e.closers = append(e.closers, closeFn)
		}
	}
	defer func() {
		for _, e := range entries {
			e.close()
		}
	}()

	d := b.duration
	if w.long {
		d *= 2
	}
	round := func(e *entry[T], label string, d time.Duration) (sample, error) {
		loops, err := w.loops(e.xs, b.ns+w.name+":"+e.impl.name+":"+label+":")
		if err != nil {
			return sample{}, err
		}
		before := b.stats.read(ctx)
		s := measure(ctx, d, loops, b.srv.pids)
		s.cmds = perOp(before, b.stats.read(ctx), s.ops)
		return s, nil
	}
	if b.warmup > 0 {
		for _, e := range entries {
			if e.err == nil {
				b.prog.show(w.name, e.impl.name, "warm-up")
				_, e.err = round(e, "warm", b.warmup)
			}
		}
	}
	for r := range b.rounds {
		// Each round starts one implementation later (A B C, B C A, ...),
		// so none always runs first or right after another.
		for k := range entries {
			e := entries[(k+r)%len(entries)]
			if e.err != nil || ctx.Err() != nil {
				continue
			}
			b.prog.show(w.name, e.impl.name, fmt.Sprintf("round %d/%d", r+1, b.rounds))
			s, err := round(e, strconv.Itoa(r), d)
			if err != nil {
				e.err = err
				continue
			}
			e.samples = append(e.samples, s)
		}
	}
	return summarize(w, entries)
}

// summarize picks each implementation's median round and compares it with
// the best peer's.
func summarize[T any](w workload[T], entries []*entry[T]) []result {
	results := make([]result, 0, len(entries))
	for _, e := range entries {
		r := result{
			Workload: w.name, Title: w.title, Impl: e.impl.name, Kind: e.impl.kind,
			Goroutines: w.goroutines, Rate: describeRate(w.rate), JudgedBy: w.judge.orOps(), Mark: w.mark,
		}
		if e.err == nil && len(e.samples) == 0 {
			e.err = fmt.Errorf("not measured")
		}
		if e.err != nil {
			r.Err = e.err.Error()
			results = append(results, r)
			continue
		}
		for _, s := range e.samples {
			r.RoundsOpsPS = append(r.RoundsOpsPS, s.opsPerSec())
		}
		m := median(e.samples, w.judge)
		r.Ops, r.Errors = m.ops, m.errs
		r.OpsPerSec = m.opsPerSec()
		r.P50, r.P90, r.P99 = m.lat.quantile(0.50), m.lat.quantile(0.90), m.lat.quantile(0.99)
		r.AllocsPerOp = m.allocsPerOp()
		r.Commands = m.cmds
		cpu := m.cpuPerOp()
		r.ClientCPU = cpu.client
		if cpu.seen {
			r.ServerCPU = &cpu.server
		}
		if w.mark != "" && m.ops > 0 {
			r.MarkShare = float64(m.marks) / float64(m.ops)
		}
		if m.errs > 0 && m.err != nil {
			r.Err = m.err.Error()
		}
		results = append(results, r)
	}
	// The best peer by the workload's judge.
	var best *result
	for i := range results {
		r := &results[i]
		if r.Kind == peer && r.Ops > 0 && (best == nil || w.judge.value(r) > w.judge.value(best)) {
			best = r
		}
	}
	if best == nil {
		return results
	}
	for i := range results {
		if r := &results[i]; r.Ops > 0 {
			r.VsBestPeer = w.judge.ratio(r, best)
		}
	}
	return results
}

// judge is the figure a workload compares implementations by.
type judge string

const (
	byOps judge = "ops/s" // the zero judge means this
	byP50 judge = "p50"
	byP99 judge = "p99"
)

func (j judge) orOps() judge {
	if j == "" {
		return byOps
	}
	return j
}

// value is the judged figure of r, larger is better.
func (j judge) value(r *result) float64 {
	switch j {
	case byP50:
		return -float64(r.P50)
	case byP99:
		return -float64(r.P99)
	}
	return r.OpsPerSec
}

// ratio is how many times better r is than best.
func (j judge) ratio(r, best *result) float64 {
	switch j {
	case byP50:
		return float64(best.P50) / float64(max(r.P50, 1))
	case byP99:
		return float64(best.P99) / float64(max(r.P99, 1))
	}
	return r.OpsPerSec / best.OpsPerSec
}

// median returns the middle round by the judged figure.
func median(samples []sample, j judge) *sample {
	idx := make([]int, len(samples))
	for i := range idx {
		idx[i] = i
	}
	key := func(s *sample) float64 {
		switch j {
		case byP50:
			return float64(s.lat.quantile(0.50))
		case byP99:
			return float64(s.lat.quantile(0.99))
		}
		return s.opsPerSec()
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(key(&samples[a]), key(&samples[b])) })
	return &samples[idx[len(idx)/2]]
}
