package main

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// workload is one measured situation for implementations of T.
type workload[T any] struct {
	name       string // stable id, for -run and the JSON output
	title      string // what the table says
	goroutines int
	instances  int   // independent instances (programs) it needs
	rate       rate  // what limiters are opened with
	judge      judge // what implementations are compared by; ops/s if empty
	long       bool  // a hand-off takes milliseconds: measure twice as long
	mark       string
	// loops builds the measuring goroutines on instances xs; every key
	// starts with ns, which is unique to this round and implementation.
	loops func(xs []T, ns string) ([]loop, error)
}

// The rates of the limiter workloads: one the throughput workloads never
// reach, so every call does the full allowed path on the server, and one a
// flood exceeds many times over.
var (
	generous = rate{limit: 1_000_000, window: time.Second}
	strict   = rate{limit: 100, window: time.Second}
)

var lockWorkloads = []workload[locker]{
	{
		name: "lock.uncontended.x1", title: "lock+unlock, distinct keys, 1 goroutine",
		goroutines: 1, instances: 1, loops: uncontendedLocks(1),
	},
	{
		name: "lock.uncontended.x64", title: "lock+unlock, distinct keys, 64 goroutines",
		goroutines: 64, instances: 1, loops: uncontendedLocks(64),
	},
	{
		name: "lock.handoff", title: "lock hand-off to a waiter in another program (latency)",
		goroutines: 2, instances: 2, judge: byP50, long: true,
		loops: func(xs []locker, ns string) ([]loop, error) {
			h := new(handoff)
			return contended(xs, ns, func(_ int, g gate) loop { return h.loop(g) })
		},
	},
	{
		name: "lock.barging", title: "lock barging: releaser competes again at once (wait)",
		goroutines: 2, instances: 2, judge: byP99, long: true, mark: "self re-acquired",
		loops: func(xs []locker, ns string) ([]loop, error) {
			b := new(barging)
			return contended(xs, ns, b.loop)
		},
	},
}

// uncontendedLocks gives each goroutine its own key: pure lock+unlock cost.
func uncontendedLocks(n int) func([]locker, string) ([]loop, error) {
	return func(xs []locker, ns string) ([]loop, error) {
		loops := make([]loop, n)
		for g := range loops {
			m, err := xs[0].Mutex(ns + "lock:" + strconv.Itoa(g))
			if err != nil {
				return nil, err
			}
			loops[g] = repeat(func(ctx context.Context, _ *recorder) error {
				if err := m.Lock(ctx); err != nil {
					return err
				}
				return m.Unlock(ctx)
			})
		}
		return loops, nil
	}
}

// contended gives each instance one goroutine on the same key.
func contended(xs []locker, ns string, mk func(id int, g gate) loop) ([]loop, error) {
	loops := make([]loop, len(xs))
	for i, x := range xs {
		m, err := x.Mutex(ns + "lock")
		if err != nil {
			return nil, err
		}
		loops[i] = mk(i, gate{take: m.Lock, give: m.Unlock})
	}
	return loops, nil
}

var semaphoreWorkloads = []workload[semaphores]{
	{
		name: "semaphore.acquire.x64", title: "semaphore acquire+release, 64 goroutines, capacity 64",
		goroutines: 64, instances: 1,
		loops: func(xs []semaphores, ns string) ([]loop, error) {
			loops := make([]loop, 64)
			for g := range loops {
				s, err := xs[0].Semaphore(ns+"sem", 64)
				if err != nil {
					return nil, err
				}
				loops[g] = repeat(func(ctx context.Context, _ *recorder) error {
					if err := s.Acquire(ctx); err != nil {
						return err
					}
					return s.Release(ctx)
				})
			}
			return loops, nil
		},
	},
	{
		name: "semaphore.wakeup", title: "semaphore wake-up of a waiter in another program (latency)",
		goroutines: 2, instances: 2, judge: byP50, long: true,
		loops: func(xs []semaphores, ns string) ([]loop, error) {
			h := new(handoff)
			loops := make([]loop, len(xs))
			for i, x := range xs {
				s, err := x.Semaphore(ns+"sem", 1)
				if err != nil {
					return nil, err
				}
				loops[i] = h.loop(gate{take: s.Acquire, give: s.Release})
			}
			return loops, nil
		},
	},
	{
		name: "semaphore.queue", title: "semaphore queue: 8 workers in 4 programs on 2 permits, 1ms jobs (wait)",
		goroutines: 8, instances: 4, judge: byP99, long: true, loops: queueWait(2, 2),
	},
}

// queueWait: goroutines spread over the instances take a permit of a
// semaphore that has fewer permits than goroutines, hold it for holdTime,
// give it back and queue again at once; the recorded latency is each wait.
// It is the bounded-workers scenario under load: how long a worker waits,
// and how unevenly (p99).
func queueWait(perInstance, capacity int) func([]semaphores, string) ([]loop, error) {
	return func(xs []semaphores, ns string) ([]loop, error) {
		var loops []loop
		for _, x := range xs {
			for range perInstance {
				s, err := x.Semaphore(ns+"sem", capacity)
				if err != nil {
					return nil, err
				}
				loops = append(loops, func(ctx context.Context, deadline time.Time, r *recorder) {
					for i := 0; i < maxOpsPerGoroutine && time.Now().Before(deadline); i++ {
						t0 := time.Now()
						if err := s.Acquire(ctx); err != nil {
							if ctx.Err() != nil {
								r.done(time.Since(t0), nil) // starved: a lower bound
								return
							}
							r.done(0, err)
							continue
						}
						r.done(time.Since(t0), nil)
						time.Sleep(holdTime)
						if err := s.Release(ctx); err != nil {
							r.done(0, err)
							return
						}
					}
				})
			}
		}
		return loops, nil
	}
}

var limiterWorkloads = []workload[limiter]{
	{
		name: "ratelimit.allow.x1", title: "rate-limit Allow, a key per goroutine, 1 goroutine",
		goroutines: 1, instances: 1, rate: generous, mark: "allowed", loops: allowLoops(1, false),
	},
	{
		name: "ratelimit.allow.x64", title: "rate-limit Allow, a key per goroutine, 64 goroutines",
		goroutines: 64, instances: 1, rate: generous, mark: "allowed", loops: allowLoops(64, false),
	},
	{
		name: "ratelimit.flood", title: "single-IP flood: 64 goroutines, one key, 100/s",
		goroutines: 64, instances: 1, rate: strict, mark: "allowed", loops: allowLoops(64, true),
	},
}

// allowLoops calls Allow back to back on a key per goroutine, or on one key
// for all when flood is set; marks count the allowed calls.
func allowLoops(n int, flood bool) func([]limiter, string) ([]loop, error) {
	return func(xs []limiter, ns string) ([]loop, error) {
		loops := make([]loop, n)
		for g := range loops {
			key := ns + "ip:" + strconv.Itoa(g)
			if flood {
				key = ns + "ip:flood"
			}
			l := xs[0]
			loops[g] = repeat(func(ctx context.Context, r *recorder) error {
				ok, err := l.Allow(ctx, key)
				if ok {
					r.marks++
				}
				return err
			})
		}
		return loops, nil
	}
}

// describeRate is how the JSON output states a workload's rate.
func describeRate(r rate) string {
	if r.limit == 0 {
		return ""
	}
	return fmt.Sprintf("%d per %s", r.limit, r.window)
}
