//go:build peers

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"
)

// go-redis/redis_rate: GCRA in one Lua script per call, on go-redis v9.
func init() {
	limiterImpls = append(limiterImpls, impl[limiter]{
		name: "redis_rate (GCRA)", kind: peer,
		open: func(ctx context.Context, s *server, r rate) (limiter, func(), error) {
			if r.window != time.Second {
				return nil, nil, fmt.Errorf("redis_rate adapter: window %s not supported", r.window)
			}
			client := s.goRedis()
			l := &redisRateLimiter{l: redis_rate.NewLimiter(client), limit: redis_rate.PerSecond(r.limit)}
			return l, func() { _ = client.Close() }, nil
		},
	})
}

type redisRateLimiter struct {
	l     *redis_rate.Limiter
	limit redis_rate.Limit
}

func (r *redisRateLimiter) Allow(ctx context.Context, key string) (bool, error) {
	res, err := r.l.Allow(ctx, key, r.limit)
	if err != nil {
		return false, err
	}
	return res.Allowed > 0, nil
}
