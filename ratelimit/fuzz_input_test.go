package ratelimit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/scriptcache"
)

// FuzzLimiterInput feeds arbitrary keys, prefixes, limits, periods, bursts,
// costs and algorithms to the limiter on a real Redis. Nothing may panic,
// every refusal must be a documented error, a valid first call on a fresh
// key must be allowed when its cost fits, and no key may be written outside
// the prefix.
//
// Plain go test replays the seed corpus in testdata/fuzz; explore with
// go test -run=NONE -fuzz=FuzzLimiterInput ./ratelimit
func FuzzLimiterInput(f *testing.F) {
	srv := redistest.NewServer(f)
	client := redistest.Client(f, srv.Addr())
	sc, err := scriptcache.New(context.Background(), client)
	if err != nil {
		f.Fatal(err)
	}
	f.Add("203.0.113.7", "", 10, int64(time.Second), 0, 1, uint8(0))
	f.Add("", "p:", 0, int64(0), -1, -1, uint8(7))
	f.Fuzz(func(t *testing.T, key, prefix string, rate int, periodNs int64, burst, cost int, alg uint8) {
		ctx := context.Background()
		srv.Do("FLUSHALL")
		l, err := ratelimit.New(sc, ratelimit.Options{
			Algorithm: ratelimit.Algorithm(alg % 4), // 3 is not an algorithm
			Limit:     ratelimit.Limit{Rate: rate, Period: time.Duration(periodNs), Burst: burst},
			Prefix:    prefix,
		})
		if err != nil {
			for _, want := range []error{ratelimit.ErrInvalidLimit, ratelimit.ErrInvalidPrefix, ratelimit.ErrInvalidAlgorithm, ratelimit.ErrInvalidOptions} {
				if errors.Is(err, want) {
					return
				}
			}
			t.Fatalf("New: undocumented error %v", err)
		}
		res, err := l.AllowN(ctx, key, cost)
		if err != nil {
			for _, want := range []error{ratelimit.ErrInvalidKey, ratelimit.ErrInvalidCost, ratelimit.ErrCostTooHigh} {
				if errors.Is(err, want) {
					return
				}
			}
			t.Fatalf("AllowN(%q, %d) with %v: %v", key, cost, l.Limit(), err)
		}
		if !res.Allowed {
			t.Fatalf("first AllowN(%d) on a fresh key with %v denied: %+v", cost, l.Limit(), res)
		}
		if prefix == "" {
			prefix = ratelimit.DefaultPrefix
		}
		keys, err := client.Do(ctx, client.B().Keys().Pattern("*").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if !strings.HasPrefix(k, prefix) {
				t.Fatalf("key %q outside the prefix %q", k, prefix)
			}
		}
	})
}

// FuzzPoliciesInput feeds arbitrary names, limits, algorithms, keys and
// costs to a two-policy decision on a real Redis: nothing may panic, every
// refusal must be a documented error, a first call on a fresh key must be
// allowed when its cost fits, each policy's Remaining must lie between 0
// and its Limit, and no key may be written outside the prefix.
//
// Plain go test replays the seeds; explore with
// go test -run=NONE -fuzz=FuzzPoliciesInput ./ratelimit
func FuzzPoliciesInput(f *testing.F) {
	srv := redistest.NewServer(f)
	client := redistest.Client(f, srv.Addr())
	sc, err := scriptcache.New(context.Background(), client)
	if err != nil {
		f.Fatal(err)
	}
	l, err := ratelimit.New(sc, ratelimit.Options{Limit: ratelimit.PerSecond(1), Prefix: "fz:", DisableDenyCache: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("k", "second", 10, int64(time.Second), 0, uint8(0), "hour", 100, int64(time.Hour), 0, uint8(1), 1)
	f.Add("}{", "a", 1_000_000_000, int64(time.Millisecond), 1_000_000_000, uint8(0), "b", 1_000_000_000, int64(366*24*time.Hour), 0, uint8(2), 1_000_000_000)
	f.Add("k", "same", 1, int64(time.Second), 0, uint8(1), "same", 1, int64(time.Second), 0, uint8(1), 1)
	f.Add("k", "x\"y", 1, int64(time.Second), 0, uint8(3), "", 0, int64(0), -1, uint8(2), -1)
	f.Add("k", "w", 3, int64(24*time.Hour), 0, uint8(2), "g", 1, int64(365*24*time.Hour), 1, uint8(0), 0)
	f.Fuzz(func(t *testing.T, key, name1 string, rate1 int, period1 int64, burst1 int, alg1 uint8,
		name2 string, rate2 int, period2 int64, burst2 int, alg2 uint8, cost int) {
		ctx := context.Background()
		srv.Do("FLUSHALL")
		ps, err := ratelimit.NewPolicies(
			ratelimit.Policy{Name: name1, Algorithm: ratelimit.Algorithm(alg1 % 4), Limit: ratelimit.Limit{Rate: rate1, Period: time.Duration(period1), Burst: burst1}},
			ratelimit.Policy{Name: name2, Algorithm: ratelimit.Algorithm(alg2 % 4), Limit: ratelimit.Limit{Rate: rate2, Period: time.Duration(period2), Burst: burst2}},
		)
		if err != nil {
			for _, want := range []error{ratelimit.ErrInvalidLimit, ratelimit.ErrInvalidAlgorithm, ratelimit.ErrInvalidOptions} {
				if errors.Is(err, want) {
					return
				}
			}
			t.Fatalf("NewPolicies: undocumented error %v", err)
		}
		d, err := l.AllowPolicies(ctx, key, cost, ps)
		if err != nil {
			for _, want := range []error{ratelimit.ErrInvalidKey, ratelimit.ErrInvalidCost, ratelimit.ErrCostTooHigh} {
				if errors.Is(err, want) {
					return
				}
			}
			t.Fatalf("AllowPolicies(%q, %d) with %v: %v", key, cost, ps.List(), err)
		}
		if !d.Allowed || d.RetryAfter != 0 || len(d.Results) != 2 {
			t.Fatalf("first AllowPolicies(%d) on a fresh key with %v: %+v; want allowed", cost, ps.List(), d)
		}
		for i, r := range d.Results {
			if r.Remaining < 0 || r.Remaining > r.Limit {
				t.Fatalf("policy %d: %+v; Remaining outside [0, Limit]", i, r)
			}
		}
		keys, err := client.Do(ctx, client.B().Keys().Pattern("*").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if !strings.HasPrefix(k, "fz:{") {
				t.Fatalf("key %q outside the prefix", k)
			}
		}
	})
}
