//go:build peers

package main

import (
	"context"

	"github.com/sluicekit/sluice"
	sluicegoredis "github.com/sluicekit/sluice/goredis"
	sluicemutex "github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/ratelimit"
	sluicesem "github.com/sluicekit/sluice/semaphore"
)

// sluice on go-redis (module github.com/sluicekit/sluice/goredis): the same
// primitives with default options, on the go-redis client the go-redis
// based peers use, so the table shows what the client choice costs.
func init() {
	const name = "sluice (go-redis)"
	lockImpls = append(lockImpls, impl[locker]{
		name: name, kind: ours,
		open: func(ctx context.Context, s *server, _ rate) (locker, func(), error) {
			sc, closeClient, err := openGoRedisCache(ctx, s)
			if err != nil {
				return nil, nil, err
			}
			locks, err := sluicemutex.NewLocker(sc, sluicemutex.Options{Prefix: "sluice-bench:mutex:"})
			if err != nil {
				closeClient()
				return nil, nil, err
			}
			return sluiceLocker{locks}, func() { locks.Close(); closeClient() }, nil
		},
	})
	semaphoreImpls = append(semaphoreImpls, impl[semaphores]{
		name: name, kind: ours,
		open: func(ctx context.Context, s *server, _ rate) (semaphores, func(), error) {
			sc, closeClient, err := openGoRedisCache(ctx, s)
			if err != nil {
				return nil, nil, err
			}
			mgr, err := sluicesem.NewManager(sc, sluicesem.Options{Prefix: "sluice-bench:sem:"})
			if err != nil {
				closeClient()
				return nil, nil, err
			}
			return sluiceSemaphores{mgr}, func() { mgr.Close(); closeClient() }, nil
		},
	})
	limiterImpls = append(limiterImpls, impl[limiter]{
		name: "sluice fixed-window (go-redis)", kind: ours, script: "ratelimit_fixed",
		open: func(ctx context.Context, s *server, r rate) (limiter, func(), error) {
			sc, closeClient, err := openGoRedisCache(ctx, s)
			if err != nil {
				return nil, nil, err
			}
			l, err := ratelimit.New(sc, ratelimit.Options{
				Algorithm: ratelimit.FixedWindow,
				Limit:     ratelimit.Limit{Rate: r.limit, Period: r.window},
				Prefix:    "sluice-bench:rl:",
			})
			if err != nil {
				closeClient()
				return nil, nil, err
			}
			return sluiceLimiter{l}, closeClient, nil
		},
	})
}

// openGoRedisCache is openCache on a go-redis client.
func openGoRedisCache(ctx context.Context, s *server) (*sluice.Client, func(), error) {
	client := s.goRedis()
	sc, err := sluicegoredis.New(ctx, client)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return sc, func() { client.Close() }, nil
}
