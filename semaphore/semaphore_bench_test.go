package semaphore_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicekit/sluice/semaphore"
)

// Run with a real redis-server on PATH:
//
//	go test -run=NONE -bench=. -benchmem ./semaphore

// BenchmarkAcquireRelease measures Acquire+Release of one permit, with the
// capacity equal to the goroutines so nobody waits: the cost of the two
// script calls and the bookkeeping, not of contention.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, tg := range targets() {
		for _, g := range []int{1, 64} {
			b.Run(tg.name+"/goroutines="+strconv.Itoa(g), func(b *testing.B) {
				e := newEnv(b, tg.addrs(b), semaphore.Options{})
				s := e.sem(b, uniqueName(b), int64(g))
				ctx := context.Background()
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ReportAllocs()
				b.ResetTimer()
				for range g {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for next.Add(1) <= int64(b.N) {
							p, err := s.Acquire(ctx, 1)
							if err != nil {
								b.Error(err)
								return
							}
							if err := p.Release(ctx); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}

// BenchmarkWakeup measures the wake-up latency of a waiting Acquire: from
// just before the holder's Release to the return of Acquire in another
// Manager (another process's view), on a semaphore of capacity 1. The holder
// keeps the permit for 1 ms so the waiter is really waiting; ns/op includes
// that. The latencies are reported as p50-us and p99-us. In the fair
// variant the release grants the permit to the queued waiter directly.
func BenchmarkWakeup(b *testing.B) {
	for _, tg := range targets() {
		for _, fair := range []bool{false, true} {
			name := tg.name
			if fair {
				name += "/fair"
			}
			b.Run(name, func(b *testing.B) { benchWakeup(b, tg, fair) })
		}
	}
}

func benchWakeup(b *testing.B, tg target, fair bool) {
	addrs := tg.addrs(b)
	holderEnv := newEnv(b, addrs, semaphore.Options{Fair: fair})
	waiterEnv := newEnv(b, addrs, semaphore.Options{Fair: fair})
	name := uniqueName(b)
	holder, waiter := holderEnv.sem(b, name, 1), waiterEnv.sem(b, name, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	p, err := holder.Acquire(ctx, 1)
	if err != nil {
		b.Fatal(err)
	}
	var releasedAt atomic.Int64 // UnixNano just before Release
	lat := make([]time.Duration, 0, b.N)
	got := make(chan *semaphore.Permit)
	b.ResetTimer()
	go func() {
		defer close(got)
		for range b.N {
			q, err := waiter.Acquire(ctx, 1)
			if err != nil {
				b.Error(err)
				return
			}
			lat = append(lat, time.Duration(time.Now().UnixNano()-releasedAt.Load()))
			got <- q
		}
	}()
	for range b.N {
		time.Sleep(time.Millisecond) // let the waiter reach its wait
		releasedAt.Store(time.Now().UnixNano())
		if err := p.Release(ctx); err != nil {
			b.Fatal(err)
		}
		var ok bool
		if p, ok = <-got; !ok {
			return
		}
	}
	b.StopTimer()
	if err := p.Release(ctx); err != nil {
		b.Fatal(err)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-us")
}
