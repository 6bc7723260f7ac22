package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

func newPolicies(t testing.TB, ps ...Policy) *Policies {
	t.Helper()
	p, err := NewPolicies(ps...)
	if err != nil {
		t.Fatalf("NewPolicies: %v", err)
	}
	return p
}

func allowPolicies(t *testing.T, l *Limiter, key string, n int, ps *Policies) Decision {
	t.Helper()
	d, err := l.AllowPolicies(context.Background(), key, n, ps)
	if err != nil {
		t.Fatalf("AllowPolicies(%q, %d): %v", key, n, err)
	}
	return d
}

func TestNewPoliciesValidation(t *testing.T) {
	ok := Policy{Name: "a", Limit: PerSecond(1)}
	tests := []struct {
		name string
		ps   []Policy
		want error
	}{
		{"none", nil, ErrInvalidOptions},
		{"too many", []Policy{ok, {Name: "b", Limit: PerSecond(1)}, {Name: "c", Limit: PerSecond(1)}, {Name: "d", Limit: PerSecond(1)}, {Name: "e", Limit: PerSecond(1)}, {Name: "f", Limit: PerSecond(1)}, {Name: "g", Limit: PerSecond(1)}, {Name: "h", Limit: PerSecond(1)}, {Name: "i", Limit: PerSecond(1)}}, ErrInvalidOptions},
		{"no name", []Policy{{Limit: PerSecond(1)}}, ErrInvalidOptions},
		{"name with a quote", []Policy{{Name: `a"b`, Limit: PerSecond(1)}}, ErrInvalidOptions},
		{"name with a brace", []Policy{{Name: "a}", Limit: PerSecond(1)}}, ErrInvalidOptions},
		{"name with a colon", []Policy{{Name: "a:b", Limit: PerSecond(1)}}, ErrInvalidOptions},
		{"long name", []Policy{{Name: strings.Repeat("n", 65), Limit: PerSecond(1)}}, ErrInvalidOptions},
		{"repeated name", []Policy{ok, {Name: "a", Algorithm: FixedWindow, Limit: PerHour(5)}}, ErrInvalidOptions},
		{"zero limit", []Policy{{Name: "a"}}, ErrInvalidLimit},
		{"negative burst", []Policy{{Name: "a", Limit: Limit{Rate: 1, Period: time.Second, Burst: -1}}}, ErrInvalidLimit},
		{"burst on a window", []Policy{{Name: "a", Algorithm: SlidingWindow, Limit: Limit{Rate: 1, Period: time.Second, Burst: 2}}}, ErrInvalidLimit},
		{"unknown algorithm", []Policy{{Name: "a", Algorithm: 7, Limit: PerSecond(1)}}, ErrInvalidAlgorithm},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPolicies(tt.ps...)
			if !errors.Is(err, tt.want) || p != nil {
				t.Fatalf("NewPolicies = %v, %v; want nil, %v", p, err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "ratelimit: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
		})
	}
	sc := newCache(t, redistest.Single(t).Addr())
	l := newLimiter(t, sc, Options{Limit: PerSecond(1)})
	ps := newPolicies(t, Policy{Name: "a", Limit: PerHour(3)}, Policy{Name: "b", Algorithm: FixedWindow, Limit: PerHour(5)})
	ctx := context.Background()
	for _, c := range []struct {
		key  string
		n    int
		ps   *Policies
		want error
	}{
		{"", 1, ps, ErrInvalidKey},
		{"k", -1, ps, ErrInvalidCost},
		{"k", 4, ps, ErrCostTooHigh}, // above the smallest capacity
		{"k", 1, nil, ErrInvalidOptions},
	} {
		if _, err := l.AllowPolicies(ctx, c.key, c.n, c.ps); !errors.Is(err, c.want) {
			t.Errorf("AllowPolicies(%q, %d) error %v; want %v", c.key, c.n, err, c.want)
		}
	}
	if err := l.Reset(ctx, "k", nil); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("Reset with a nil set: %v; want ErrInvalidOptions", err)
	}
}

// TestAllowPolicies checks one decision over a fixed window, a sliding
// window and a GCRA bucket on one key, on a single server and a cluster:
// a request is counted only when all have room, the one without room sets
// RetryAfter, and Reset with the set starts over.
func TestAllowPolicies(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			sc := newCache(t, tg.addrs(t)...)
			l := newLimiter(t, sc, Options{Limit: PerSecond(1)})
			ps := newPolicies(t,
				Policy{Name: "minute", Algorithm: FixedWindow, Limit: PerMinute(3)},
				Policy{Name: "hour", Algorithm: SlidingWindow, Limit: PerHour(5)},
				Policy{Name: "bucket", Limit: PerHour(4)},
			)
			for i := range 3 {
				d := allowPolicies(t, l, "k", 1, ps)
				if !d.Allowed || d.RetryAfter != 0 || len(d.Results) != 3 {
					t.Fatalf("call %d: %+v; want allowed", i+1, d)
				}
				for j, want := range []int{2 - i, 4 - i, 3 - i} {
					if r := d.Results[j]; !r.Allowed || r.Remaining != want || r.Limit != ps.capacity[j] {
						t.Fatalf("call %d, policy %d: %+v; want room and %d remaining", i+1, j, r, want)
					}
				}
			}
			for i := range 2 { // the second from the deny cache
				d := allowPolicies(t, l, "k", 1, ps)
				if d.Allowed || d.Results[0].Allowed || !d.Results[1].Allowed || !d.Results[2].Allowed {
					t.Fatalf("denial %d: %+v; want denied by the minute policy only", i+1, d)
				}
				if d.RetryAfter <= 0 || d.RetryAfter > time.Minute || d.RetryAfter != d.Results[0].RetryAfter {
					t.Fatalf("denial %d: RetryAfter %v, minute policy's %v; want equal, in (0, 1m]", i+1, d.RetryAfter, d.Results[0].RetryAfter)
				}
				// Not counted in the policies that had room.
				if d.Results[1].Remaining != 2 || d.Results[2].Remaining != 1 {
					t.Fatalf("denial %d: %+v; want 2 and 1 remaining in the others", i+1, d.Results)
				}
			}
			// A peek is never refused and counts nothing.
			if d := allowPolicies(t, l, "k", 0, ps); !d.Allowed || d.Results[1].Remaining != 2 || d.Results[2].Remaining != 1 {
				t.Fatalf("peek: %+v; want allowed with 2 and 1 remaining", d)
			}
			if err := l.Reset(context.Background(), "k", ps); err != nil {
				t.Fatal(err)
			}
			if d := allowPolicies(t, l, "k", 2, ps); !d.Allowed || d.Results[0].Remaining != 1 || d.Results[1].Remaining != 3 || d.Results[2].Remaining != 2 {
				t.Fatalf("after Reset, cost 2: %+v; want allowed with 1, 3, 2 remaining", d)
			}
		})
	}
}

// TestAllowPoliciesConcurrentExact sends 320 concurrent requests against
// limits of 30, 50 and 40 per hour: exactly 30 pass, and the others are
// charged those 30 and nothing for the denials.
func TestAllowPoliciesConcurrentExact(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			sc := newCache(t, tg.addrs(t)...)
			l := newLimiter(t, sc, Options{Limit: PerSecond(1), DisableDenyCache: true})
			ps := newPolicies(t,
				Policy{Name: "a", Algorithm: SlidingWindow, Limit: PerHour(50)},
				Policy{Name: "b", Algorithm: FixedWindow, Limit: PerHour(30)},
				Policy{Name: "c", Limit: PerHour(40)},
			)
			var allowed atomic.Int64
			var wg sync.WaitGroup
			for range 32 {
				wg.Go(func() {
					for range 10 {
						d, err := l.AllowPolicies(context.Background(), "k", 1, ps)
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							allowed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if n := allowed.Load(); n != 30 {
				t.Fatalf("allowed %d of 320; want exactly 30", n)
			}
			d := allowPolicies(t, l, "k", 0, ps)
			if d.Results[0].Remaining != 20 || d.Results[1].Remaining != 0 || d.Results[2].Remaining != 10 {
				t.Fatalf("after the burst: %+v; want 20, 0, 10 remaining", d.Results)
			}
		})
	}
}

// TestPerCallLimitsShareDenyCache runs two plans with an "hour" policy of
// different limits through one Limiter: a denial under the free plan is
// answered locally for that plan only, and the plans count apart.
func TestPerCallLimitsShareDenyCache(t *testing.T) {
	srv := redistest.NewServer(t)
	sc := newCache(t, srv.Addr())
	l := newLimiter(t, sc, Options{Limit: PerSecond(1)})
	free := newPolicies(t, Policy{Name: "hour", Algorithm: FixedWindow, Limit: PerHour(2)})
	pro := newPolicies(t, Policy{Name: "hour", Algorithm: FixedWindow, Limit: PerHour(5)})
	for range 2 {
		if d := allowPolicies(t, l, "tenant", 1, free); !d.Allowed {
			t.Fatalf("free plan: %+v; want allowed", d)
		}
	}
	if d := allowPolicies(t, l, "tenant", 1, free); d.Allowed {
		t.Fatalf("free plan, call 3: %+v; want denied", d)
	}
	resetStats(t, srv)
	for range 100 {
		if d := allowPolicies(t, l, "tenant", 1, free); d.Allowed || d.Results[0].Limit != 2 {
			t.Fatalf("free plan flood: %+v; want denied with limit 2", d)
		}
	}
	if n := evalshaCalls(t, srv); n != 0 {
		t.Errorf("free plan flood cost %d scripts; want 0 (deny cache)", n)
	}
	// The same key under the pro plan: not the free plan's denial.
	d := allowPolicies(t, l, "tenant", 1, pro)
	if !d.Allowed || d.Results[0].Limit != 5 || d.Results[0].Remaining != 4 {
		t.Fatalf("pro plan: %+v; want allowed with limit 5, 4 remaining", d)
	}
	// And the Limiter's own limit is a third, independent entry.
	if res := allow(t, l, "tenant", 1); !res.Allowed {
		t.Fatalf("own limit: %+v; want allowed", res)
	}
	if err := l.Reset(context.Background(), "tenant", free); err != nil {
		t.Fatal(err)
	}
	if d := allowPolicies(t, l, "tenant", 1, free); !d.Allowed || d.Results[0].Remaining != 1 {
		t.Fatalf("free plan after Reset: %+v; want allowed with 1 remaining", d)
	}
}

// TestMiddlewarePolicies checks the header fields, the 429 and the problem
// details of a two-policy decision on a stopped miniredis clock, so every
// value is exact; and that PolicyFunc picks the set per request.
func TestMiddlewarePolicies(t *testing.T) {
	l, _ := newFrozenLimiter(t, Options{Limit: PerSecond(1)}, window10s)
	std := newPolicies(t,
		Policy{Name: "second", Limit: PerSecond(2)},
		Policy{Name: "hour", Algorithm: FixedWindow, Limit: PerHour(100)},
	)
	pro := newPolicies(t, Policy{Name: "pro-second", Limit: PerSecond(10)})
	h := MustNewMiddleware(l, MiddlewareOptions{
		// miniredis is slow: a loaded machine must not turn an answer
		// into a timeout.
		Timeout:        time.Minute,
		ProblemDetails: true,
		OnError:        func(_ *http.Request, err error) { t.Errorf("OnError: %v", err) },
		PolicyFunc: func(r *http.Request) (*Policies, error) {
			switch r.Header.Get("X-Plan") {
			case "pro":
				return pro, nil
			case "own":
				return nil, nil
			}
			return std, nil
		},
	})(okHandler)
	const policy = `"second";q=2;w=1, "hour";q=100;w=3600`
	for i, want := range []string{
		`"second";r=1;t=1, "hour";r=99;t=3600`,
		`"second";r=0;t=1, "hour";r=98;t=3600`,
	} {
		w := serve(h, request("192.0.2.1:1"))
		if w.Code != http.StatusOK || w.Header().Get("RateLimit-Policy") != policy || w.Header().Get("RateLimit") != want {
			t.Fatalf("request %d: %d, RateLimit-Policy %q, RateLimit %q; want 200, %q, %q", i+1, w.Code,
				w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"), policy, want)
		}
	}
	for i := range 2 { // the second from the deny cache
		w := serve(h, request("192.0.2.1:1"))
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" {
			t.Fatalf("denial %d: %d, Retry-After %q; want 429, 1", i+1, w.Code, w.Header().Get("Retry-After"))
		}
		if rl := w.Header().Get("RateLimit"); rl != `"second";r=0;t=1, "hour";r=98;t=3600` {
			t.Errorf("denial %d: RateLimit %q", i+1, rl)
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("denial %d: Content-Type %q; want application/problem+json", i+1, ct)
		}
		var body struct {
			Type     string   `json:"type"`
			Status   int      `json:"status"`
			Violated []string `json:"violated-policies"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("denial %d: body %q: %v", i+1, w.Body, err)
		}
		if body.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" || body.Status != 429 ||
			len(body.Violated) != 1 || body.Violated[0] != "second" {
			t.Errorf("denial %d: problem %+v; want quota-exceeded, 429, violated [second]", i+1, body)
		}
	}
	// Another plan, same client: its own limits, not std's denial.
	w := serve(h, request("192.0.2.1:1", "X-Plan", "pro"))
	if w.Code != http.StatusOK || w.Header().Get("RateLimit") != `"pro-second";r=9;t=1` {
		t.Errorf("pro plan: %d, RateLimit %q; want 200, \"pro-second\";r=9;t=1", w.Code, w.Header().Get("RateLimit"))
	}
	w = serve(h, request("192.0.2.1:1", "X-Plan", "own"))
	if w.Code != http.StatusOK || w.Header().Get("RateLimit") != `"default";r=0;t=1` {
		t.Errorf("nil set: %d, RateLimit %q; want the Limiter's own limit", w.Code, w.Header().Get("RateLimit"))
	}
}

// TestFallbackLocalPolicies checks that the local limiter enforces every
// policy of a set while Redis is slow.
func TestFallbackLocalPolicies(t *testing.T) {
	l, p := slowLimiter(t, Options{Limit: PerSecond(1)})
	ps := newPolicies(t,
		Policy{Name: "hour", Algorithm: FixedWindow, Limit: PerHour(3)},
		Policy{Name: "day", Algorithm: SlidingWindow, Limit: Limit{Rate: 100, Period: 24 * time.Hour}},
	)
	var errs errRecorder
	h := MustNewMiddleware(l, MiddlewareOptions{
		Fallback: FallbackLocal, Timeout: 20 * time.Millisecond, LocalHold: time.Hour, OnError: errs.record,
		PolicyFunc: func(*http.Request) (*Policies, error) { return ps, nil },
	})(okHandler)
	p.SetLatency(200*time.Millisecond, 0)
	served := 0
	for range 10 {
		w := serve(h, request("192.0.2.9:1"))
		if w.Code == http.StatusOK {
			served++
		} else if w.Code != http.StatusTooManyRequests || !strings.HasPrefix(w.Header().Get("RateLimit"), `"hour";r=0;`) {
			t.Fatalf("status %d, RateLimit %q; want 429 from the hour policy", w.Code, w.Header().Get("RateLimit"))
		}
	}
	if served != 3 || len(errs.list()) != 1 {
		t.Errorf("served %d of 10 with Redis slow, %d errors; want 3 and 1", served, len(errs.list()))
	}
}

// TestPoliciesKeysStayInPrefix sends hostile keys through a policy set on
// a single server and a cluster: each gets its own state, under the prefix,
// with a TTL, and only that one key is written per call.
func TestPoliciesKeysStayInPrefix(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			sc := newCache(t, tg.addrs(t)...)
			l := newLimiter(t, sc, Options{Limit: PerSecond(1), DisableDenyCache: true})
			ps := newPolicies(t,
				Policy{Name: "a", Algorithm: FixedWindow, Limit: PerMinute(1)},
				Policy{Name: "b", Algorithm: SlidingWindow, Limit: PerHour(5)},
				Policy{Name: "c", Limit: PerHour(5)},
			)
			c := raw(sc)
			for _, key := range []string{"}", "{", "}{", "a}b", "{x}", "~", "~}", "\x00\r\n*3", "a:m:x", strings.Repeat("}", 1024)} {
				if d := allowPolicies(t, l, key, 1, ps); !d.Allowed {
					t.Fatalf("first call for %q denied (%+v): keys collide", key, d)
				}
				full := keyspace.Key(l.prefix, key, ps.suffix)
				if !strings.HasPrefix(full, l.prefix+"{") {
					t.Fatalf("key %q outside prefix %q", full, l.prefix)
				}
				pttl, err := c.Do(context.Background(), c.B().Pttl().Key(full).Build()).AsInt64()
				// The sliding window's count is needed until the next
				// window ends: up to two hours.
				if err != nil || pttl <= 0 || pttl > 2*time.Hour.Milliseconds() {
					t.Fatalf("PTTL %q = %d, %v; want in (0, 2h]", full, pttl, err)
				}
			}
		})
	}
}

// statePolicies is the set of TestPoliciesStateFormat. The suffix of its
// state key is pinned: a process of an earlier version derives the same,
// and reads and writes the same format there.
var statePolicies = []Policy{
	{Name: "minute", Limit: PerMinute(10)},
	{Name: "hour", Algorithm: FixedWindow, Limit: PerHour(100)},
	{Name: "sliding", Algorithm: SlidingWindow, Limit: PerHour(50)},
}

const stateSuffix = ":m:39sbnviizs3mp"

// TestPoliciesStateFormat checks that a set's state is where, and in the
// format, that earlier versions keep it, so that old and new processes
// sharing keys during a rolling upgrade count together: a state written
// as they write it is read, and the state written back is laid out as
// they read it. Per policy three numbers: GCRA its TAT and two zeros, a
// fixed window its count, its end and a zero, a sliding window its
// window's index, its count and the previous window's. MessagePack on
// Redis, text on miniredis.
func TestPoliciesStateFormat(t *testing.T) {
	ps := newPolicies(t, statePolicies...)
	if ps.suffix != stateSuffix {
		t.Fatalf("state key suffix %q; want %q: the key of a set's state has changed", ps.suffix, stateSuffix)
	}
	check := func(t *testing.T, d Decision, retry time.Duration) {
		t.Helper()
		// 3 of 10 used, 7 of 100, 4 of 50 in the current window and none
		// in the previous: one more leaves 6, 92, 45.
		if !d.Allowed || d.Results[0].Remaining != 6 || d.Results[1].Remaining != 92 || d.Results[2].Remaining != 45 {
			t.Fatalf("decision %+v; want allowed with 6, 92 and 45 remaining", d)
		}
		// Four of ten minute tokens are 24s to earn back, the window
		// ends in 30 minutes.
		if r := d.Results[0].ResetAfter; r <= 24*time.Second-retry || r > 24*time.Second {
			t.Errorf("GCRA ResetAfter %v; want about 24s", r)
		}
		if r := d.Results[1].ResetAfter; r <= 30*time.Minute-retry || r > 30*time.Minute {
			t.Errorf("fixed window ResetAfter %v; want about 30m", r)
		}
	}

	t.Run("redis", func(t *testing.T) {
		srv := redistest.Single(t)
		l := newLimiter(t, newCache(t, srv.Addr()), Options{Limit: PerSecond(1), Prefix: "state:"})
		key := keyspace.Key(l.prefix, "k", ps.suffix)
		// The state as an earlier version writes it, on the server's clock:
		// TAT 18s ahead, 7 in a window ending in 30 minutes, 4 in the
		// current hour.
		const write = `
local t = redis.call('TIME')
local now = (t[1] - 1704067200) * 1000000 + t[2]
local idx = math.floor((t[1] * 1000000 + t[2]) / 3600000000)
local s = {now + 18000000, 0, 0, 7, math.floor(now / 1000) + 1800000, 0, idx, 4, 0}
redis.call('SET', KEYS[1], cmsgpack.pack(unpack(s)), 'PX', 3600000)
return s`
		out, err := srv.Do("EVAL", write, "1", key)
		if err != nil {
			t.Fatal(err)
		}
		before := strings.Split(out, "\n")
		d := allowPolicies(t, l, "k", 1, ps)
		// Generous: the server may be slow, and the TAT has 6s of slack.
		check(t, d, 5*time.Second)
		out, err = srv.Do("EVAL", `return {cmsgpack.unpack(redis.call('GET', KEYS[1]))}`, "1", key)
		if err != nil {
			t.Fatal(err)
		}
		after := strings.Split(out, "\n")
		tat, _ := strconv.ParseInt(before[0], 10, 64)
		// The sliding window may have moved on to the next hour in
		// between: then its index is one more, and its count the
		// previous one.
		want := []string{strconv.FormatInt(tat+6_000_000, 10), "0", "0", "8", before[4], "0", before[6], "5", "0"}
		if len(after) == 9 && after[6] != before[6] {
			idx, _ := strconv.ParseInt(before[6], 10, 64)
			want[6], want[7], want[8] = strconv.FormatInt(idx+1, 10), "1", "4"
		}
		if !slices.Equal(after, want) {
			t.Fatalf("state written %q; want %q", after, want)
		}
		// Three numbers per policy and nothing more: the list above ends
		// at a nil, which select counts.
		if out, err := srv.Do("EVAL", `return select('#', cmsgpack.unpack(redis.call('GET', KEYS[1])))`, "1", key); err != nil || out != "9" {
			t.Fatalf("the state holds %s values (%v); want 9", out, err)
		}
	})

	t.Run("miniredis", func(t *testing.T) {
		at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		l, mr := newFrozenLimiter(t, Options{Limit: PerSecond(1), Prefix: "state:"}, at)
		key := keyspace.Key(l.prefix, "k", ps.suffix)
		now := at.Sub(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds()
		idx := at.UnixMicro() / time.Hour.Microseconds()
		f := func(x int64) string { return strconv.FormatInt(x, 10) }
		if err := mr.Set(key, strings.Join([]string{f(now + 18_000_000), "0", "0", "7", f(now/1000 + 1_800_000), "0", f(idx), "4", "0"}, " ")); err != nil {
			t.Fatal(err)
		}
		check(t, allowPolicies(t, l, "k", 1, ps), time.Microsecond)
		got, err := mr.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		want := strings.Join([]string{f(now + 24_000_000), "0", "0", "8", f(now/1000 + 1_800_000), "0", f(idx), "5", "0"}, " ")
		if got != want {
			t.Fatalf("state written %q; want %q", got, want)
		}
	})
}
