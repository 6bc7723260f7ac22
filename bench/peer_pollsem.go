//go:build peers

package main

import (
	"context"
	"crypto/rand"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// The common Redis semaphore recipe, as there is no widely used library: a
// sorted set of holders scored by the time they acquired; a script drops
// holders older than the lease and adds the caller if fewer than capacity
// remain; a caller that does not get in polls again every 10 ms.
func init() {
	semaphoreImpls = append(semaphoreImpls, impl[semaphores]{
		name: "polling ZSET", kind: peer,
		open: func(ctx context.Context, s *server, _ rate) (semaphores, func(), error) {
			client := s.goRedis()
			return pollSemaphores{client}, func() { _ = client.Close() }, nil
		},
	})
}

// pollAcquire: KEYS[1] the holders' sorted set; ARGV[1] capacity, ARGV[2]
// the caller's id, ARGV[3] now in ms, ARGV[4] lease in ms. Returns 1 if the
// caller got a permit, else 0.
var pollAcquire = goredis.NewScript(`
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[3]) - tonumber(ARGV[4]))
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return 1
end
return 0`)

type pollSemaphores struct{ c goredis.UniversalClient }

func (p pollSemaphores) Semaphore(name string, capacity int) (semaphore, error) {
	return &pollSemaphore{c: p.c, key: name, capacity: capacity, id: rand.Text()}, nil
}

// pollSemaphore is one holder; its id is unique, so it is its member in the set.
type pollSemaphore struct {
	c        goredis.UniversalClient
	key      string
	capacity int
	id       string
}

func (s *pollSemaphore) Acquire(ctx context.Context) error {
	for {
		now := strconv.FormatInt(time.Now().UnixMilli(), 10)
		ok, err := pollAcquire.Run(ctx, s.c, []string{s.key}, s.capacity, s.id, now, peerTTL.Milliseconds()).Int()
		if err != nil || ok == 1 {
			return err
		}
		t := time.NewTimer(pollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (s *pollSemaphore) Release(ctx context.Context) error {
	return s.c.ZRem(ctx, s.key, s.id).Err()
}
