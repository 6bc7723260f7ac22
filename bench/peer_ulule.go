//go:build peers

package main

import (
	"context"

	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"
)

// ulule/limiter with its Redis store: a fixed window, one Lua script per
// call, on go-redis v9.
func init() {
	limiterImpls = append(limiterImpls, impl[limiter]{
		name: "ulule/limiter (fixed)", kind: peer,
		open: func(ctx context.Context, s *server, r rate) (limiter, func(), error) {
			client := s.goRedis()
			store, err := ululeredis.NewStoreWithOptions(client, ulule.StoreOptions{Prefix: "sluice-bench-ulule"})
			if err != nil {
				_ = client.Close()
				return nil, nil, err
			}
			l := ulule.New(store, ulule.Rate{Period: r.window, Limit: int64(r.limit)})
			return ululeLimiter{l}, func() { _ = client.Close() }, nil
		},
	})
}

type ululeLimiter struct{ l *ulule.Limiter }

func (u ululeLimiter) Allow(ctx context.Context, key string) (bool, error) {
	c, err := u.l.Get(ctx, key)
	return err == nil && !c.Reached, err
}
