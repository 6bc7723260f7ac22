package main

import (
	"context"

	sluicemutex "github.com/sluicekit/sluice/mutex"
)

// sluice's mutex: one Locker per instance, default options (watchdog lease,
// pub/sub wake-ups), and the same with Options.Fair (a queue in Redis and a
// direct hand-off to its head). A *mutex.Mutex already has the Lock and
// Unlock a workload needs, so it is used as it is.
func init() {
	for _, fair := range []bool{false, true} {
		name := "sluice"
		if fair {
			name = "sluice fair"
		}
		lockImpls = append(lockImpls, impl[locker]{
			name: name, kind: ours,
			open: func(ctx context.Context, s *server, _ rate) (locker, func(), error) {
				sc, client, err := openCache(ctx, s)
				if err != nil {
					return nil, nil, err
				}
				locks, err := sluicemutex.NewLocker(sc, sluicemutex.Options{Prefix: "sluice-bench:mutex:", Fair: fair})
				if err != nil {
					client.Close()
					return nil, nil, err
				}
				return sluiceLocker{locks}, func() { locks.Close(); client.Close() }, nil
			},
		})
	}
}

type sluiceLocker struct{ l *sluicemutex.Locker }

func (s sluiceLocker) Mutex(name string) (mutex, error) { return s.l.NewMutex(name) }
