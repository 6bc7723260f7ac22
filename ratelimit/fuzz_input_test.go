package ratelimit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/redistest"
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
