package main

import (
	"context"

	sluicesem "github.com/sluicekit/sluice/semaphore"
)

// sluice's semaphore: one Manager per instance, default options (watchdog
// lease, pub/sub wake-ups), and the same with Options.Fair (a queue in
// Redis, releases grant permits straight to its waiters).
func init() {
	for _, fair := range []bool{false, true} {
		name := "sluice"
		if fair {
			name = "sluice fair"
		}
		semaphoreImpls = append(semaphoreImpls, impl[semaphores]{
			name: name, kind: ours,
			open: func(ctx context.Context, s *server, _ rate) (semaphores, func(), error) {
				sc, client, err := openCache(ctx, s)
				if err != nil {
					return nil, nil, err
				}
				mgr, err := sluicesem.NewManager(sc, sluicesem.Options{Prefix: "sluice-bench:sem:", Fair: fair})
				if err != nil {
					client.Close()
					return nil, nil, err
				}
				return sluiceSemaphores{mgr}, func() { mgr.Close(); client.Close() }, nil
			},
		})
	}
}

type sluiceSemaphores struct{ m *sluicesem.Manager }

func (s sluiceSemaphores) Semaphore(name string, capacity int) (semaphore, error) {
	sem, err := s.m.NewSemaphore(name, int64(capacity))
	if err != nil {
		return nil, err
	}
	return &sluiceSemaphore{s: sem}, nil
}

// sluiceSemaphore holds the permit of its last Acquire.
type sluiceSemaphore struct {
	s *sluicesem.Semaphore
	p *sluicesem.Permit
}

func (s *sluiceSemaphore) Acquire(ctx context.Context) error {
	p, err := s.s.Acquire(ctx, 1)
	if err != nil {
		return err
	}
	s.p = p
	return nil
}

func (s *sluiceSemaphore) Release(ctx context.Context) error {
	p := s.p
	s.p = nil
	return p.Release(ctx)
}
