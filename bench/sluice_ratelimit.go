package main

import (
	"context"

	"github.com/sluicekit/sluice/ratelimit"
)

// sluice's ratelimit, one implementation per algorithm, default options (the
// deny cache on).
func init() {
	for _, a := range []struct {
		algo   ratelimit.Algorithm
		script string
	}{
		{ratelimit.FixedWindow, "ratelimit_fixed"},
		{ratelimit.SlidingWindow, "ratelimit_sliding"},
		{ratelimit.GCRA, "ratelimit_gcra"},
	} {
		limiterImpls = append(limiterImpls, impl[limiter]{
			name: "sluice " + a.algo.String(), kind: ours, script: a.script,
			open: func(ctx context.Context, s *server, r rate) (limiter, func(), error) {
				sc, client, err := openCache(ctx, s)
				if err != nil {
					return nil, nil, err
				}
				l, err := ratelimit.New(sc, ratelimit.Options{
					Algorithm: a.algo,
					Limit:     ratelimit.Limit{Rate: r.limit, Period: r.window},
					Prefix:    "sluice-bench:rl:",
				})
				if err != nil {
					client.Close()
					return nil, nil, err
				}
				return sluiceLimiter{l}, client.Close, nil
			},
		})
	}
}

type sluiceLimiter struct{ l *ratelimit.Limiter }

func (s sluiceLimiter) Allow(ctx context.Context, key string) (bool, error) {
	res, err := s.l.Allow(ctx, key)
	return res.Allowed, err
}
