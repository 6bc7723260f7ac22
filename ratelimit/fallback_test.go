package ratelimit

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// slowLimiter returns a limiter whose Redis is behind a proxy, and the
// proxy, whose latency the test may raise past the middleware's timeout.
func slowLimiter(t *testing.T, opts Options) (*Limiter, *faultproxy.Proxy) {
	t.Helper()
	srv := redistest.NewServer(t)
	p, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	sc := newCache(t, p.Addr())
	return newLimiter(t, sc, opts), p
}

// TestFallbackLocalUnderAttack is the attack of issue 14: Redis is slowed
// past the timeout, one client
// floods, and 65,536 other keys (IPv6 /64s, four times the local limiter's
// capacity) are spread around it. With FallbackLocal the flooding client
// still gets exactly its burst; with FallbackOpen it gets everything.
func TestFallbackLocalUnderAttack(t *testing.T) {
	const burst = 5
	l, p := slowLimiter(t, Options{Algorithm: FixedWindow, Limit: PerHour(burst)})
	// Past the timeout below however loaded the machine: no reply can
	// come sooner than the proxy's latency.
	p.SetLatency(200*time.Millisecond, 0)
	var errs errRecorder
	m := testMiddleware(t, l, MiddlewareOptions{
		Fallback: FallbackLocal,
		Timeout:  20 * time.Millisecond,
		// No second look at Redis during the test: every request after
		// the first is decided locally, as with a Redis kept slow.
		LocalHold: time.Hour,
		OnError:   errs.record,
	})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(okHandler, w, r) })
	const (
		spread = 65_536
		every  = 16 // one flooding request per 16 others
	)
	flooder := request("[2001:db8:ffff:ffff::1]:1")
	floodOK, otherDenied := 0, 0
	for i := range spread {
		if i%every == 0 {
			if w := serve(h, flooder); w.Code == http.StatusOK {
				floodOK++
			} else if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
				t.Fatalf("flooding request: status %d, Retry-After %q; want 429 with Retry-After", w.Code, w.Header().Get("Retry-After"))
			}
		}
		r := request(fmt.Sprintf("[2001:db8:%x:%x::1]:1", i>>8, i&0xff))
		if w := serve(h, r); w.Code != http.StatusOK {
			otherDenied++
		}
	}
	if floodOK != burst {
		t.Errorf("flooding client: %d of %d requests served; want exactly its burst %d", floodOK, spread/every, burst)
	}
	if otherDenied != 0 {
		t.Errorf("%d first requests of fresh keys denied; want 0", otherDenied)
	}
	if n := m.local.len(); n > DefaultLocalKeys {
		t.Errorf("local limiter holds %d keys; want at most %d", n, DefaultLocalKeys)
	}
	if got := len(errs.list()); got != 1 {
		t.Errorf("%d errors reported; want 1 (one Redis timeout, then local decisions for LocalHold)", got)
	}

	// The hole FallbackLocal closes: FallbackOpen serves the flooding
	// client that the local limiter denies.
	open := MustNewMiddleware(l, MiddlewareOptions{Timeout: 20 * time.Millisecond, OnError: func(*http.Request, error) {}})(okHandler)
	for i := range 2 {
		if w := serve(open, flooder); w.Code != http.StatusOK {
			t.Errorf("FallbackOpen, flooding request %d: status %d; want 200 (the fail-open hole)", i+1, w.Code)
		}
	}
}

// testMiddleware returns the middleware's internals, for tests of its state.
func testMiddleware(t *testing.T, l *Limiter, opts MiddlewareOptions) *middleware {
	t.Helper()
	m, err := newMiddleware(l, opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestLocalLimiterAccuracy checks the local bucket on a clock the test
// moves: burst at once, then one per interval, denials not counted, and
// RetryAfter exact.
func TestLocalLimiterAccuracy(t *testing.T) {
	c := newLocalLimiter(16)
	ps := []localPolicy{localPolicyOf(Limit{Rate: 1, Period: time.Second}, 3)}
	now := c.base.Add(time.Hour)
	res := make([]Result, 1)
	for i := range 3 {
		if !c.allow("k", now, 1, ps, res) || res[0].Remaining != 2-i {
			t.Fatalf("call %d: %+v; want allowed with %d remaining", i+1, res[0], 2-i)
		}
	}
	for range 2 {
		if c.allow("k", now, 1, ps, res) || res[0].RetryAfter != time.Second || res[0].Remaining != 0 || res[0].ResetAfter != 3*time.Second {
			t.Fatalf("call 4: %+v; want denied, retry 1s, reset 3s", res[0])
		}
	}
	if c.allow("k", now.Add(999*time.Millisecond), 1, ps, res) {
		t.Fatalf("at 999ms: allowed; want denied")
	}
	if !c.allow("k", now.Add(time.Second), 1, ps, res) || res[0].Remaining != 0 {
		t.Fatalf("at 1s: %+v; want allowed with 0 remaining", res[0])
	}
	if c.allow("k", now.Add(time.Second), 2, ps, res) || res[0].RetryAfter != 2*time.Second {
		t.Fatalf("cost 2 at 1s: %+v; want denied with retry 2s", res[0])
	}
}

// TestLocalLimiterMultiPolicy checks that a request is counted in every
// policy only when all allow it.
func TestLocalLimiterMultiPolicy(t *testing.T) {
	c := newLocalLimiter(16)
	ps := []localPolicy{
		localPolicyOf(PerSecond(2), 2),
		localPolicyOf(PerHour(3), 3),
	}
	now := c.base.Add(time.Hour)
	res := make([]Result, 2)
	for i := range 2 {
		if !c.allow("k", now, 1, ps, res) {
			t.Fatalf("call %d denied: %+v", i+1, res)
		}
	}
	// The per-second policy denies; the hourly one must not be charged.
	if c.allow("k", now, 1, ps, res) || res[0].Allowed || !res[1].Allowed || res[1].Remaining != 1 {
		t.Fatalf("call 3: %+v; want denied by the per-second policy, the hourly one with room and 1 remaining", res)
	}
	if !c.allow("k", now.Add(time.Second), 1, ps, res) || res[1].Remaining != 0 {
		t.Fatalf("call 4 a second later: %+v; want allowed, hourly policy with 0 remaining", res)
	}
	if c.allow("k", now.Add(time.Minute), 1, ps, res) || !res[0].Allowed || res[0].Remaining != 2 || res[1].Allowed || res[1].RetryAfter <= 0 {
		t.Fatalf("call 5 a minute later: %+v; want denied by the hourly policy only", res)
	}
}

// TestLocalLimiterEachReportsUncountedBucket: allowEach (the local
// fallback of counters) counts a request in no bucket when an enforced one
// denies it, and reports each bucket that had room as it is, neither
// charged nor refilled: its Remaining is what its earlier requests left,
// its ResetAfter when they have drained. A mutant that added the wait
// instead of taking it off (issue 32, seed 6) reported the used bucket as
// fuller than its burst, and only the single-bucket paths were checked.
func TestLocalLimiterEachReportsUncountedBucket(t *testing.T) {
	c := newLocalLimiter(16)
	ps := []localPolicy{localPolicyOf(PerSecond(2), 2), localPolicyOf(PerHour(3), 3)}
	keys := []string{"second", "hour"}
	costs, enforced := []int{1, 1}, []bool{true, true}
	now := c.base.Add(time.Hour)
	res := make([]Result, 2)
	for i := range 2 {
		if !c.allowEach(keys, now, costs, enforced, ps, res) {
			t.Fatalf("call %d denied: %+v", i+1, res)
		}
	}
	if c.allowEach(keys, now, costs, enforced, ps, res) || res[0].Allowed || !res[1].Allowed {
		t.Fatalf("call 3: %+v; want denied by the per-second bucket, the hourly one with room", res)
	}
	if r := res[1]; r.Remaining != 1 || r.ResetAfter != 40*time.Minute || r.RetryAfter != 0 {
		t.Errorf("the hourly bucket beside the denial: %+v; want 1 remaining (2 of 3 used), reset after 40m", r)
	}
	// A second later the per-second bucket has room again: the hourly
	// one was not charged by call 3, so call 4 takes its last token.
	if !c.allowEach(keys, now.Add(time.Second), costs, enforced, ps, res) || res[1].Remaining != 0 {
		t.Fatalf("call 4 a second later: %+v; want allowed, the hourly bucket with 0 remaining", res)
	}
}

// TestLocalLimiterEviction checks the documented eviction: memory stays
// within the cap, a key that keeps coming is kept, and a key pushed out
// starts again from a full bucket.
func TestLocalLimiterEviction(t *testing.T) {
	c := newLocalLimiter(10 * localShards) // 10 keys per shard
	ps := []localPolicy{localPolicyOf(PerHour(1), 1)}
	now := c.base.Add(time.Hour)
	res := make([]Result, 1)
	if !c.allow("hot", now, 1, ps, res) {
		t.Fatal("first call of hot denied")
	}
	// 5 new keys between two of hot's requests: fewer than its shard
	// holds, so hot stays, whichever shards they land in.
	for i := range 10_000 {
		c.allow("cold"+strconv.Itoa(i), now, 1, ps, res)
		if i%5 == 4 && c.allow("hot", now, 1, ps, res) {
			t.Fatalf("hot allowed again after %d other keys; want it kept and denied", i+1)
		}
	}
	if n := c.len(); n > 10*localShards {
		t.Errorf("%d keys held; want at most %d", n, 10*localShards)
	}
	// 10,000 keys without hot: its shard got far more than 10 of them.
	for i := range 10_000 {
		c.allow("other"+strconv.Itoa(i), now, 1, ps, res)
	}
	if !c.allow("hot", now, 1, ps, res) {
		t.Errorf("hot denied after being pushed out; want a full bucket again (the documented cost of eviction)")
	}
}

// TestFallbackLocalHold checks that the middleware goes back to Redis once
// LocalHold has passed, on a clock the test moves.
func TestFallbackLocalHold(t *testing.T) {
	l, p := slowLimiter(t, Options{Algorithm: FixedWindow, Limit: PerHour(100), DisableDenyCache: true})
	var mu sync.Mutex
	now := time.Now()
	l.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	var errs errRecorder
	m := testMiddleware(t, l, MiddlewareOptions{Fallback: FallbackLocal, Timeout: 20 * time.Millisecond, LocalHold: time.Minute, OnError: errs.record})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(okHandler, w, r) })
	p.SetLatency(200*time.Millisecond, 0)
	for i := range 3 {
		if w := serve(h, request("192.0.2.7:1")); w.Code != http.StatusOK {
			t.Fatalf("request %d with Redis slow: status %d; want 200 from the local limiter", i+1, w.Code)
		}
	}
	if n := len(errs.list()); n != 1 {
		t.Fatalf("%d errors; want 1: requests within LocalHold must not wait for Redis", n)
	}
	// LocalHold passes with Redis still slow: of 8 requests at once, one
	// asks Redis (and waits Timeout), the others stay local.
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if w := serve(h, request("192.0.2.7:1")); w.Code != http.StatusOK {
				t.Errorf("request after LocalHold with Redis slow: status %d; want 200", w.Code)
			}
		})
	}
	wg.Wait()
	if n := len(errs.list()); n != 2 {
		t.Fatalf("%d errors after 8 requests past LocalHold; want 2 (one more probe of Redis)", n)
	}
	p.SetLatency(0, 0)
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	// The late first script may still be queued: wait until Redis answers
	// this request (a generous timeout, since nothing is slow any more).
	m.timeout = time.Minute
	w := serve(h, request("192.0.2.7:1"))
	if w.Code != http.StatusOK || len(errs.list()) != 2 {
		t.Fatalf("after LocalHold: status %d, errors %v; want 200 from Redis", w.Code, errs.list())
	}
	// Redis counted this request and the two that timed out if they ran
	// (the local limiter, 10 requests in, would say 90).
	got := w.Header().Get("RateLimit")
	if !strings.HasPrefix(got, `"default";r=97;`) && !strings.HasPrefix(got, `"default";r=98;`) && !strings.HasPrefix(got, `"default";r=99;`) {
		t.Fatalf("after LocalHold: RateLimit %q; want Redis's count (97 to 99 remaining)", got)
	}
	// Redis answered: the fallback is over, and the next requests ask
	// Redis again, with no hold left.
	if until := m.localUntil.Load(); until != 0 {
		t.Errorf("after Redis answered: localUntil %d; want 0 (no longer local)", until)
	}
}
