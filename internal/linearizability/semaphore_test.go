package linearizability

import (
	"context"
	"errors"
	"testing"
	"time"

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
func semaphoreRole(t *testing.T, c rueidis.Client, cfg config, start func(func(*recorder)) []record) []record {
	sc := scriptCache(t, c, cfg)
	mgr, err := semaphore.NewManager(sc, semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	sem, err := mgr.NewSemaphore(cfg.Name, cfg.Capacity)
	if err != nil {
		t.Fatal(err)
	}
	return start(semaphoreWorker(t, c, cfg, realSemaphore{sem}))
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

// checkThenIncrSemaphore is a broken semaphore: it reads how many permits
// are in use and, if n more fit, adds n in a second round trip. Clients
// that read the same count all add theirs, past the capacity.
type checkThenIncrSemaphore struct {
	c        rueidis.Client
	key      string
	capacity int64
}

type counterPermit struct {
	s checkThenIncrSemaphore
	n int64
}

func (s checkThenIncrSemaphore) Acquire(ctx context.Context, n int64) (permit, error) {
	for {
		p, err := s.TryAcquire(ctx, n)
		if p != nil || err != nil {
			return p, err
		}
		time.Sleep(pollInterval)
	}
}

func (s checkThenIncrSemaphore) TryAcquire(ctx context.Context, n int64) (permit, error) {
	used, err := s.c.Do(ctx, s.c.B().Get().Key(s.key).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		used, err = 0, nil
	}
	if err != nil || used+n > s.capacity {
		return nil, err
	}
	time.Sleep(raceWindow)
	if err := s.c.Do(ctx, s.c.B().Incrby().Key(s.key).Increment(n).Build()).Error(); err != nil {
		return nil, err
	}
	return counterPermit{s, n}, nil
}

func (p counterPermit) Release(ctx context.Context) error {
	return p.s.c.Do(ctx, p.s.c.B().Decrby().Key(p.s.key).Decrement(p.n).Build()).Error()
}

func brokenSemaphoreRole(t *testing.T, c rueidis.Client, cfg config, start func(func(*recorder)) []record) []record {
	s := checkThenIncrSemaphore{c: c, key: cfg.Name + ":used", capacity: cfg.Capacity}
	return start(semaphoreWorker(t, c, cfg, s))
}

// TestSemaphoreLinearizable records Acquire and Release of
// semaphore.Semaphore from several processes and checks that at no point
// more than the capacity was held.
func TestSemaphoreLinearizable(t *testing.T) {
	sc := histScale()
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			hists := runHelpers(t, config{Role: "semaphore", Addrs: tg.addrs(t), Name: uniqueName(t), Capacity: semCapacity}, sc)
			wantLinearizable(t, "semaphore", semaphoreModel(semCapacity), hists[histSemaphore], 2*sc.procs*sc.goroutines*sc.ops)
		})
	}
}

// TestBrokenSemaphoreCaught requires the checker to reject the history of a
// semaphore that checks and increments in two round trips.
func TestBrokenSemaphoreCaught(t *testing.T) {
	sc := brokenScale
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			hists := runHelpers(t, config{Role: "broken-semaphore", Addrs: tg.addrs(t), Name: uniqueName(t), Capacity: semCapacity}, sc)
			wantIllegal(t, "semaphore", semaphoreModel(semCapacity), hists[histSemaphore], 2*sc.procs*sc.goroutines*sc.ops)
		})
	}
}
