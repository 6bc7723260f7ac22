//go:build peers

package main

import (
	"context"

	"github.com/redis/rueidis/rueidislock"
)

// rueidislock, the lock that ships with rueidis: waiters are woken by
// client-side-caching invalidations. It is run with one key per lock
// (KeyMajority 1), like every other lock here; its default majority of
// three keys spreads a lock over cluster nodes, buys nothing on one server
// and costs about twice the round trips and allocations.
func init() {
	lockImpls = append(lockImpls, impl[locker]{
		name: "rueidislock", kind: peer,
		open: func(ctx context.Context, s *server, _ rate) (locker, func(), error) {
			l, err := rueidislock.NewLocker(rueidislock.LockerOption{
				ClientOption: s.rueidisOption(),
				KeyPrefix:    "sluice-bench-rueidislock",
				KeyMajority:  1,
			})
			if err != nil {
				return nil, nil, err
			}
			return rueidisLocker{l}, l.Close, nil
		},
	})
}

type rueidisLocker struct{ l rueidislock.Locker }

func (r rueidisLocker) Mutex(name string) (mutex, error) {
	return &rueidisMutex{l: r.l, name: name}, nil
}

// rueidisMutex holds the cancel function rueidislock returns for a held
// lock; calling it releases the lock and waits for that to finish.
type rueidisMutex struct {
	l      rueidislock.Locker
	name   string
	cancel context.CancelFunc
}

func (m *rueidisMutex) Lock(ctx context.Context) error {
	_, cancel, err := m.l.WithContext(ctx, m.name)
	if err != nil {
		return err
	}
	m.cancel = cancel
	return nil
}

func (m *rueidisMutex) Unlock(context.Context) error {
	m.cancel()
	m.cancel = nil
	return nil
}
