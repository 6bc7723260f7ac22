package ratelimit

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// target is a Redis deployment the tests run against.
type target struct {
	name  string
	addrs func(t *testing.T) []string
}

var targets = []target{
	{"single", func(t *testing.T) []string { return []string{redistest.Single(t).Addr()} }},
	{"cluster", func(t *testing.T) []string { return redistest.SharedCluster(t).Addrs() }},
}

var algorithms = []Algorithm{FixedWindow, SlidingWindow, GCRA}

func newCache(t testing.TB, addrs ...string) *scriptcache.Cache {
	t.Helper()
	client := redistest.Client(t, addrs...)
	sc, err := scriptcache.New(context.Background(), client)
	if err != nil {
		t.Fatalf("scriptcache.New: %v", err)
	}
	rawClients.Store(sc, client)
	return sc
}

// rawClients holds the rueidis client of each cache newCache made, for
// tests that look at keys directly.
var rawClients sync.Map

// raw returns the rueidis client sc runs on.
func raw(sc *scriptcache.Cache) rueidis.Client {
	c, _ := rawClients.Load(sc)
	return c.(rueidis.Client)
}

// testPrefixes holds the prefix of each running test, by *testing.T.
var (
	testPrefixes sync.Map
	testRuns     atomic.Int64
)

// testPrefix gives each test its own keys on the shared servers: the same
// for every call in one test, and new for each run of it, so that tests
// survive -count=N.
func testPrefix(t *testing.T) string {
	if p, ok := testPrefixes.Load(t); ok {
		return p.(string)
	}
	p := "test:" + strings.NewReplacer("{", "(", "}", ")").Replace(t.Name()) + ":" + strconv.FormatInt(testRuns.Add(1), 10) + ":"
	p0, _ := testPrefixes.LoadOrStore(t, p)
	t.Cleanup(func() { testPrefixes.Delete(t) })
	return p0.(string)
}

func newLimiter(t *testing.T, sc *scriptcache.Cache, opts Options) *Limiter {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = testPrefix(t)
	}
	l, err := New(sc, opts)
	if err != nil {
		t.Fatalf("New(%+v): %v", opts, err)
	}
	return l
}

func allow(t *testing.T, l *Limiter, key string, n int) Result {
	t.Helper()
	res, err := l.AllowN(context.Background(), key, n)
	if err != nil {
		t.Fatalf("AllowN(%q, %d): %v", key, n, err)
	}
	return res
}

// forEach runs f for every target and algorithm.
func forEach(t *testing.T, f func(t *testing.T, sc *scriptcache.Cache, algo Algorithm)) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			sc := newCache(t, tg.addrs(t)...)
			for _, algo := range algorithms {
				t.Run(algo.String(), func(t *testing.T) { f(t, sc, algo) })
			}
		})
	}
}

func TestNewValidation(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	tests := []struct {
		name string
		opts Options
		want error
	}{
		{"zero rate", Options{Limit: Limit{Period: time.Second}}, ErrInvalidLimit},
		{"negative rate", Options{Limit: Limit{Rate: -1, Period: time.Second}}, ErrInvalidLimit},
		{"huge rate", Options{Limit: Limit{Rate: 2_000_000_000, Period: time.Second}}, ErrInvalidLimit},
		{"zero period", Options{Limit: Limit{Rate: 1}}, ErrInvalidLimit},
		{"nanosecond period", Options{Limit: Limit{Rate: 1, Period: time.Nanosecond}}, ErrInvalidLimit},
		{"ten year period", Options{Limit: Limit{Rate: 1, Period: 3650 * 24 * time.Hour}}, ErrInvalidLimit},
		{"negative burst", Options{Limit: Limit{Rate: 1, Period: time.Second, Burst: -1}}, ErrInvalidLimit},
		{"burst on fixed window", Options{Algorithm: FixedWindow, Limit: Limit{Rate: 1, Period: time.Second, Burst: 5}}, ErrInvalidLimit},
		{"burst refilling for years", Options{Limit: Limit{Rate: 1, Period: 300 * 24 * time.Hour, Burst: 2}}, ErrInvalidLimit},
		{"unknown algorithm", Options{Algorithm: 42, Limit: PerSecond(1)}, ErrInvalidAlgorithm},
		{"brace in prefix", Options{Limit: PerSecond(1), Prefix: "a{b"}, ErrInvalidPrefix},
		{"long prefix", Options{Limit: PerSecond(1), Prefix: strings.Repeat("p", 2000)}, ErrInvalidPrefix},
		{"negative deny cache size", Options{Limit: PerSecond(1), DenyCacheSize: -1}, ErrInvalidOptions},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := New(sc, tt.opts)
			if err == nil {
				t.Fatalf("New(%+v) = %v, nil; want an error", tt.opts, l)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("New(%+v) error %v; want %v", tt.opts, err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "ratelimit: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
	if _, err := New(nil, Options{Limit: PerSecond(1)}); !errors.Is(err, ErrNilCache) {
		t.Errorf("New(nil) error %v; want ErrNilCache", err)
	}
	for _, opts := range []Options{
		{Limit: PerSecond(1)},
		{Algorithm: FixedWindow, Limit: Limit{Rate: 5, Period: time.Second, Burst: 5}},
		{Algorithm: SlidingWindow, Limit: PerHour(1_000_000)},
		{Limit: Limit{Rate: 1_000_000_000, Period: time.Millisecond, Burst: 1_000_000_000}},
	} {
		if _, err := New(sc, opts); err != nil {
			t.Errorf("New(%+v): %v; want nil", opts, err)
		}
	}
}

func TestBadCallArguments(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	l := newLimiter(t, sc, Options{Limit: PerSecond(5)})
	ctx := context.Background()
	if _, err := l.Allow(ctx, ""); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("Allow(\"\") error %v; want ErrInvalidKey", err)
	}
	if _, err := l.Allow(ctx, strings.Repeat("k", 1025)); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("Allow(long key) error %v; want ErrInvalidKey", err)
	}
	if err := l.Reset(ctx, ""); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("Reset(\"\") error %v; want ErrInvalidKey", err)
	}
	if _, err := l.AllowN(ctx, "k", -1); !errors.Is(err, ErrInvalidCost) {
		t.Errorf("AllowN(-1) error %v; want ErrInvalidCost", err)
	}
	if _, err := l.AllowN(ctx, "k", 6); !errors.Is(err, ErrCostTooHigh) {
		t.Errorf("AllowN(6) with burst 5 error %v; want ErrCostTooHigh", err)
	}
}

// TestAllowCounts checks the results of a burst of calls for every
// algorithm: Limit allowed, Remaining counting down, the next denied with a
// RetryAfter inside the period, and Reset giving the limit back.
func TestAllowCounts(t *testing.T) {
	forEach(t, func(t *testing.T, sc *scriptcache.Cache, algo Algorithm) {
		l := newLimiter(t, sc, Options{Algorithm: algo, Limit: PerMinute(5), DisableDenyCache: true})
		for i := range 5 {
			res := allow(t, l, "k", 1)
			if !res.Allowed || res.Limit != 5 || res.Remaining != 4-i || res.RetryAfter != 0 {
				t.Fatalf("call %d: got %+v; want allowed, limit 5, remaining %d, no retry", i+1, res, 4-i)
			}
			if res.ResetAfter <= 0 || res.ResetAfter > 2*time.Minute {
				t.Fatalf("call %d: ResetAfter %v; want in (0, 2m]", i+1, res.ResetAfter)
			}
		}
		res := allow(t, l, "k", 1)
		if res.Allowed || res.Remaining != 0 {
			t.Fatalf("call 6: got %+v; want denied with 0 remaining", res)
		}
		// A sliding window may have to wait into the next window, until
		// the count there has faded enough.
		if res.RetryAfter <= 0 || res.RetryAfter > 2*time.Minute {
			t.Fatalf("call 6: RetryAfter %v; want in (0, 2m]", res.RetryAfter)
		}
		// Another key is independent.
		if res := allow(t, l, "other", 1); !res.Allowed || res.Remaining != 4 {
			t.Fatalf("other key: got %+v; want allowed with 4 remaining", res)
		}
		// A peek neither counts nor is refused.
		if res := allow(t, l, "other", 0); !res.Allowed || res.Remaining != 4 {
			t.Fatalf("peek: got %+v; want allowed with 4 remaining", res)
		}
		if err := l.Reset(context.Background(), "k"); err != nil {
			t.Fatalf("Reset: %v", err)
		}
		if res := allow(t, l, "k", 1); !res.Allowed || res.Remaining != 4 {
			t.Fatalf("after Reset: got %+v; want allowed with 4 remaining", res)
		}
	})
}

func TestAllowN(t *testing.T) {
	forEach(t, func(t *testing.T, sc *scriptcache.Cache, algo Algorithm) {
		l := newLimiter(t, sc, Options{Algorithm: algo, Limit: PerHour(10)})
		if res := allow(t, l, "k", 7); !res.Allowed || res.Remaining != 3 {
			t.Fatalf("AllowN(7): got %+v; want allowed with 3 remaining", res)
		}
		// Too heavy: denied, and not counted.
		if res := allow(t, l, "k", 4); res.Allowed || res.Remaining != 3 || res.RetryAfter <= 0 {
			t.Fatalf("AllowN(4): got %+v; want denied with 3 remaining and a RetryAfter", res)
		}
		// The cost-4 denial must not make the deny cache refuse cost 3.
		if res := allow(t, l, "k", 3); !res.Allowed || res.Remaining != 0 {
			t.Fatalf("AllowN(3): got %+v; want allowed with 0 remaining", res)
		}
		if res := allow(t, l, "k", 1); res.Allowed {
			t.Fatalf("AllowN(1) when full: got %+v; want denied", res)
		}
	})
}

// TestKeysStayInPrefix checks that hostile keys land under the prefix, in
// one slot, and do not collide with each other.
func TestKeysStayInPrefix(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			sc := newCache(t, tg.addrs(t)...)
			for _, algo := range algorithms {
				l := newLimiter(t, sc, Options{Algorithm: algo, Limit: PerMinute(1), DisableDenyCache: true})
				hostile := []string{"}", "{", "}{", "a}b", "{x}", "~", "~}", "\x00\r\n*3", "a:f", "../../etc", strings.Repeat("}", 1024)}
				for _, key := range hostile {
					if res := allow(t, l, key, 1); !res.Allowed {
						t.Fatalf("%v: first call for %q denied (%+v): keys collide", algo, key, res)
					}
					full := l.RedisKey(key)
					if !strings.HasPrefix(full, l.prefix+"{") {
						t.Fatalf("key %q outside prefix %q", full, l.prefix)
					}
					exists, err := raw(sc).Do(context.Background(), raw(sc).B().Exists().Key(full).Build()).AsInt64()
					if err != nil || exists != 1 {
						t.Fatalf("EXISTS %q = %d, %v; want 1", full, exists, err)
					}
				}
			}
		})
	}
}

// ttl returns the PTTL of the limiter's key.
func ttl(t *testing.T, sc *scriptcache.Cache, l *Limiter, key string) time.Duration {
	t.Helper()
	c := raw(sc)
	ms, err := c.Do(context.Background(), c.B().Pttl().Key(l.RedisKey(key)).Build()).AsInt64()
	if err != nil {
		t.Fatalf("PTTL: %v", err)
	}
	return time.Duration(ms) * time.Millisecond
}

// TestKeysHaveTTL checks that every algorithm's key expires, after allowed
// and after denied calls.
func TestKeysHaveTTL(t *testing.T) {
	forEach(t, func(t *testing.T, sc *scriptcache.Cache, algo Algorithm) {
		l := newLimiter(t, sc, Options{Algorithm: algo, Limit: PerMinute(2), DisableDenyCache: true})
		for i := range 4 {
			allow(t, l, "k", 1)
			if d := ttl(t, sc, l, "k"); d <= 0 || d > 2*time.Minute {
				t.Fatalf("after call %d: PTTL %v; want in (0, 2m]", i+1, d)
			}
		}
	})
}

// TestFixedWindowRepairsTTL simulates the counter an older, non-atomic
// client left behind when it crashed between INCR and EXPIRE.
func TestFixedWindowRepairsTTL(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			sc := newCache(t, tg.addrs(t)...)
			l := newLimiter(t, sc, Options{Algorithm: FixedWindow, Limit: PerMinute(100), DisableDenyCache: true})
			c := raw(sc)
			for _, tc := range []struct {
				key     string
				count   string
				allowed bool
			}{{"over", "150", false}, {"under", "3", true}} {
				full := keyspace.Key(l.prefix, tc.key, l.suffix)
				if err := c.Do(context.Background(), c.B().Set().Key(full).Value(tc.count).Build()).Error(); err != nil {
					t.Fatal(err)
				}
				if d := ttl(t, sc, l, tc.key); d != -time.Millisecond {
					t.Fatalf("set-up: PTTL %v; want -1ms (no TTL)", d)
				}
				res := allow(t, l, tc.key, 1)
				if res.Allowed != tc.allowed {
					t.Fatalf("count %s: Allowed %v; want %v", tc.count, res.Allowed, tc.allowed)
				}
				// Generous: the machine may be slow, and a counter repaired
				// with another TTL (the cost's milliseconds) is far below.
				if d := ttl(t, sc, l, tc.key); d <= 30*time.Second || d > time.Minute {
					t.Fatalf("count %s: PTTL %v after the call; want in (30s, 1m]: the window given again", tc.count, d)
				}
				// The whole window again, allowed or denied.
				if res.ResetAfter != time.Minute || (!res.Allowed && res.RetryAfter != res.ResetAfter) {
					t.Fatalf("count %s: got %+v; want ResetAfter 1m, the window given again (= RetryAfter when denied)", tc.count, res)
				}
			}
		})
	}
}

// TestFixedWindowDenialWritesNothing checks the fixed window's raise-then-
// lower path: a denied request leaves the counter and its TTL as it found
// them, and one that finds no counter (the script called directly with a
// cost above the limit, which the Limiter refuses before sending) leaves no
// key, not a counter of zero without a TTL.
func TestFixedWindowDenialWritesNothing(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			sc := newCache(t, tg.addrs(t)...)
			l := newLimiter(t, sc, Options{Algorithm: FixedWindow, Limit: PerMinute(3), DisableDenyCache: true})
			c := raw(sc)
			ctx := context.Background()
			if res := allow(t, l, "k", 2); !res.Allowed || res.Remaining != 1 {
				t.Fatalf("AllowN(2): got %+v; want allowed, 1 remaining", res)
			}
			if res := allow(t, l, "k", 2); res.Allowed || res.Remaining != 1 || res.RetryAfter <= 0 {
				t.Fatalf("AllowN(2) past the limit: got %+v; want denied, 1 remaining, a RetryAfter", res)
			}
			full := keyspace.Key(l.prefix, "k", l.suffix)
			if v, err := c.Do(ctx, c.B().Get().Key(full).Build()).ToString(); err != nil || v != "2" {
				t.Fatalf("counter after a denial = %q, %v; want 2", v, err)
			}
			if d := ttl(t, sc, l, "k"); d <= 0 || d > time.Minute {
				t.Fatalf("PTTL after a denial %v; want in (0, 1m]", d)
			}

			script, err := sc.Script("ratelimit_fixed")
			if err != nil {
				t.Fatal(err)
			}
			fresh := keyspace.Key(l.prefix, "fresh", l.suffix)
			got, err := script.Exec(ctx, []string{fresh}, []string{"3", "60000", "4"}).AsIntSlice()
			if err != nil || len(got) != 3 || got[0] != 0 || got[1] != 0 {
				t.Fatalf("cost 4 of 3 on no counter: %v, %v; want {0, 0, _}", got, err)
			}
			if n, err := c.Do(ctx, c.B().Exists().Key(fresh).Build()).AsInt64(); err != nil || n != 0 {
				t.Fatalf("EXISTS after that denial = %d, %v; want 0", n, err)
			}
		})
	}
}

// TestGCRARetryAfterAccurate checks RetryAfter against the time that passed
// between two calls: with burst 1 at 10/s, a call made d after an allowed one
// must be told to wait 100ms - d. The bounds hold whatever the scheduling
// delays are, since d is bounded by the wall time around both calls.
func TestGCRARetryAfterAccurate(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			sc := newCache(t, tg.addrs(t)...)
			l := newLimiter(t, sc, Options{Limit: Limit{Rate: 10, Period: time.Second, Burst: 1}, DisableDenyCache: true})
			start := time.Now()
			first := allow(t, l, "k", 1)
			second := allow(t, l, "k", 1)
			wall := time.Since(start)
			if !first.Allowed || first.ResetAfter != 100*time.Millisecond {
				t.Fatalf("first call: got %+v; want allowed, ResetAfter 100ms", first)
			}
			if second.Allowed {
				t.Fatalf("second call: got %+v; want denied", second)
			}
			lo := 100*time.Millisecond - wall - time.Millisecond
			if second.RetryAfter < lo || second.RetryAfter > 100*time.Millisecond {
				t.Fatalf("RetryAfter %v; want in [%v, 100ms] (%v passed)", second.RetryAfter, lo, wall)
			}
			if second.ResetAfter != second.RetryAfter {
				t.Fatalf("ResetAfter %v; want RetryAfter %v for burst 1", second.ResetAfter, second.RetryAfter)
			}
			// Waiting exactly RetryAfter after the denial is enough: the server
			// clock has moved at least that far by the next call.
			time.Sleep(second.RetryAfter)
			if third := allow(t, l, "k", 1); !third.Allowed {
				t.Fatalf("call after RetryAfter: got %+v; want allowed", third)
			}
		})
	}
}

// TestSlidingWindowSmoothsBoundary fills a window, then checks that in the
// next window the previous count still weighs: a fixed window would allow
// the whole limit again right after the boundary.
func TestSlidingWindowSmoothsBoundary(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	const window = time.Second
	l := newLimiter(t, sc, Options{Algorithm: SlidingWindow, Limit: Limit{Rate: 10, Period: window}, DisableDenyCache: true})
	// Start early in a window (windows are aligned on the server clock) so
	// that all ten calls land in it.
	c := raw(sc)
	if !redistest.WaitFor(context.Background(), 5*time.Second, func() bool {
		tm, err := c.Do(context.Background(), c.B().Time().Build()).AsStrSlice()
		if err != nil || len(tm) != 2 {
			return false
		}
		us, _ := strconv.ParseInt(tm[1], 10, 64)
		return us < 300_000
	}) {
		t.Fatal("server clock never in the first 300ms of a second")
	}
	for i := range 10 {
		if res := allow(t, l, "k", 1); !res.Allowed {
			t.Fatalf("call %d: got %+v; want allowed", i+1, res)
		}
	}
	denied := allow(t, l, "k", 1)
	if denied.Allowed || denied.RetryAfter <= window-300*time.Millisecond || denied.RetryAfter > 2*window {
		t.Fatalf("call 11: got %+v; want denied, RetryAfter past the window's end", denied)
	}
	time.Sleep(denied.RetryAfter)
	if res := allow(t, l, "k", 1); !res.Allowed {
		t.Fatalf("after RetryAfter: got %+v; want allowed", res)
	}
	allowed := 1
	for allow(t, l, "k", 1).Allowed {
		allowed++
	}
	if allowed >= 10 {
		t.Fatalf("right after the boundary %d calls passed; want fewer than 10 (the previous window still weighs)", allowed)
	}
}

// TestConcurrentExact has 32 goroutines of one process race for one key.
func TestConcurrentExact(t *testing.T) {
	forEach(t, func(t *testing.T, sc *scriptcache.Cache, algo Algorithm) {
		l := newLimiter(t, sc, Options{Algorithm: algo, Limit: PerHour(100)})
		var mu sync.Mutex
		allowed := 0
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for range 10 {
					res, err := l.Allow(context.Background(), "k")
					if err != nil {
						t.Error(err)
						return
					}
					if res.Allowed {
						mu.Lock()
						allowed++
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		if allowed != 100 {
			t.Fatalf("allowed %d of 320; want exactly 100", allowed)
		}
	})
}

func TestLimitString(t *testing.T) {
	for _, tt := range []struct {
		l    Limit
		want string
	}{
		{PerSecond(3), "3/1s"},
		{PerMinute(60), "60/1m0s"},
		{PerDay(1000), "1000/24h0m0s"},
		{Limit{Rate: 1, Period: time.Hour, Burst: 5}, "1/1h0m0s, burst 5"},
	} {
		if got := tt.l.String(); got != tt.want {
			t.Errorf("%#v.String() = %q; want %q", tt.l, got, tt.want)
		}
	}
	if got := Algorithm(9).String(); got != "Algorithm(9)" {
		t.Errorf("Algorithm(9).String() = %q", got)
	}
}

// TestRoundPeriods uses periods whose millisecond counts Redis 7 would
// print in exponent form ("1e+08") if a script passed them to a command as
// Lua numbers; PEXPIRE and SET PX reject that.
func TestRoundPeriods(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	for _, algo := range algorithms {
		for _, period := range []time.Duration{100_000 * time.Second, 1_000_000 * time.Second} {
			l := newLimiter(t, sc, Options{Algorithm: algo, Limit: Limit{Rate: 1, Period: period}, DisableDenyCache: true})
			if res := allow(t, l, "k"+period.String(), 1); !res.Allowed {
				t.Fatalf("%v, period %v: got %+v; want allowed", algo, period, res)
			}
		}
	}
}

// TestCostAboveLimit checks the documented choice: a cost above what the
// limit can ever allow at once is ErrCostTooHigh without a round trip, for
// every algorithm, while the largest cost that fits is allowed on a fresh
// key.
func TestCostAboveLimit(t *testing.T) {
	srv := redistest.NewServer(t)
	sc := newCache(t, srv.Addr())
	for _, tc := range []struct {
		opts     Options
		capacity int
	}{
		{Options{Algorithm: FixedWindow, Limit: PerMinute(5)}, 5},
		{Options{Algorithm: SlidingWindow, Limit: PerMinute(5)}, 5},
		{Options{Algorithm: GCRA, Limit: PerMinute(5)}, 5},
		{Options{Algorithm: GCRA, Limit: Limit{Rate: 5, Period: time.Minute, Burst: 8}}, 8},
	} {
		t.Run(tc.opts.Algorithm.String()+"/"+tc.opts.Limit.String(), func(t *testing.T) {
			l := newLimiter(t, sc, tc.opts)
			resetStats(t, srv)
			res, err := l.AllowN(context.Background(), "k", tc.capacity+1)
			if !errors.Is(err, ErrCostTooHigh) || res != (Result{}) {
				t.Fatalf("AllowN(%d) = %+v, %v; want ErrCostTooHigh", tc.capacity+1, res, err)
			}
			if got := evalshaCalls(t, srv); got != 0 {
				t.Fatalf("AllowN(%d) ran %d scripts; want 0", tc.capacity+1, got)
			}
			if res := allow(t, l, "k", tc.capacity); !res.Allowed || res.Remaining != 0 {
				t.Fatalf("AllowN(%d) on a fresh key: got %+v; want allowed with 0 remaining", tc.capacity, res)
			}
		})
	}
}

// TestLimitInKey checks both sides of the default keying: Limiters with
// different limits on one prefix (the default, say) never share a counter,
// and Limiters with the same limit do, whatever process they are in, so
// that a fleet counts together.
func TestLimitInKey(t *testing.T) {
	forEach(t, func(t *testing.T, sc *scriptcache.Cache, algo Algorithm) {
		prefix := testPrefix(t)
		newL := func(lim Limit) *Limiter {
			return newLimiter(t, sc, Options{Algorithm: algo, Limit: lim, Prefix: prefix, DisableDenyCache: true})
		}
		two, twoAgain, three := newL(PerMinute(2)), newL(PerMinute(2)), newL(PerMinute(3))
		ratesOf := map[*Limiter]string{two: "2/min", twoAgain: "2/min (another Limiter)", three: "3/min"}
		if two.RedisKey("k") == three.RedisKey("k") {
			t.Fatalf("limits 2/min and 3/min share the key %q", two.RedisKey("k"))
		}
		if two.RedisKey("k") != twoAgain.RedisKey("k") {
			t.Fatalf("two Limiters of 2/min have keys %q and %q", two.RedisKey("k"), twoAgain.RedisKey("k"))
		}
		// 2/min allows two, then refuses; the second Limiter of the same
		// limit sees those two; 3/min still has all three.
		for i, c := range []struct {
			l    *Limiter
			want bool
		}{{two, true}, {twoAgain, true}, {two, false}, {twoAgain, false}, {three, true}, {three, true}, {three, true}, {three, false}} {
			if res := allow(t, c.l, "k", 1); res.Allowed != c.want {
				t.Fatalf("call %d, %s: allowed %v, want %v (%+v)", i+1, ratesOf[c.l], res.Allowed, c.want, res)
			}
		}
		if got := ttl(t, sc, three, "k"); got <= 0 {
			t.Fatalf("PTTL of %s = %v, want > 0: RedisKey does not name the key Allow wrote", three.RedisKey("k"), got)
		}
	})
}
