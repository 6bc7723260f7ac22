package main

import (
	"context"
	"runtime"
	"sync"
	"time"
)

// sample is what one round of one workload measured for one implementation.
type sample struct {
	ops     int64         // completed operations
	errs    int64         // operations that failed
	elapsed time.Duration // wall time from start to the last goroutine's stop
	mallocs uint64        // heap allocations of the whole process meanwhile
	lat     histogram     // latency of each operation, as the workload defines it
	marks   int64         // workload-specific count, see workload.mark
	err     error         // first error seen, to show when errs > 0
	cpu     cpuTime       // CPU time used meanwhile, by this process and by the server
	cmds    []cmdCost     // the server's commands per operation, with -cmdstats
}

func (s *sample) opsPerSec() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.ops) / s.elapsed.Seconds()
}

// cpuPerOp is the CPU time per operation, client and server.
func (s *sample) cpuPerOp() cpuTime {
	if s.ops == 0 {
		return cpuTime{}
	}
	return cpuTime{client: s.cpu.client / time.Duration(s.ops), server: s.cpu.server / time.Duration(s.ops), seen: s.cpu.seen}
}

func (s *sample) allocsPerOp() float64 {
	if s.ops == 0 {
		return 0
	}
	return float64(s.mallocs) / float64(s.ops)
}

// recorder is one measuring goroutine's private tally; nothing in it is
// shared, so recording costs no synchronisation and no allocation.
type recorder struct {
	lat   histogram
	ops   int64
	errs  int64
	marks int64
	err   error
}

// done counts one operation that took d, or a failure.
func (r *recorder) done(d time.Duration, err error) {
	if err != nil {
		r.errs++
		if r.err == nil {
			r.err = err
		}
		return
	}
	r.ops++
	r.lat.record(d)
}

// maxOpsPerGoroutine bounds every measuring loop in count as well as in time.
const maxOpsPerGoroutine = 5_000_000

// loop is the body of one measuring goroutine. It runs until deadline (or
// until ctx ends) and tallies into r. ctx outlives deadline by a grace period
// so that an operation in flight at the deadline can finish.
type loop func(ctx context.Context, deadline time.Time, r *recorder)

// measure runs loops concurrently for d and adds up what they recorded. The
// goroutines are started and parked before the first memory snapshot, so the
// allocation count covers the operations (and whatever the clients' own
// goroutines do meanwhile: the count is process-wide, and so is the CPU
// time, which also covers the servers whose process ids are in pids).
func measure(ctx context.Context, d time.Duration, loops []loop, pids []int) sample {
	const grace = 3 * time.Second
	recs := make([]recorder, len(loops))
	start := make(chan struct{})
	var wg sync.WaitGroup
	var deadline time.Time
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, l := range loops {
		wg.Go(func() {
			<-start
			if ctx.Err() != nil {
				return
			}
			lctx, lcancel := context.WithDeadline(ctx, deadline.Add(grace))
			defer lcancel()
			l(lctx, deadline, &recs[i])
		})
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	cpu0 := cpuNow(pids)
	t0 := time.Now()
	deadline = t0.Add(d)
	close(start)
	wg.Wait()
	elapsed := time.Since(t0)
	cpu1 := cpuNow(pids)
	runtime.ReadMemStats(&after)

	s := sample{elapsed: elapsed, mallocs: after.Mallocs - before.Mallocs,
		cpu: cpuTime{client: cpu1.client - cpu0.client, server: cpu1.server - cpu0.server, seen: cpu1.seen}}
	for i := range recs {
		s.ops += recs[i].ops
		s.errs += recs[i].errs
		s.marks += recs[i].marks
		s.lat.merge(&recs[i].lat)
		if s.err == nil {
			s.err = recs[i].err
		}
	}
	return s
}

// repeat is the common loop: call op back to back and record how long each
// call took. It stops at the deadline, after maxOpsPerGoroutine calls, or
// when op fails because the context ended. op may add marks to r.
func repeat(op func(ctx context.Context, r *recorder) error) loop {
	return func(ctx context.Context, deadline time.Time, r *recorder) {
		for i := 0; i < maxOpsPerGoroutine; i++ {
			t0 := time.Now()
			if !t0.Before(deadline) {
				return
			}
			err := op(ctx, r)
			r.done(time.Since(t0), err)
			if err != nil && ctx.Err() != nil {
				return
			}
		}
	}
}
