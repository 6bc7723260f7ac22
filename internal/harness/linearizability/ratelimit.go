package linearizability

import (
	"context"
	"testing"
	"time"

	"github.com/sluicekit/sluice/ratelimit"
)

// cost returns the cost of a client's i-th request: mostly 1, every third
// 2, so that a request of 2 can be denied while one of 1 still fits.
func cost(client, i int) int64 { return int64(1 + (client+i)%3/2) }

// limiterPeriod returns a period for the rate limiters under test such that
// every call of a run falls in one window and no bucket refills: the
// histories can then be checked against "at most limit allowed, and denied
// only when full". The fixed window starts at the first request and GCRA
// refills one request per period/limit (over a minute here), so any long
// period does for them. The sliding window's windows are aligned on
// multiples of the period since the Unix epoch, so the period is chosen so
// that the current window does not end within ten minutes (the helpers'
// run is bounded far below that).
func limiterPeriod() time.Duration {
	p := 24 * time.Hour
	for {
		left := p - time.Duration(time.Now().UnixNano()%int64(p))
		if left > 10*time.Minute {
			return p
		}
		p += time.Hour
	}
}

// limiterSetups are the limiters each ratelimit helper runs, by history
// name: every algorithm, with the local deny cache (the default) and
// without it, so the scripts' own denials are exercised too.
var limiterSetups = []struct {
	hist    string
	algo    ratelimit.Algorithm
	noCache bool
}{
	{"fixed-window", ratelimit.FixedWindow, false},
	{"sliding-window", ratelimit.SlidingWindow, false},
	{"gcra", ratelimit.GCRA, false},
	{"fixed-window/no-deny-cache", ratelimit.FixedWindow, true},
	{"sliding-window/no-deny-cache", ratelimit.SlidingWindow, true},
	{"gcra/no-deny-cache", ratelimit.GCRA, true},
}

// limiterFunc decides one request of cost n.
type limiterFunc func(ctx context.Context, n int64) (bool, error)

// limiterWorker returns a worker that makes cfg.Ops rounds of requests,
// one to each limiter per round.
func limiterWorker(t *testing.T, cfg config, hists []string, limiters []limiterFunc) func(r *recorder) {
	return func(r *recorder) {
		ctx := context.Background()
		for i := range cfg.Ops {
			n := cost(r.client, i)
			for j, allow := range limiters {
				var err error
				r.do(hists[j], opAllow, func() (int64, bool) {
					var ok bool
					ok, err = allow(ctx, n)
					return n, ok
				})
				if err != nil {
					t.Errorf("%s: allow %d: %v", hists[j], n, err)
					return
				}
			}
		}
	}
}

// ratelimitRole runs a ratelimit.Limiter per setup, all on key cfg.Name
// (the algorithms and the two prefixes keep their keys apart).
func ratelimitRole(t *testing.T, p proc, start func(func(*recorder)) []record) []record {
	cfg := p.cfg
	sc := p.cache(t)
	var hists []string
	var limiters []limiterFunc
	for _, s := range limiterSetups {
		prefix := "lin:rl:"
		if s.noCache {
			prefix = "lin:rl-nc:"
		}
		lim, err := ratelimit.New(sc, ratelimit.Options{
			Algorithm:        s.algo,
			Limit:            ratelimit.Limit{Rate: cfg.Limit, Period: time.Duration(cfg.PeriodMs) * time.Millisecond},
			Prefix:           prefix,
			DisableDenyCache: s.noCache,
		})
		if err != nil {
			t.Fatal(err)
		}
		hists = append(hists, s.hist)
		limiters = append(limiters, func(ctx context.Context, n int64) (bool, error) {
			res, err := lim.AllowN(ctx, cfg.Name, int(n))
			return res.Allowed, err
		})
	}
	return start(limiterWorker(t, cfg, hists, limiters))
}

// limiterLimit is the limit for a run of sc: half the number of requests,
// under 40% of their total cost, so the limit is reached early and most of
// the run is spent at it, where a limiter can go wrong.
func limiterLimit(sc scale) int { return sc.procs * sc.goroutines * sc.ops / 2 }
