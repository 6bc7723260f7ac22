package faulttest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/semaphore"
)

// scriptFlushStorm empties Redis's script cache every 50 ms while
// goroutines hammer every primitive: mutex Lock/Unlock, semaphore
// Acquire/Release, and Allow on all three rate limit algorithms.
//
// Pass criterion: zero errors reach callers (a denial, or ErrNotObtained
// from a Try call, is an answer, not an error; none is used here for the
// lock and semaphore, whose waits are generous). The test also checks that
// the storm bit: the server answered NOSCRIPT at least once per primitive
// family's worth of flushes, and every primitive made progress.
func scriptFlushStorm(t *testing.T, newCache NewCache) {
	run := pick(2*time.Second, 20*time.Second)
	srv := redistest.NewServer(t)
	sc := newCache(t, srv.Addr(), ClientOptions{})
	locks := newLocker(t, sc, mutex.Options{WatchdogLease: time.Second})
	sems := newManager(t, sc, semaphore.Options{WatchdogLease: time.Second})
	ctx := context.Background()
	noscriptBefore := errorStat(t, srv, "NOSCRIPT")

	type prim struct {
		name string
		op   func(ctx context.Context) error
	}
	var prims []prim
	for i := range 2 {
		name := uniqueName(t) + fmt.Sprint(i)
		for g := range 3 {
			m := newMutex(t, locks, name)
			prims = append(prims, prim{fmt.Sprintf("mutex %d/%d", i, g), func(ctx context.Context) error {
				if err := m.Lock(ctx); err != nil {
					return err
				}
				return m.Unlock(ctx)
			}})
		}
	}
	sem, err := sems.NewSemaphore(uniqueName(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	for g := range 4 {
		prims = append(prims, prim{fmt.Sprintf("semaphore %d", g), func(ctx context.Context) error {
			p, err := sem.Acquire(ctx, 1)
			if err != nil {
				return err
			}
			return p.Release(ctx)
		}})
	}
	for _, algo := range []ratelimit.Algorithm{ratelimit.GCRA, ratelimit.FixedWindow, ratelimit.SlidingWindow} {
		l, err := ratelimit.New(sc, ratelimit.Options{Algorithm: algo, Limit: ratelimit.PerSecond(1000), DisableDenyCache: true})
		if err != nil {
			t.Fatal(err)
		}
		for g := range 2 {
			key := uniqueName(t)
			prims = append(prims, prim{fmt.Sprintf("ratelimit %v %d", algo, g), func(ctx context.Context) error {
				_, err := l.Allow(ctx, key)
				return err
			}})
		}
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var flushes atomic.Int64
	var flushErr atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if err := srv.FlushScripts(); err != nil {
					flushErr.Store(err)
					return
				}
				flushes.Add(1)
			}
		}
	}()
	ops := make([]atomic.Int64, len(prims))
	var mu sync.Mutex
	var errs []error
	for i, p := range prims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				octx, cancel := context.WithTimeout(ctx, signalWait)
				err := p.op(octx)
				cancel()
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s: %w", p.name, err))
					mu.Unlock()
					continue
				}
				ops[i].Add(1)
			}
		}()
	}
	time.Sleep(run) // the storm lasts this long
	close(stop)
	wg.Wait()

	if err, _ := flushErr.Load().(error); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	for i, err := range errs {
		if i == 10 {
			t.Errorf("... %d errors in all", len(errs))
			break
		}
		t.Errorf("error reached a caller: %v", err)
	}
	var total int64
	for i, p := range prims {
		n := ops[i].Load()
		total += n
		if n == 0 {
			t.Errorf("%s made no progress", p.name)
		}
	}
	noscript := errorStat(t, srv, "NOSCRIPT") - noscriptBefore
	if flushes.Load() < int64(run/(100*time.Millisecond)) || noscript == 0 {
		t.Errorf("the storm did not bite: %d flushes, %d NOSCRIPT replies", flushes.Load(), noscript)
	}
	t.Logf("%v: %d SCRIPT FLUSH, %d NOSCRIPT replies absorbed, %d operations on %d goroutines, %d errors reached callers",
		run, flushes.Load(), noscript, total, len(prims), len(errs))
}

// errorStat is how many error replies starting with code the server has
// sent (INFO errorstats).
func errorStat(t *testing.T, srv *redistest.Server, code string) int64 {
	t.Helper()
	info, err := srv.Do("INFO", "errorstats")
	if err != nil {
		t.Fatal(err)
	}
	return statInt(info, "errorstat_"+code+":count=")
}
