package main

import (
	"context"
	"slices"
	"time"

	sluicemutex "github.com/sluicekit/sluice/mutex"
)

// Optional capabilities of a locker. A library without them is measured
// the way its users would have to do the same job: exclusive holds instead
// of shared ones, and several locks taken one by one in sorted order
// instead of a multi-lock.

// sharedLocker makes handles whose Lock and Unlock take a shared (read)
// hold.
type sharedLocker interface {
	SharedMutex(name string) (mutex, error)
}

// multiLocker makes one handle for several names, locked all or nothing.
type multiLocker interface {
	MultiMutex(names []string) (mutex, error)
}

func init() {
	lockWorkloads = append(lockWorkloads,
		workload[locker]{
			name: "lock.shared", title: "shared section: 8 goroutines in 2 programs, 1ms holds (readers of an RWMutex where the library has one)",
			goroutines: 8, instances: 2, long: true, loops: sharedSections(4),
		},
		workload[locker]{
			name: "lock.multi", title: "two names locked together, in opposite orders by 2 programs x 4 goroutines",
			goroutines: 8, instances: 2, long: true, loops: multiSections(4),
		},
	)
}

// sharedSections: every goroutine repeatedly holds the same name for
// holdTime; with shared holds they overlap, with exclusive ones they queue.
func sharedSections(perInstance int) func([]locker, string) ([]loop, error) {
	return func(xs []locker, ns string) ([]loop, error) {
		var loops []loop
		for _, x := range xs {
			for range perInstance {
				var m mutex
				var err error
				if s, ok := x.(sharedLocker); ok {
					m, err = s.SharedMutex(ns + "shared")
				} else {
					m, err = x.Mutex(ns + "shared")
				}
				if err != nil {
					return nil, err
				}
				loops = append(loops, repeat(func(ctx context.Context, _ *recorder) error {
					if err := m.Lock(ctx); err != nil {
						return err
					}
					time.Sleep(holdTime)
					return m.Unlock(ctx)
				}))
			}
		}
		return loops, nil
	}
}

// multiSections: goroutines lock the pair of names (a, b), half of them
// listing it as (b, a), as a transfer between two accounts would.
func multiSections(perInstance int) func([]locker, string) ([]loop, error) {
	return func(xs []locker, ns string) ([]loop, error) {
		var loops []loop
		for i, x := range xs {
			for g := range perInstance {
				names := []string{ns + "acct:a", ns + "acct:b"}
				if (i+g)%2 == 1 {
					names[0], names[1] = names[1], names[0]
				}
				var m mutex
				var err error
				if ml, ok := x.(multiLocker); ok {
					m, err = ml.MultiMutex(names)
				} else {
					m, err = sortedPair(x, names)
				}
				if err != nil {
					return nil, err
				}
				loops = append(loops, repeat(func(ctx context.Context, _ *recorder) error {
					if err := m.Lock(ctx); err != nil {
						return err
					}
					return m.Unlock(ctx)
				}))
			}
		}
		return loops, nil
	}
}

// sortedPair locks names one by one in sorted order (the usual way to avoid
// deadlock without a multi-lock) and unlocks in reverse.
func sortedPair(x locker, names []string) (mutex, error) {
	names = slices.Sorted(slices.Values(names))
	var p pair
	for _, n := range names {
		m, err := x.Mutex(n)
		if err != nil {
			return nil, err
		}
		p = append(p, m)
	}
	return p, nil
}

type pair []mutex

func (p pair) Lock(ctx context.Context) error {
	for i, m := range p {
		if err := m.Lock(ctx); err != nil {
			for j := i - 1; j >= 0; j-- {
				_ = p[j].Unlock(context.WithoutCancel(ctx)) // giving back after a failure: the failure is what is reported
			}
			return err
		}
	}
	return nil
}

func (p pair) Unlock(ctx context.Context) error {
	var first error
	for i := len(p) - 1; i >= 0; i-- {
		if err := p[i].Unlock(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (s sluiceLocker) SharedMutex(name string) (mutex, error) {
	rw, err := s.l.NewRWMutex(name)
	if err != nil {
		return nil, err
	}
	return readHold{rw}, nil
}

func (s sluiceLocker) MultiMutex(names []string) (mutex, error) {
	return s.l.NewMultiMutex(names)
}

// readHold is an RWMutex's read side as a mutex.
type readHold struct{ rw *sluicemutex.RWMutex }

func (r readHold) Lock(ctx context.Context) error   { return r.rw.RLock(ctx) }
func (r readHold) Unlock(ctx context.Context) error { return r.rw.RUnlock(ctx) }
