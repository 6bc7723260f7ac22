package mutex_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// BenchmarkRWMutex measures acquire+release pairs of one read-write lock
// from 16 goroutines (each its own RWMutex), with writes=0% (readers
// share: no waiting), 10% and 100% (every pair excludes the others, like a
// Mutex). One op is one pair.
//
//	go test -run=NONE -bench=RWMutex ./mutex
func BenchmarkRWMutex(b *testing.B) {
	for _, writes := range []int{0, 10, 100} {
		b.Run(fmt.Sprintf("writes=%d%%", writes), func(b *testing.B) {
			l := newLocker(b, redistest.Client(b, redistest.Single(b).Addr()), mutex.Options{})
			name := "rw-bench:" + strconv.Itoa(writes)
			var n atomic.Int64
			b.SetParallelism(8)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				rw, err := l.NewRWMutex(name)
				if err != nil {
					b.Error(err)
					return
				}
				for pb.Next() {
					acquire, release := rw.RLock, rw.RUnlock
					if int(n.Add(1)%100) < writes {
						acquire, release = rw.Lock, rw.Unlock
					}
					if err := acquire(ctx); err != nil {
						b.Error(err)
						return
					}
					if err := release(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkMultiMutex measures Lock+Unlock of sets of 2 and 8 names, each
// goroutine on its own names (no contention), on a single server and on a
// cluster where the names spread over the nodes: the cost is a round trip
// per name and step.
func BenchmarkMultiMutex(b *testing.B) {
	targets := map[string]func(b *testing.B) []string{
		"single":  func(b *testing.B) []string { return []string{redistest.Single(b).Addr()} },
		"cluster": func(b *testing.B) []string { return redistest.SharedCluster(b).Addrs() },
	}
	for _, target := range []string{"single", "cluster"} {
		for _, size := range []int{2, 8} {
			b.Run(fmt.Sprintf("%s/names=%d", target, size), func(b *testing.B) {
				l := newLocker(b, redistest.Client(b, targets[target](b)...), mutex.Options{})
				var next atomic.Int64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					ctx := context.Background()
					g := next.Add(1)
					var names []string
					for i := range size {
						names = append(names, fmt.Sprintf("multi-bench:%d:%d", g, i))
					}
					mm, err := l.NewMultiMutex(names)
					if err != nil {
						b.Error(err)
						return
					}
					for pb.Next() {
						if err := mm.Lock(ctx); err != nil {
							b.Error(err)
							return
						}
						if err := mm.Unlock(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
