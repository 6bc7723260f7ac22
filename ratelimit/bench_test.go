package ratelimit

import (
	"context"
	"net/http"
	"net/netip"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// BenchmarkAllow measures allowed calls over many keys, with 1 and 64
// goroutines, for each algorithm, on the shared real server.
func BenchmarkAllow(b *testing.B) {
	sc := newCache(b, redistest.Single(b).Addr())
	for _, algo := range algorithms {
		for _, g := range []int{1, 64} {
			b.Run(algo.String()+"/goroutines="+strconv.Itoa(g), func(b *testing.B) {
				l, err := New(sc, Options{Algorithm: algo, Limit: Limit{Rate: 1_000_000_000, Period: time.Hour}, Prefix: "bench:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"})
				if err != nil {
					b.Fatal(err)
				}
				run(b, g, func(i int64) string { return keys[i%int64(len(keys))] }, l)
			})
		}
	}
}

// BenchmarkFlood measures one key that is over its limit, hammered by 64
// goroutines, with and without the deny cache.
func BenchmarkFlood(b *testing.B) {
	sc := newCache(b, redistest.Single(b).Addr())
	for _, algo := range algorithms {
		for _, disable := range []bool{false, true} {
			name := algo.String() + "/denycache=on"
			if disable {
				name = algo.String() + "/denycache=off"
			}
			b.Run(name, func(b *testing.B) {
				l, err := New(sc, Options{Algorithm: algo, Limit: PerHour(1), DisableDenyCache: disable,
					Prefix: "bench:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"})
				if err != nil {
					b.Fatal(err)
				}
				l.Allow(context.Background(), "203.0.113.7")
				run(b, 64, func(int64) string { return "203.0.113.7" }, l)
			})
		}
	}
}

var keys = func() []string {
	k := make([]string, 10_000)
	for i := range k {
		k[i] = "198.51." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
	}
	return k
}()

func run(b *testing.B, goroutines int, key func(int64) string, l *Limiter) {
	ctx := context.Background()
	var n atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	if goroutines == 1 {
		for i := 0; b.Loop(); i++ {
			if _, err := l.Allow(ctx, key(int64(i))); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.SetParallelism(max(goroutines/runtime.GOMAXPROCS(0), 1))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Allow(ctx, key(n.Add(1))); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkMiddlewareFlood measures the whole middleware under a flood from
// one IP at 64 goroutines, with and without the deny cache.
func BenchmarkMiddlewareFlood(b *testing.B) {
	sc := newCache(b, redistest.Single(b).Addr())
	for _, disable := range []bool{false, true} {
		b.Run("denycache="+map[bool]string{false: "on", true: "off"}[disable], func(b *testing.B) {
			l, err := New(sc, Options{Algorithm: FixedWindow, Limit: PerHour(1), DisableDenyCache: disable,
				Prefix: "bench:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"})
			if err != nil {
				b.Fatal(err)
			}
			var errs atomic.Int64
			h := MustNewMiddleware(l, MiddlewareOptions{OnError: func(*http.Request, error) { errs.Add(1) }})(okHandler)
			defer func() {
				if n := errs.Load(); n > 0 {
					b.Logf("%d requests not checked (Redis slower than the timeout)", n)
				}
			}()
			b.ReportAllocs()
			b.SetParallelism(max(64/runtime.GOMAXPROCS(0), 1))
			b.RunParallel(func(pb *testing.PB) {
				r := request("203.0.113.7:1234")
				w := discard{http.Header{}}
				for pb.Next() {
					clear(w.h)
					h.ServeHTTP(w, r)
				}
			})
		})
	}
}

// discard is a ResponseWriter that keeps nothing but its header map.
type discard struct{ h http.Header }

func (d discard) Header() http.Header       { return d.h }
func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) WriteHeader(int)             {}

// BenchmarkPolicies compares one two-policy decision (GCRA per second and
// a fixed window per hour) with the single-policy Allow of GCRA, over many
// keys with 64 goroutines, in one run on the shared real server. Target:
// two policies at 0.9x the single policy's ops/s or better.
func BenchmarkPolicies(b *testing.B) {
	sc := newCache(b, redistest.Single(b).Addr())
	ctx := context.Background()
	prefix := func() string { return "bench:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":" }
	for _, g := range []int{1, 64} {
		b.Run("single/goroutines="+strconv.Itoa(g), func(b *testing.B) {
			l, err := New(sc, Options{Limit: Limit{Rate: 1_000_000_000, Period: time.Hour}, Prefix: prefix()})
			if err != nil {
				b.Fatal(err)
			}
			run(b, g, func(i int64) string { return keys[i%int64(len(keys))] }, l)
		})
		b.Run("two/goroutines="+strconv.Itoa(g), func(b *testing.B) {
			l, err := New(sc, Options{Limit: PerSecond(1), Prefix: prefix()})
			if err != nil {
				b.Fatal(err)
			}
			ps, err := NewPolicies(
				Policy{Name: "second", Limit: Limit{Rate: 1_000_000_000, Period: time.Second}},
				Policy{Name: "hour", Algorithm: FixedWindow, Limit: Limit{Rate: 1_000_000_000, Period: time.Hour}},
			)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			if g == 1 {
				for i := 0; b.Loop(); i++ {
					if _, err := l.AllowPolicies(ctx, keys[i%len(keys)], 1, ps); err != nil {
						b.Fatal(err)
					}
				}
				return
			}
			var n atomic.Int64
			b.SetParallelism(max(g/runtime.GOMAXPROCS(0), 1))
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := l.AllowPolicies(ctx, keys[n.Add(1)%int64(len(keys))], 1, ps); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkMiddlewareAllowed measures the whole middleware on its allowed
// path: many client IPs behind a trusted proxy (X-Forwarded-For), each far
// below its limit, so that every request asks Redis; with 1 goroutine its
// ns/op is the middleware's latency, with 64 its throughput. Set against
// BenchmarkAllow, it shows the middleware's own work (client IP, key,
// bounded context, header fields).
func BenchmarkMiddlewareAllowed(b *testing.B) {
	sc := newCache(b, redistest.Single(b).Addr())
	proxies := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	for _, g := range []int{1, 64} {
		b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) {
			l, err := New(sc, Options{Limit: PerSecond(1_000_000_000), Prefix: "bench:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"})
			if err != nil {
				b.Fatal(err)
			}
			mw, err := NewMiddleware(l, MiddlewareOptions{TrustedProxies: proxies, ClientIPHeader: XForwardedFor})
			if err != nil {
				b.Fatal(err)
			}
			h := mw(okHandler)
			reqs := make([]*http.Request, 4096)
			for i := range reqs {
				reqs[i] = request("127.0.0.1:1234", "X-Forwarded-For", "10.0."+strconv.Itoa(i/256)+"."+strconv.Itoa(i%256))
			}
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(max(g/runtime.GOMAXPROCS(0), 1))
			b.RunParallel(func(pb *testing.PB) {
				w := discard{http.Header{}}
				for pb.Next() {
					clear(w.h)
					h.ServeHTTP(w, reqs[n.Add(1)%int64(len(reqs))])
				}
			})
		})
	}
}
