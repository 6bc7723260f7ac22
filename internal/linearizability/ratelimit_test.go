package linearizability

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

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
func ratelimitRole(t *testing.T, c rueidis.Client, cfg config, start func(func(*recorder)) []record) []record {
	sc := scriptCache(t, c, cfg)
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

// readThenIncrLimiter is a broken fixed-window limiter: it reads the count
// and, if the request fits, adds its cost in a second round trip. Clients
// that read the same count near the limit are all allowed.
type readThenIncrLimiter struct {
	c     rueidis.Client
	key   string
	limit int64
}

func (l readThenIncrLimiter) allow(ctx context.Context, n int64) (bool, error) {
	used, err := l.c.Do(ctx, l.c.B().Get().Key(l.key).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		used, err = 0, nil
	}
	if err != nil {
		return false, err
	}
	time.Sleep(raceWindow)
	if used+n > l.limit {
		return false, nil
	}
	return true, l.c.Do(ctx, l.c.B().Incrby().Key(l.key).Increment(n).Build()).Error()
}

const histBrokenLimiter = "broken-limiter"

// brokenLimit is the broken limiter's limit: low, so that it is overrun
// early in the history. To prove a history illegal porcupine must rule out
// every order of the operations before the overrun, and that work grows
// with how many there are and how many run at once.
const brokenLimit = 30

func brokenRatelimitRole(t *testing.T, c rueidis.Client, cfg config, start func(func(*recorder)) []record) []record {
	l := readThenIncrLimiter{c: c, key: cfg.Name + ":count", limit: int64(cfg.Limit)}
	return start(limiterWorker(t, cfg, []string{histBrokenLimiter}, []limiterFunc{l.allow}))
}

// limiterLimit is the limit for a run of sc: half the number of requests,
// under 40% of their total cost, so the limit is reached early and most of
// the run is spent at it, where a limiter can go wrong.
func limiterLimit(sc scale) int { return sc.procs * sc.goroutines * sc.ops / 2 }

// TestRateLimitLinearizable records the decisions of every algorithm from
// several processes, with all requests inside one window, and checks that
// no more than the limit was allowed and nothing was denied while there
// was room.
func TestRateLimitLinearizable(t *testing.T) {
	sc := histScale()
	limit := limiterLimit(sc)
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			hists := runHelpers(t, config{
				Role: "ratelimit", Addrs: tg.addrs(t), Name: uniqueName(t),
				Limit: limit, PeriodMs: limiterPeriod().Milliseconds(),
			}, sc)
			for _, s := range limiterSetups {
				wantLinearizable(t, s.hist, limiterModel(int64(limit)), hists[s.hist], sc.procs*sc.goroutines*sc.ops)
			}
		})
	}
}

// TestBrokenRateLimitCaught requires the checker to reject the history of a
// limiter that reads and then increments in two round trips.
func TestBrokenRateLimitCaught(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			sc := brokenScale
			hists := runHelpers(t, config{Role: "broken-ratelimit", Addrs: tg.addrs(t), Name: uniqueName(t), Limit: brokenLimit}, sc)
			wantIllegal(t, "limiter", limiterModel(brokenLimit), hists[histBrokenLimiter], sc.procs*sc.goroutines*sc.ops)
		})
	}
}
