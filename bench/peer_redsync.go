//go:build peers

package main

import (
	"context"
	"errors"

	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
)

// go-redsync/redsync with one go-redis v9 pool (the single-instance
// Redlock), retrying every 10 ms while contended instead of its default
// 50-250 ms, with enough tries to outlast a round.
func init() {
	lockImpls = append(lockImpls, impl[locker]{
		name: "redsync", kind: peer,
		open: func(ctx context.Context, s *server, _ rate) (locker, func(), error) {
			client := s.goRedis()
			rs := redsync.New(redsyncgoredis.NewPool(client))
			return redsyncLocker{rs}, func() { _ = client.Close() }, nil
		},
	})
}

type redsyncLocker struct{ rs *redsync.Redsync }

func (r redsyncLocker) Mutex(name string) (mutex, error) {
	return redsyncMutex{r.rs.NewMutex(name,
		redsync.WithExpiry(peerTTL),
		redsync.WithRetryDelay(pollInterval),
		redsync.WithTries(1000),
	)}, nil
}

type redsyncMutex struct{ m *redsync.Mutex }

func (m redsyncMutex) Lock(ctx context.Context) error { return m.m.LockContext(ctx) }

func (m redsyncMutex) Unlock(ctx context.Context) error {
	ok, err := m.m.UnlockContext(ctx)
	if err == nil && !ok {
		err = errors.New("redsync: unlock failed")
	}
	return err
}
