package goredis_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice/goredis"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/scriptcache"
)

// benchCache returns a script cache on a go-redis client of the shared
// server, with ContextTimeoutEnabled as given.
func benchCache(b *testing.B, ctxTimeout bool) *scriptcache.Cache {
	b.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redistest.Single(b).Addr(), ContextTimeoutEnabled: ctxTimeout})
	b.Cleanup(func() { rdb.Close() })
	sc, err := goredis.New(context.Background(), rdb)
	if err != nil {
		b.Fatal(err)
	}
	return sc
}

// benchParallel runs op from goroutines goroutines, each with a context
// with a deadline made once, as a request handler's would be (a context
// per op would count context.WithTimeout's own allocations); g numbers
// the goroutine.
func benchParallel(b *testing.B, goroutines int, op func(ctx context.Context, g int64) error) {
	var next atomic.Int64
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism(max(1, goroutines/procs))
	if goroutines < procs {
		runtime.GOMAXPROCS(goroutines)
		defer runtime.GOMAXPROCS(procs)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		g := next.Add(1)
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		for pb.Next() {
			if err := op(ctx, g); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkGoRedis measures, on go-redis, a Lock and Unlock pair on a
// fresh Mutex (one op: NewMutex, Lock, Unlock, on a name of the
// goroutine's own) and a fixed-window Allow, at 1 and 64 goroutines, with
// the client's ContextTimeoutEnabled off (go-redis's default) and on.
// Allocations are the whole process's, go-redis's included.
//
//	go test -run=NONE -bench=GoRedis -benchmem ./goredis
func BenchmarkGoRedis(b *testing.B) {
	for _, ctxTimeout := range []bool{false, true} {
		for _, goroutines := range []int{1, 64} {
			name := fmt.Sprintf("ctxtimeout=%v/goroutines=%d", ctxTimeout, goroutines)
			b.Run("lock/"+name, func(b *testing.B) {
				locks, err := mutex.NewLocker(benchCache(b, ctxTimeout), mutex.Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer locks.Close()
				benchParallel(b, goroutines, func(ctx context.Context, g int64) error {
					m, err := locks.NewMutex("bench:" + strconv.FormatInt(g, 10))
					if err == nil {
						err = m.Lock(ctx)
					}
					if err == nil {
						err = m.Unlock(ctx)
					}
					return err
				})
			})
			b.Run("allow/"+name, func(b *testing.B) {
				l, err := ratelimit.New(benchCache(b, ctxTimeout), ratelimit.Options{Algorithm: ratelimit.FixedWindow, Limit: ratelimit.PerSecond(1_000_000_000)})
				if err != nil {
					b.Fatal(err)
				}
				benchParallel(b, goroutines, func(ctx context.Context, g int64) error {
					_, err := l.Allow(ctx, "bench")
					return err
				})
			})
		}
	}
}
