package linearizability

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

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
func mutexRole(t *testing.T, c rueidis.Client, cfg config, start func(func(*recorder)) []record) []record {
	sc := scriptCache(t, c, cfg)
	locks, err := mutex.NewLocker(sc, mutex.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	return start(lockWorker(t, c, cfg, func() (locker, error) {
		m, err := locks.NewMutex(cfg.Name)
		return realMutex{m}, err
	}))
}

// raceWindow is how long the broken implementations wait between their read
// and their write. It widens their race so that every run shows it; it is
// part of what makes them broken, not synchronization of the test.
const raceWindow = time.Millisecond

// pollInterval is how often the broken implementations look again at a
// lock or semaphore they found taken (they have no wake-up channel).
const pollInterval = 200 * time.Microsecond

// getSetLock is a broken lock: it reads the key, and if it is free, writes
// its token there in a second round trip. Two clients can both read "free"
// before either writes, and both believe they hold the lock. Its tokens come
// from INCR, so they do increase: only exclusion is broken.
type getSetLock struct {
	c          rueidis.Client
	key, token string
}

func (l getSetLock) Lock(ctx context.Context) (int64, error) {
	for {
		token, ok, err := l.TryLock(ctx)
		if ok || err != nil {
			return token, err
		}
		time.Sleep(pollInterval)
	}
}

func (l getSetLock) TryLock(ctx context.Context) (int64, bool, error) {
	err := l.c.Do(ctx, l.c.B().Get().Key(l.key).Build()).Error()
	if !rueidis.IsRedisNil(err) {
		return 0, false, err // held, or a failure
	}
	time.Sleep(raceWindow)
	token, err := l.c.Do(ctx, l.c.B().Incr().Key(l.token).Build()).AsInt64()
	if err != nil {
		return 0, false, err
	}
	return token, true, l.c.Do(ctx, l.c.B().Set().Key(l.key).Value(strconv.FormatInt(token, 10)).Build()).Error()
}

func (l getSetLock) Unlock(ctx context.Context) error {
	return l.c.Do(ctx, l.c.B().Del().Key(l.key).Build()).Error()
}

// brokenMutexRole runs getSetLock.
func brokenMutexRole(t *testing.T, c rueidis.Client, cfg config, start func(func(*recorder)) []record) []record {
	return start(lockWorker(t, c, cfg, func() (locker, error) {
		return getSetLock{c: c, key: cfg.Name + ":lock", token: cfg.Name + ":token"}, nil
	}))
}

// localTokenLock is a lock whose exclusion is right (SET NX, one round
// trip) but whose fencing tokens come from a counter of the process, not
// from Redis: tokens of different processes interleave and go back, so a
// storage layer fencing on them would refuse the current holder, or accept a
// stale one.
type localTokenLock struct {
	c      rueidis.Client
	key    string
	owner  string
	tokens *atomic.Int64
}

func (l localTokenLock) Lock(ctx context.Context) (int64, error) {
	for {
		token, ok, err := l.TryLock(ctx)
		if ok || err != nil {
			return token, err
		}
		time.Sleep(pollInterval)
	}
}

func (l localTokenLock) TryLock(ctx context.Context) (int64, bool, error) {
	err := l.c.Do(ctx, l.c.B().Set().Key(l.key).Value(l.owner).Nx().Build()).Error()
	if rueidis.IsRedisNil(err) {
		return 0, false, nil // held
	}
	if err != nil {
		return 0, false, err
	}
	return l.tokens.Add(1), true, nil
}

func (l localTokenLock) Unlock(ctx context.Context) error {
	return l.c.Do(ctx, l.c.B().Del().Key(l.key).Build()).Error()
}

// brokenTokenMutexRole runs localTokenLock, one token counter per process.
func brokenTokenMutexRole(t *testing.T, c rueidis.Client, cfg config, start func(func(*recorder)) []record) []record {
	var tokens atomic.Int64
	var n atomic.Int64
	return start(lockWorker(t, c, cfg, func() (locker, error) {
		owner := strconv.Itoa(cfg.Proc) + "/" + strconv.FormatInt(n.Add(1), 10)
		return localTokenLock{c: c, key: cfg.Name + ":lock", owner: owner, tokens: &tokens}, nil
	}))
}

// TestMutexLinearizable records Lock, the critical section and Unlock of
// mutex.Mutex from several processes and checks that the lock history is
// that of one lock with increasing fencing tokens, and the sections that of
// atomic increments.
func TestMutexLinearizable(t *testing.T) {
	sc := histScale()
	n := sc.procs * sc.goroutines * sc.ops
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			hists := runHelpers(t, config{Role: "mutex", Addrs: tg.addrs(t), Name: uniqueName(t)}, sc)
			wantLinearizable(t, "lock", lockModel, hists[histLock], 2*n)
			wantLinearizable(t, "counter", counterModel, hists[histCounter], n)
		})
	}
}

// TestBrokenMutexCaught runs broken locks under the same harness and
// requires the checker to reject their histories: without it, a passing
// TestMutexLinearizable would prove nothing.
func TestBrokenMutexCaught(t *testing.T) {
	sc := brokenScale
	n := sc.procs * sc.goroutines * sc.ops
	for _, tg := range targets {
		t.Run(tg.name+"/get-then-set", func(t *testing.T) {
			hists := runHelpers(t, config{Role: "broken-mutex", Addrs: tg.addrs(t), Name: uniqueName(t)}, sc)
			wantIllegal(t, "lock", lockModel, hists[histLock], 2*n)
			wantIllegal(t, "counter", counterModel, hists[histCounter], n)
		})
		t.Run(tg.name+"/local-tokens", func(t *testing.T) {
			hists := runHelpers(t, config{Role: "broken-token-mutex", Addrs: tg.addrs(t), Name: uniqueName(t)}, sc)
			wantIllegal(t, "lock", lockModel, hists[histLock], 2*n)
			// Exclusion is right, so the sections are atomic: only the
			// tokens give this lock away.
			wantLinearizable(t, "counter", counterModel, hists[histCounter], n)
		})
	}
}
