package linearizability

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/mutex"
)

// Histories recorded by the mutex roles.
const (
	histLock    = "lock"
	histCounter = "counter"
)

// counterKey is the counter the critical sections of lock name increment.
func counterKey(name string) string { return name + ":counter" }

// incrSection is the critical section: a read and a write of a counter in
// two round trips, which only mutual exclusion makes an increment. It
// returns the value read.
func incrSection(ctx context.Context, c rueidis.Client, key string) (int64, error) {
	v, err := c.Do(ctx, c.B().Get().Key(key).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		v, err = 0, nil
	}
	if err != nil {
		return 0, err
	}
	return v, c.Do(ctx, c.B().Set().Key(key).Value(strconv.FormatInt(v+1, 10)).Build()).Error()
}

// locker is what the mutex workers need of a lock: Lock returns the fencing
// token of the acquisition; TryLock also whether it got the lock.
type locker interface {
	Lock(ctx context.Context) (int64, error)
	TryLock(ctx context.Context) (int64, bool, error)
	Unlock(ctx context.Context) error
}

// lockWorker returns a worker that does cfg.Ops critical sections, each
// recorded as acquire (with its token), incr (the section) and release.
// Every third section starts with a TryLock, recorded as an acquire if it
// got the lock and as busy if not (then Lock follows).
func lockWorker(t *testing.T, c rueidis.Client, cfg config, newLock func() (locker, error)) func(r *recorder) {
	return func(r *recorder) {
		ctx := context.Background()
		l, err := newLock()
		if err != nil {
			t.Error(err)
			return
		}
		for i := range cfg.Ops {
			var token int64
			var err error
			held := false
			if i%3 == 0 {
				call := now()
				token, held, err = l.TryLock(ctx)
				op := opAcquire
				if !held {
					op = opBusy
				}
				r.recs = append(r.recs, record{Hist: histLock, Client: r.client, Op: op, Val: token, Call: call, Ret: now()})
				if err != nil {
					t.Errorf("trylock: %v", err)
					return
				}
			}
			if !held {
				r.do(histLock, opAcquire, func() (int64, bool) {
					token, err = l.Lock(ctx)
					return token, true
				})
				if err != nil {
					t.Errorf("lock: %v", err)
					return
				}
			}
			r.do(histCounter, opIncr, func() (int64, bool) {
				var v int64
				v, err = incrSection(ctx, c, counterKey(cfg.Name))
				return v, true
			})
			if err != nil {
				t.Errorf("critical section: %v", err)
				return
			}
			r.do(histLock, opRelease, func() (int64, bool) {
				err = l.Unlock(ctx)
				return token, true
			})
			// A mutant lock lets others take over, and the owner it
			// displaced finds it not held: its release is recorded all
			// the same, and the history shows the overlap.
			if err != nil && !(cfg.Mutant != "" && errors.Is(err, mutex.ErrNotHeld)) {
				t.Errorf("unlock: %v", err)
				return
			}
		}
	}
}

// realMutex adapts *mutex.Mutex to locker.
type realMutex struct{ m *mutex.Mutex }

func (m realMutex) Lock(ctx context.Context) (int64, error) {
	if err := m.m.Lock(ctx); err != nil {
		return 0, err
	}
	return m.m.Token(), nil
}

func (m realMutex) TryLock(ctx context.Context) (int64, bool, error) {
	err := m.m.TryLock(ctx)
	if errors.Is(err, mutex.ErrNotObtained) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return m.m.Token(), true, nil
}

func (m realMutex) Unlock(ctx context.Context) error { return m.m.Unlock(ctx) }

// mutexRole runs the real mutex: one Locker per process, as recommended,
// and one Mutex (one owner) per goroutine.
func mutexRole(t *testing.T, p proc, start func(func(*recorder)) []record) []record {
	locks, err := mutex.NewLocker(p.cache(t), mutex.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	return start(lockWorker(t, p.c, p.cfg, func() (locker, error) {
		m, err := locks.NewMutex(p.cfg.Name)
		return realMutex{m}, err
	}))
}
