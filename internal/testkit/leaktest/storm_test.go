// Package leaktest_test runs a cancel storm over every primitive: thousands
// of operations with random cancellation, then Close. Afterwards no
// goroutine may be left (goleak, run by redistest.Main after the package)
// and, once the leases have run out, no key may be left in Redis.
package leaktest_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestCancelStorm(t *testing.T) {
	ops := 10_000
	if os.Getenv("SLUICE_LONG") == "1" {
		ops = 100_000
	}
	const lease = 500 * time.Millisecond
	ctx := context.Background()
	srv := redistest.NewServer(t)
	sc, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	locks, err := mutex.NewLocker(sc, mutex.Options{WatchdogLease: lease})
	if err != nil {
		t.Fatal(err)
	}
	sems, err := semaphore.NewManager(sc, semaphore.Options{WatchdogLease: lease})
	if err != nil {
		t.Fatal(err)
	}
	limiters := make([]*ratelimit.Limiter, 0, 3)
	for _, alg := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow, ratelimit.GCRA} {
		l, err := ratelimit.New(sc, ratelimit.Options{Algorithm: alg, Limit: ratelimit.Limit{Rate: 50, Period: lease}})
		if err != nil {
			t.Fatal(err)
		}
		limiters = append(limiters, l)
	}

	var next, done, cancelled, lost atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(ops) {
					return
				}
				// Up to 20 ms: many operations end mid-call or mid-wait.
				octx, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(20_000))*time.Microsecond)
				err := operation(octx, i, locks, sems, limiters)
				cancel()
				switch {
				case err == nil:
					done.Add(1)
				case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
					cancelled.Add(1)
				case lostBeforeRelease(err):
					// On a loaded machine a hold can outlive its lease
					// between Lock and Unlock: a right answer, if it says so.
					lost.Add(1)
				default:
					t.Errorf("operation %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	locks.Close()
	sems.Close()
	t.Logf("%d operations: %d completed, %d cancelled, %d lost before their release", ops, done.Load(), cancelled.Load(), lost.Load())
	if done.Load() == 0 || cancelled.Load() == 0 {
		t.Errorf("the storm should both complete and cancel operations")
	}
	// Abandoned grants are released when their late replies come; anything
	// else expires with its lease or window.
	if !redistest.WaitFor(ctx, 3*lease+2*time.Second, func() bool {
		n, _ := srv.Do("DBSIZE")
		return n == "0"
	}) {
		keys, _ := srv.Do("KEYS", "*")
		t.Errorf("keys left after the leases ran out:\n%s", keys)
	}
}

// lostBeforeRelease reports whether err is an Unlock or Release that found
// the hold gone because it was lost (expired) first.
func lostBeforeRelease(err error) bool {
	return errors.Is(err, mutex.ErrNotHeld) && errors.Is(err, mutex.ErrLost) ||
		errors.Is(err, semaphore.ErrNotHeld) && errors.Is(err, semaphore.ErrLost)
}

// lockOperation runs one of the lock family's calls in turn: a Mutex, a
// fair Mutex, a read and a write hold of an RWMutex, and a MultiMutex.
func lockOperation(ctx context.Context, i int64, name string, locks *mutex.Locker) error {
	unlock := context.WithoutCancel(ctx)
	switch i % 5 {
	case 0, 1:
		m, err := locks.NewMutex("storm:"+name, mutex.WithFair(i%5 == 1))
		if err != nil {
			return err
		}
		if err := m.Lock(ctx); err != nil {
			return err
		}
		return m.Unlock(unlock)
	case 2, 3:
		rw, err := locks.NewRWMutex("storm-rw:" + name)
		if err != nil {
			return err
		}
		if i%5 == 2 {
			if err := rw.RLock(ctx); err != nil {
				return err
			}
			return rw.RUnlock(unlock)
		}
		if err := rw.Lock(ctx); err != nil {
			return err
		}
		return rw.Unlock(unlock)
	default:
		mm, err := locks.NewMultiMutex([]string{"storm-multi:" + name, "storm-multi:" + name + "b"})
		if err != nil {
			return err
		}
		if err := mm.Lock(ctx); err != nil {
			return err
		}
		return mm.Unlock(unlock)
	}
}

// operation runs one randomly chosen primitive call. Unlock and Release
// use the uncancelled context: giving back what is held is not optional.
func operation(ctx context.Context, i int64, locks *mutex.Locker, sems *semaphore.Manager, limiters []*ratelimit.Limiter) error {
	name := strconv.FormatInt(i%8, 10)
	switch i % 3 {
	case 0:
		return lockOperation(ctx, i/3, name, locks)
	case 1:
		s, err := sems.NewSemaphore("storm:"+name, 3)
		if err != nil {
			return err
		}
		p, err := s.Acquire(ctx, 1+i%3)
		if err != nil {
			return err
		}
		return p.Release(context.WithoutCancel(ctx))
	default:
		_, err := limiters[i%int64(len(limiters))].Allow(ctx, "storm:"+name)
		return err
	}
}
