//go:build peers

package main

import (
	"context"
	"time"

	"github.com/bsm/redislock"
)

// bsm/redislock on go-redis v9: SET NX PX, polled every 10 ms while
// contended (its LinearBackoff; the default strategy does not retry).
func init() {
	lockImpls = append(lockImpls, impl[locker]{
		name: "redislock", kind: peer,
		open: func(ctx context.Context, s *server, _ rate) (locker, func(), error) {
			client := s.goRedis()
			return redislockLocker{redislock.New(client)}, func() { _ = client.Close() }, nil
		},
	})
}

// pollInterval is how often the polling peers retry a taken lock or a full
// semaphore: the interval their documentation uses in examples.
const pollInterval = 10 * time.Millisecond

// peerTTL is the lease of the peers' locks, longer than any round.
const peerTTL = 10 * time.Second

type redislockLocker struct{ c *redislock.Client }

func (r redislockLocker) Mutex(name string) (mutex, error) {
	return &redislockMutex{c: r.c, key: name, opt: &redislock.Options{
		RetryStrategy: redislock.LinearBackoff(pollInterval),
	}}, nil
}

type redislockMutex struct {
	c    *redislock.Client
	key  string
	opt  *redislock.Options
	lock *redislock.Lock
}

func (m *redislockMutex) Lock(ctx context.Context) error {
	l, err := m.c.Obtain(ctx, m.key, peerTTL, m.opt)
	if err != nil {
		return err
	}
	m.lock = l
	return nil
}

func (m *redislockMutex) Unlock(ctx context.Context) error {
	l := m.lock
	m.lock = nil
	return l.Release(ctx)
}
