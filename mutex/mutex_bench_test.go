package mutex_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// BenchmarkLockUnlock measures uncontended Lock+Unlock pairs on distinct
// keys at 1 and 64 goroutines; one op is one pair. ctx=deadline gives every
// pair a context with a deadline, as a request handler's would.
//
//	go test -run=NONE -bench=. -benchmem ./mutex
func BenchmarkLockUnlock(b *testing.B) {
	for _, deadline := range []bool{false, true} {
		for _, goroutines := range []int{1, 64} {
			b.Run(fmt.Sprintf("ctx=%s/goroutines=%d", map[bool]string{false: "background", true: "deadline"}[deadline], goroutines), func(b *testing.B) {
				l := newLocker(b, redistest.Client(b, redistest.Single(b).Addr()), mutex.Options{})
				var next atomic.Int64
				spread(b, goroutines)
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					m, err := l.NewMutex("bench:" + strconv.FormatInt(next.Add(1), 10))
					if err != nil {
						b.Error(err)
						return
					}
					// One context per goroutine: what a lock pair allocates
					// with a cancellable context, not what making a
					// context allocates (context.WithTimeout alone is 4).
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					if deadline {
						ctx, cancel = context.WithTimeout(ctx, time.Hour)
					}
					defer cancel()
					for pb.Next() {
						err := m.Lock(ctx)
						if err == nil {
							err = m.Unlock(ctx)
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkHandOff measures the time from a holder's Unlock to a waiting
// owner's Lock returning, with the releaser stepping aside until the other
// holds the lock, so every acquisition is a hand-off to a waiter. The holder
// keeps the lock 1 ms so the other is already waiting. Each side has a
// Locker and client of its own, as two programs would. Reports p50 and p99.
func BenchmarkHandOff(b *testing.B) {
	addr := redistest.Single(b).Addr()
	for _, fair := range []bool{false, true} {
		b.Run(fmt.Sprintf("fair=%v", fair), func(b *testing.B) {
			var ms [2]*mutex.Mutex
			for g := range ms {
				l := newLocker(b, redistest.Client(b, addr), mutex.Options{Fair: fair})
				ms[g] = newMutex(b, l, fmt.Sprintf("handoff-bench-%v", fair))
			}
			benchHandOff(b, ms)
		})
	}
}

func benchHandOff(b *testing.B, ms [2]*mutex.Mutex) {
	// A deadline, as a request handler's context has (and the bench's).
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	var released atomic.Int64 // unix nanos of the last Unlock
	turn := [2]chan struct{}{make(chan struct{}, 1), make(chan struct{}, 1)}
	lat := make([]time.Duration, 0, b.N)
	done := make(chan error, 2)
	b.ResetTimer()
	for g := range 2 {
		go func() {
			var err error
			defer func() { done <- err }()
			for i := g; i < b.N+1; i += 2 {
				if i > 0 {
					<-turn[g] // the other holds the lock now: wait for it
				}
				if err = ms[g].Lock(ctx); err != nil {
					return
				}
				if i > 0 {
					lat = append(lat, time.Since(time.Unix(0, released.Load())))
				}
				turn[1-g] <- struct{}{} // the other may wait now
				time.Sleep(time.Millisecond)
				released.Store(time.Now().UnixNano())
				if err = ms[g].Unlock(ctx); err != nil {
					return
				}
			}
		}()
	}
	for range 2 {
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
}

// BenchmarkLockUnlockPerRequest is BenchmarkLockUnlock the way a request
// handler locks: a fresh Mutex for every pair (NewMutex, Lock, Unlock),
// with a deadline context made once per goroutine as there. One op is one
// pair, NewMutex included.
//
//	go test -run=NONE -bench=PerRequest -benchmem ./mutex
func BenchmarkLockUnlockPerRequest(b *testing.B) {
	for _, goroutines := range []int{1, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", goroutines), func(b *testing.B) {
			l := newLocker(b, redistest.Client(b, redistest.Single(b).Addr()), mutex.Options{})
			var next atomic.Int64
			spread(b, goroutines)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				name := "bench:" + strconv.FormatInt(next.Add(1), 10)
				ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
				defer cancel()
				for pb.Next() {
					m, err := l.NewMutex(name)
					if err == nil {
						err = m.Lock(ctx)
					}
					if err == nil {
						err = m.Unlock(ctx)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkTwoRoundTrips is BenchmarkLockUnlock's floor on the same client
// and server: two bare EVALSHAs of a one-GET script, back to back, the
// round trips any lock pair makes (Lock, then Unlock), with nothing of the
// library around them. BenchmarkLockUnlock's excess over it is what the
// library and its scripts cost a pair.
//
//	go test -run=NONE -bench='LockUnlock/ctx=deadline|TwoRoundTrips' -count=5 ./mutex
func BenchmarkTwoRoundTrips(b *testing.B) {
	for _, goroutines := range []int{1, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", goroutines), func(b *testing.B) {
			client := redistest.Client(b, redistest.Single(b).Addr())
			ctx := context.Background()
			sha, err := client.Do(ctx, client.B().ScriptLoad().Script("return redis.call('GET', KEYS[1])").Build()).ToString()
			if err != nil {
				b.Fatal(err)
			}
			var next atomic.Int64
			spread(b, goroutines)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				key := "bench:" + strconv.FormatInt(next.Add(1), 10)
				ctx, cancel := context.WithTimeout(ctx, time.Hour)
				defer cancel()
				for pb.Next() {
					for range 2 {
						if err := client.Do(ctx, client.B().Evalsha().Sha1(sha).Numkeys(1).Key(key).Build()).Error(); err != nil && !rueidis.IsRedisNil(err) {
							b.Error(err)
							return
						}
					}
				}
			})
		})
	}
}

// spread makes b.RunParallel run goroutines goroutines: fewer than
// GOMAXPROCS lowers GOMAXPROCS for the benchmark (restored at its end),
// more sets the parallelism.
func spread(b *testing.B, goroutines int) {
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism(max(1, goroutines/procs))
	if goroutines < procs {
		runtime.GOMAXPROCS(goroutines)
		b.Cleanup(func() { runtime.GOMAXPROCS(procs) })
	}
}
