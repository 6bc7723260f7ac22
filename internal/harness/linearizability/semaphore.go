package linearizability

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/semaphore"
)

const histSemaphore = "semaphore"

// semCapacity is small against the 12 (or 32) clients, so that most
// acquisitions wait and the semaphore is full most of the time.
const semCapacity = 3

// permit is what the semaphore workers need of one acquisition.
type permit interface {
	Release(ctx context.Context) error
}

// acquirer is what the semaphore workers need of a semaphore. TryAcquire
// returns a nil permit if n permits were not free.
type acquirer interface {
	Acquire(ctx context.Context, n int64) (permit, error)
	TryAcquire(ctx context.Context, n int64) (permit, error)
}

// weight returns the weight of a client's i-th acquisition: 1 or 2, so that
// acquisitions of different sizes compete (a 2 must wait for two free
// permits while 1s keep coming).
func weight(client, i int) int64 { return int64(1 + (client+i)%2) }

// semaphoreWorker returns a worker that does cfg.Ops acquire, hold, release
// rounds. The hold is one round trip to Redis, as real work holding a
// permit would be, so holders overlap in time. Every third round starts
// with a TryAcquire, recorded as an acquire if it got the permits and as
// busy if not (then Acquire follows).
func semaphoreWorker(t *testing.T, c rueidis.Client, cfg config, sem acquirer) func(r *recorder) {
	return func(r *recorder) {
		ctx := context.Background()
		for i := range cfg.Ops {
			n := weight(r.client, i)
			var p permit
			var err error
			if i%3 == 0 {
				call := now()
				p, err = sem.TryAcquire(ctx, n)
				op := opAcquire
				if p == nil {
					op = opBusy
				}
				r.recs = append(r.recs, record{Hist: histSemaphore, Client: r.client, Op: op, Val: n, Call: call, Ret: now()})
				if err != nil {
					t.Errorf("tryacquire %d: %v", n, err)
					return
				}
			}
			if p == nil {
				r.do(histSemaphore, opAcquire, func() (int64, bool) {
					p, err = sem.Acquire(ctx, n)
					return n, true
				})
				if err != nil {
					t.Errorf("acquire %d: %v", n, err)
					return
				}
			}
			if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
				t.Errorf("hold: %v", err)
				return
			}
			r.do(histSemaphore, opRelease, func() (int64, bool) {
				err = p.Release(ctx)
				return n, true
			})
			if err != nil {
				t.Errorf("release %d: %v", n, err)
				return
			}
		}
	}
}

// semaphoreRole runs the real semaphore: one Manager per process, as the
// package doc asks, with the default watchdog lease so that no permit
// expires during the run.
func semaphoreRole(t *testing.T, p proc, start func(func(*recorder)) []record) []record {
	mgr, err := semaphore.NewManager(p.cache(t), semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	sem, err := mgr.NewSemaphore(p.cfg.Name, p.cfg.Capacity)
	if err != nil {
		t.Fatal(err)
	}
	return start(semaphoreWorker(t, p.c, p.cfg, realSemaphore{sem}))
}

// realSemaphore adapts *semaphore.Semaphore to acquirer.
type realSemaphore struct{ s *semaphore.Semaphore }

func (s realSemaphore) Acquire(ctx context.Context, n int64) (permit, error) {
	p, err := s.s.Acquire(ctx, n)
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (s realSemaphore) TryAcquire(ctx context.Context, n int64) (permit, error) {
	p, err := s.s.TryAcquire(ctx, n)
	if errors.Is(err, semaphore.ErrNotObtained) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}
