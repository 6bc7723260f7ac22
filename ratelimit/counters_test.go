package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

func allowCounters(t *testing.T, l *Limiter, group string, cs ...Counter) Decision {
	t.Helper()
	d, err := l.AllowCounters(context.Background(), group, cs)
	if err != nil {
		t.Fatalf("AllowCounters: %v", err)
	}
	return d
}

// counterKinds are the four ways a counter counts.
var counterKinds = []struct {
	name    string
	algo    Algorithm
	aligned bool
}{
	{"gcra", GCRA, false}, {"fixed", FixedWindow, false}, {"sliding", SlidingWindow, false}, {"aligned", FixedWindow, true},
}

// TestCountersDeniedCountsNowhere is the point of counters: a request a
// user's counter denies costs its organisation's counter nothing, in every
// algorithm, and another user of the organisation gets the room.
func TestCountersDeniedCountsNowhere(t *testing.T) {
	for _, tg := range targets {
		for _, k := range counterKinds {
			t.Run(tg.name+"/"+k.name, func(t *testing.T) {
				sc := newCache(t, tg.addrs(t)...)
				l := newLimiter(t, sc, Options{Limit: PerSecond(1), DisableDenyCache: true})
				user := func(name string) Counter {
					return Counter{Key: "user:" + name, Policy: Policy{Algorithm: k.algo, Limit: PerHour(2)}, Aligned: k.aligned}
				}
				org := Counter{Key: "org:acme", Policy: Policy{Algorithm: k.algo, Limit: PerHour(3)}, Aligned: k.aligned}
				for i := range 2 {
					d := allowCounters(t, l, "acme", user("alice"), org)
					if !d.Allowed || d.Results[0].Remaining != 1-i || d.Results[1].Remaining != 2-i {
						t.Fatalf("alice's call %d: %+v, want allowed with remaining %d and %d", i, d, 1-i, 2-i)
					}
				}
				for range 5 {
					d := allowCounters(t, l, "acme", user("alice"), org)
					if d.Allowed || d.Results[0].Allowed || !d.Results[1].Allowed || d.Results[1].Remaining != 1 {
						t.Fatalf("alice over her limit: %+v, want denied by her counter, org still at 1", d)
					}
					if d.RetryAfter <= 0 || d.RetryAfter != d.Results[0].RetryAfter {
						t.Fatalf("RetryAfter %v, want the user counter's %v > 0", d.RetryAfter, d.Results[0].RetryAfter)
					}
				}
				d := allowCounters(t, l, "acme", user("bob"), org)
				if !d.Allowed || d.Results[1].Remaining != 0 {
					t.Fatalf("bob after alice's denials: %+v, want allowed, org at 0", d)
				}
				d = allowCounters(t, l, "acme", user("carol"), org)
				if d.Allowed || !d.Results[0].Allowed || d.Results[0].Remaining != 2 || d.Results[1].Allowed {
					t.Fatalf("carol with the org full: %+v, want denied by the org, carol's counter untouched (2)", d)
				}
			})
		}
	}
}

// TestCountersMatchPolicies checks each algorithm of the counters script
// against the same limit decided by ratelimit_multi (one policy), over a
// run of calls with costs 0 to 3 that goes past the limit: the same
// answers, the same remaining.
func TestCountersMatchPolicies(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	l := newLimiter(t, sc, Options{Limit: PerSecond(1), DisableDenyCache: true})
	costs := []int{1, 2, 0, 3, 1, 1, 2, 1, 3, 1, 1, 1}
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			pol := Policy{Name: "p", Algorithm: algo, Limit: Limit{Rate: 10, Period: time.Hour}}
			ps := newPolicies(t, pol)
			for i, n := range costs {
				want := allowPolicies(t, l, "k"+algo.String(), n, ps)
				c := Counter{Key: "k", Policy: pol, Cost: n, Peek: n == 0}
				got := allowCounters(t, l, "g"+algo.String(), c)
				w, g := want.Results[0], got.Results[0]
				if got.Allowed != want.Allowed || g.Allowed != w.Allowed || g.Remaining != w.Remaining || g.Limit != w.Limit {
					t.Fatalf("call %d (cost %d): counters %+v, policies %+v", i, n, got, want)
				}
				if (g.RetryAfter > 0) != (w.RetryAfter > 0) || absDur(g.RetryAfter-w.RetryAfter) > time.Second {
					t.Fatalf("call %d: RetryAfter %v, policies say %v", i, g.RetryAfter, w.RetryAfter)
				}
			}
		})
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// TestCountersAligned checks that an aligned window ends at a whole
// multiple of its period since the epoch, as Redis's clock tells.
func TestCountersAligned(t *testing.T) {
	srv := redistest.Single(t)
	sc := newCache(t, srv.Addr())
	l := newLimiter(t, sc, Options{Limit: PerSecond(1), DisableDenyCache: true})
	c := Counter{Key: "k", Policy: Policy{Algorithm: FixedWindow, Limit: PerMinute(5)}, Aligned: true}
	before := serverTime(t, srv)
	d := allowCounters(t, l, "g", c)
	after := serverTime(t, srv)
	// The window ends at the next whole minute after the call.
	lo := before.Truncate(time.Minute).Add(time.Minute).Sub(after)
	hi := after.Truncate(time.Minute).Add(time.Minute).Sub(before)
	if r := d.Results[0].ResetAfter; r < lo || r > hi {
		t.Fatalf("ResetAfter %v, want the time to the next whole minute, in [%v, %v]", r, lo, hi)
	}
	// A first-request window would reset a full minute later.
	f := Counter{Key: "k", Policy: Policy{Algorithm: FixedWindow, Limit: PerMinute(5)}}
	if r := allowCounters(t, l, "g", f).Results[0].ResetAfter; r != time.Minute {
		t.Fatalf("first-request window: ResetAfter %v, want 1m", r)
	}
}

// serverTime reads the server's clock.
func serverTime(t *testing.T, srv *redistest.Server) time.Time {
	t.Helper()
	out, err := srv.Do("TIME")
	if err != nil {
		t.Fatal(err)
	}
	var sec, usec int64
	if _, err := fmt.Sscan(strings.ReplaceAll(out, "\n", " "), &sec, &usec); err != nil {
		t.Fatalf("TIME %q: %v", out, err)
	}
	return time.Unix(sec, usec*1000)
}

// TestCountersShadow: a shadow counter over its limit never denies, is
// not counted while full, and is counted nowhere when another denies.
func TestCountersShadow(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	l := newLimiter(t, sc, Options{Limit: PerSecond(1), DisableDenyCache: true})
	shadow := Counter{Key: "s", Policy: Policy{Algorithm: FixedWindow, Limit: PerHour(1)}, Shadow: true}
	hard := Counter{Key: "h", Policy: Policy{Algorithm: FixedWindow, Limit: PerHour(3)}}
	d := allowCounters(t, l, "g", shadow, hard)
	if !d.Allowed || !d.Results[0].Allowed || d.Results[0].Remaining != 0 || d.Results[1].Remaining != 2 {
		t.Fatalf("first call: %+v", d)
	}
	d = allowCounters(t, l, "g", shadow, hard)
	if !d.Allowed || d.Results[0].Allowed || d.RetryAfter != 0 || d.Results[1].Remaining != 1 {
		t.Fatalf("shadow full: %+v, want allowed, the shadow counter without room, hard at 1", d)
	}
	// Only a shadow counter over its cost: allowed, not an error.
	big := shadow
	big.Cost = 5
	if d := allowCounters(t, l, "g", big, hard); !d.Allowed || d.Results[0].Allowed {
		t.Fatalf("shadow counter asked more than its limit: %+v", d)
	}
	// The hard counter is full now; a fresh shadow counter is not counted
	// by the denied call.
	fresh := Counter{Key: "s2", Policy: Policy{Algorithm: FixedWindow, Limit: PerHour(1)}, Shadow: true}
	if d := allowCounters(t, l, "g", fresh, hard); d.Allowed {
		t.Fatalf("hard counter full: %+v, want denied", d)
	}
	if d := allowCounters(t, l, "g", Counter{Key: "s2", Policy: fresh.Policy, Peek: true}); d.Results[0].Remaining != 1 {
		t.Fatalf("fresh shadow counter after a denied call: %+v, want untouched (1)", d)
	}
}

// TestCountersConcurrentExact: 8 clients each send 100 calls over one
// organisation counter (limit 30) and four users' counters (limit 10
// each, two clients per user): exactly 30 pass, the organisation counts
// exactly those, and each user's count equals its passed calls, none over
// 10.
func TestCountersConcurrentExact(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			addrs := tg.addrs(t)
			prefix := testPrefix(t)
			const clients, calls, orgLimit, userLimit = 8, 100, 30, 10
			var passed [clients]atomic.Int64
			var wg sync.WaitGroup
			for i := range clients {
				l := newLimiter(t, newCache(t, addrs...), Options{Limit: PerSecond(1), Prefix: prefix})
				wg.Go(func() {
					for range calls {
						d, err := l.AllowCounters(context.Background(), "acme", []Counter{
							{Key: fmt.Sprint("user:", i%4), Policy: Policy{Algorithm: GCRA, Limit: PerHour(userLimit)}},
							{Key: "org", Policy: Policy{Algorithm: FixedWindow, Limit: PerHour(orgLimit)}, Aligned: true},
						})
						if err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							passed[i].Add(1)
						}
					}
				})
			}
			wg.Wait()
			var total int64
			perUser := map[int]int64{}
			for i := range clients {
				total += passed[i].Load()
				perUser[i%4] += passed[i].Load()
			}
			if total != orgLimit {
				t.Fatalf("%d calls passed, want %d", total, orgLimit)
			}
			l := newLimiter(t, newCache(t, addrs...), Options{Limit: PerSecond(1), Prefix: prefix, DisableDenyCache: true})
			for u, n := range perUser {
				d := allowCounters(t, l, "acme", Counter{Key: fmt.Sprint("user:", u), Policy: Policy{Algorithm: GCRA, Limit: PerHour(userLimit)}, Peek: true})
				if got := int64(userLimit - d.Results[0].Remaining); got != n || n > userLimit {
					t.Fatalf("user %d counted %d, passed %d", u, got, n)
				}
			}
			d := allowCounters(t, l, "acme", Counter{Key: "org", Policy: Policy{Algorithm: FixedWindow, Limit: PerHour(orgLimit)}, Aligned: true, Peek: true})
			if got := int64(orgLimit - d.Results[0].Remaining); got != total {
				t.Fatalf("org counted %d, %d passed", got, total)
			}
		})
	}
}

// TestCountersDenyCache: a denial is answered locally for the same set
// of counters while the denying counter stays full; a peek at it, or a set
// that differs, goes to Redis.
func TestCountersDenyCache(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	var fromCache atomic.Int64
	obs := scriptcache.ObserverFunc(func(e scriptcache.Event) {
		if e.Kind == scriptcache.EventDecision && e.Source == scriptcache.SourceDenyCache {
			fromCache.Add(1)
		}
	})
	l := newLimiter(t, sc, Options{Limit: PerSecond(1)})
	l.obs = obs
	user := Counter{Key: "u", Policy: Policy{Name: "user", Algorithm: FixedWindow, Limit: PerHour(1)}}
	org := Counter{Key: "o", Policy: Policy{Name: "org", Algorithm: GCRA, Limit: PerHour(100)}}
	allowCounters(t, l, "g", user, org)
	if d := allowCounters(t, l, "g", user, org); d.Allowed || fromCache.Load() != 0 {
		t.Fatalf("second call: %+v, %d from the cache; want denied by Redis", d, fromCache.Load())
	}
	d := allowCounters(t, l, "g", user, org)
	if d.Allowed || fromCache.Load() != 1 || d.Results[1].Remaining != 99 || !d.Results[1].Allowed {
		t.Fatalf("third call: %+v, %d from the cache; want a cached denial, org at 99", d, fromCache.Load())
	}
	peek := user
	peek.Peek = true
	if d := allowCounters(t, l, "g", peek, org); !d.Allowed || fromCache.Load() != 1 {
		t.Fatalf("peek at the full counter: %+v; want allowed by Redis", d)
	}
	if d := allowCounters(t, l, "g", user); d.Allowed || fromCache.Load() != 1 {
		t.Fatalf("another set: %+v, %d from the cache; want Redis's denial", d, fromCache.Load())
	}
}

// TestCountersKeys: every key stays inside the prefix, shares the group's
// slot, and groups or keys with braces cannot reach another's key.
func TestCountersKeys(t *testing.T) {
	for _, tc := range []struct{ group, key string }{
		{"acme", "user:alice"}, {"a}b", "k"}, {"{x}", "k"}, {"~x", "k}:g"}, {"g", "{y}"},
	} {
		tag := counterTag(tc.group)
		k := counterKey("p:", tag, "f60000", tc.key)
		if !strings.HasPrefix(k, "p:{") || keyspace.Slot(k) != keyspace.Slot("p:{"+tag+"}") || strings.ContainsAny(tag, "{}") {
			t.Errorf("group %q key %q: %q", tc.group, tc.key, k)
		}
	}
	// Two groups, one of which holds the other's key in a brace, never
	// share a key.
	a := counterKey("p:", counterTag("a}:cf60000:x"), "f60000", "k")
	b := counterKey("p:", counterTag("a"), "f60000", "x}:cf60000:k")
	if a == b {
		t.Fatalf("groups collide: %q", a)
	}
}

func TestCountersValidation(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	l := newLimiter(t, sc, Options{Limit: PerSecond(1)})
	ok := Counter{Key: "k", Policy: Policy{Limit: PerSecond(5)}}
	many := make([]Counter, MaxCounters+1)
	for i := range many {
		many[i] = Counter{Key: fmt.Sprint(i), Policy: ok.Policy}
	}
	for _, tc := range []struct {
		name  string
		group string
		cs    []Counter
		want  error
	}{
		{"empty group", "", []Counter{ok}, ErrInvalidKey},
		{"long group", strings.Repeat("g", 1025), []Counter{ok}, ErrInvalidKey},
		{"no counters", "g", nil, ErrInvalidOptions},
		{"too many", "g", many, ErrInvalidOptions},
		{"empty key", "g", []Counter{{Policy: ok.Policy}}, ErrInvalidKey},
		{"bad name", "g", []Counter{{Key: "k", Policy: Policy{Name: "a b", Limit: PerSecond(1)}}}, ErrInvalidOptions},
		{"aligned gcra", "g", []Counter{{Key: "k", Policy: ok.Policy, Aligned: true}}, ErrInvalidOptions},
		{"negative cost", "g", []Counter{{Key: "k", Policy: ok.Policy, Cost: -1}}, ErrInvalidCost},
		{"cost too high", "g", []Counter{{Key: "k", Policy: ok.Policy, Cost: 6}}, ErrCostTooHigh},
		{"bad limit", "g", []Counter{{Key: "k", Policy: Policy{Limit: Limit{Rate: 0, Period: time.Second}}}}, ErrInvalidLimit},
		{"bad algorithm", "g", []Counter{{Key: "k", Policy: Policy{Algorithm: 9, Limit: PerSecond(1)}}}, ErrInvalidAlgorithm},
		{"same key twice", "g", []Counter{ok, ok}, ErrInvalidOptions},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := l.AllowCounters(context.Background(), tc.group, tc.cs); !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
	// One key under two algorithms is two counters.
	if _, err := l.AllowCounters(context.Background(), "g", []Counter{ok, {Key: "k", Policy: Policy{Algorithm: FixedWindow, Limit: PerSecond(5)}}}); err != nil {
		t.Fatalf("one key, two algorithms: %v", err)
	}
}

// TestCheckCountersLocal: with Redis unavailable, CheckCounters decides
// with one local bucket per counter, shared by the calls that name it:
// the organisation's bucket holds for its users together, and a denied
// call is counted in no bucket.
func TestCheckCountersLocal(t *testing.T) {
	l, proxy := slowLimiter(t, Options{Limit: PerSecond(1)})
	proxy.SetLatency(time.Second, 0)
	c, err := NewChecker(l, CheckerOptions{Timeout: 20 * time.Millisecond, FallbackLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	user := func(name string) Counter {
		return Counter{Key: "user:" + name, Policy: Policy{Algorithm: FixedWindow, Limit: PerHour(2)}}
	}
	org := Counter{Key: "org", Policy: Policy{Algorithm: FixedWindow, Limit: PerHour(3)}}
	check := func(name string) Decision {
		t.Helper()
		d, err := c.CheckCounters(context.Background(), "acme", []Counter{user(name), org})
		if err != nil {
			t.Fatalf("CheckCounters: %v", err)
		}
		return d
	}
	var got []bool
	for _, name := range []string{"alice", "alice", "alice", "alice", "bob", "carol"} {
		got = append(got, check(name).Allowed)
	}
	want := []bool{true, true, false, false, true, false}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("local decisions %v, want %v (alice's denials cost the organisation nothing)", got, want)
	}
}

// TestCountersOnEmbedded runs every kind of counter on miniredis, which
// keeps states in text rather than MessagePack, with its clock stopped:
// the second call reads the first one's state (it failed on gopher-lua's
// gmatch before the fix), and an aligned window ends at a whole multiple
// of its period, not a period after its first request.
func TestCountersOnEmbedded(t *testing.T) {
	for _, k := range counterKinds {
		t.Run(k.name, func(t *testing.T) {
			l, mr := newFrozenLimiter(t, Options{Limit: PerSecond(1), DisableDenyCache: true}, window10s.Add(4*time.Second))
			c := Counter{Key: "k", Policy: Policy{Algorithm: k.algo, Limit: Limit{Rate: 2, Period: 10 * time.Second}}, Aligned: k.aligned}
			var got []bool
			for range 3 {
				got = append(got, allowCounters(t, l, "g", c).Allowed)
			}
			if fmt.Sprint(got) != "[true true false]" {
				t.Fatalf("three calls against 2 per 10s: %v", got)
			}
			if k.aligned {
				if d := allowCounters(t, l, "g", c); d.RetryAfter != 6*time.Second {
					t.Fatalf("aligned window: RetryAfter %v, want 6s (the window ends at 10s)", d.RetryAfter)
				}
				mr.SetTime(window10s.Add(10 * time.Second))
				if d := allowCounters(t, l, "g", c); !d.Allowed || d.Results[0].Remaining != 1 {
					t.Fatalf("next aligned window: %+v", d)
				}
			}
		})
	}
}

// TestCountersMax decides MaxCounters counters of every kind at once, on
// a server and on miniredis: the script's tables are sized for them.
func TestCountersMax(t *testing.T) {
	cs := make([]Counter, MaxCounters)
	for i := range cs {
		k := counterKinds[i%len(counterKinds)]
		cs[i] = Counter{Key: fmt.Sprint("k", i), Policy: Policy{Algorithm: k.algo, Limit: PerHour(2)}, Aligned: k.aligned}
	}
	// The last one a shadow counter full after one call, which the second
	// call, allowed, must not write.
	cs[MaxCounters-1].Shadow, cs[MaxCounters-1].Policy.Limit = true, PerHour(1)
	for name, sc := range map[string]*scriptcache.Cache{
		"redis":     newCache(t, redistest.Single(t).Addr()),
		"miniredis": newCache(t, miniredis.RunT(t).Addr()),
	} {
		t.Run(name, func(t *testing.T) {
			l := newLimiter(t, sc, Options{Limit: PerSecond(1), DisableDenyCache: true})
			for i := range 3 {
				d := allowCounters(t, l, "g", cs...)
				if d.Allowed != (i < 2) || len(d.Results) != MaxCounters || d.Results[MaxCounters-2].Remaining != max(1-i, 0) ||
					d.Results[MaxCounters-1].Allowed != (i == 0) {
					t.Fatalf("call %d: %+v", i, d)
				}
			}
		})
	}
}
