package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	sluicesem "github.com/sluicekit/sluice/semaphore"
)

// workersScenario: bounded workers. Several "processes" (each its own
// client and semaphore Manager, as separate programs would have) run
// workers that share one semaphore of capacity k around a simulated job.
// However many workers there are, no more than k jobs may ever run at once,
// and every job must run.
func workersScenario(ctx context.Context, s *server, ns string, quick bool) scenario {
	sc := scenario{Name: "bounded workers"}
	const processes, workersPer, capacity, job = 3, 4, 3, 5 * time.Millisecond
	jobsPer := 10
	if quick {
		jobsPer = 4
	}
	var inFlight, peak, done, failed atomic.Int64
	var mu sync.Mutex
	var firstErr error
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	start := time.Now()
	for p := range processes {
		cache, client, err := openCache(ctx, s)
		if err != nil {
			sc.Err = err.Error()
			break
		}
		mgr, err := sluicesem.NewManager(cache, sluicesem.Options{Prefix: ns})
		if err != nil {
			client.Close()
			sc.Err = err.Error()
			break
		}
		var procWG sync.WaitGroup
		for range workersPer {
			procWG.Go(func() {
				sem, err := mgr.NewSemaphore("jobs", capacity)
				for j := 0; err == nil && j < jobsPer; j++ {
					var permit *sluicesem.Permit
					if permit, err = sem.Acquire(ctx, 1); err != nil {
						break
					}
					n := inFlight.Add(1)
					for old := peak.Load(); n > old && !peak.CompareAndSwap(old, n); old = peak.Load() {
					}
					time.Sleep(job)
					inFlight.Add(-1)
					err = permit.Release(ctx)
					done.Add(1)
				}
				if err != nil {
					failed.Add(1)
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("process %d: %w", p, err)
					}
					mu.Unlock()
				}
			})
		}
		// The process shuts down once its workers are done.
		wg.Go(func() {
			procWG.Wait()
			mgr.Close()
			client.Close()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	total := int64(processes * workersPer * jobsPer)
	ideal := time.Duration(total) * job / capacity
	sc.Lines = append(sc.Lines,
		fmt.Sprintf("%d processes x %d workers share a semaphore of capacity %d; %d jobs of %s each", processes, workersPer, capacity, total, job),
		fmt.Sprintf("jobs done %d of %d in %s (%s if the %d slots were never idle)", done.Load(), total, elapsed.Round(time.Millisecond), ideal, capacity),
		fmt.Sprintf("check: peak concurrency observed %d <= capacity %d", peak.Load(), capacity))
	if firstErr != nil && sc.Err == "" {
		sc.Err = firstErr.Error()
	}
	sc.OK = sc.Err == "" && failed.Load() == 0 && done.Load() == total && peak.Load() <= capacity
	return sc
}
