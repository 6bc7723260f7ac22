package linearizability

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// The broken implementations: textbook races (check-then-act in two round
// trips, fencing tokens from a local counter) run under the same harness
// as the real primitives, whose histories the checker must reject. They
// check the checker, not a client, so they run once, on rueidis, and need
// no client under test: they run on the instruments' client.
func init() {
	roles["broken-mutex"] = brokenMutexRole
	roles["broken-token-mutex"] = brokenTokenMutexRole
	roles["broken-semaphore"] = brokenSemaphoreRole
	roles["broken-ratelimit"] = brokenRatelimitRole
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
func brokenMutexRole(t *testing.T, p proc, start func(func(*recorder)) []record) []record {
	c, cfg := p.c, p.cfg
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
func brokenTokenMutexRole(t *testing.T, p proc, start func(func(*recorder)) []record) []record {
	c, cfg := p.c, p.cfg
	var tokens atomic.Int64
	var n atomic.Int64
	return start(lockWorker(t, c, cfg, func() (locker, error) {
		owner := strconv.Itoa(cfg.Proc) + "/" + strconv.FormatInt(n.Add(1), 10)
		return localTokenLock{c: c, key: cfg.Name + ":lock", owner: owner, tokens: &tokens}, nil
	}))
}

// TestBrokenMutexCaught runs broken locks under the same harness and
// requires the checker to reject their histories: without it, a passing
// TestMutexLinearizable would prove nothing.
func TestBrokenMutexCaught(t *testing.T) {
	s, helper := begin(t, newRueidisCache)
	if helper {
		return
	}
	sc := brokenScale
	n := sc.procs * sc.goroutines * sc.ops
	for _, tg := range targets {
		t.Run(tg.name+"/get-then-set", func(t *testing.T) {
			hists := s.runHelpers(t, config{Role: "broken-mutex", Addrs: tg.addrs(t), Name: uniqueName(t)}, sc)
			wantIllegal(t, "lock", lockModel, hists[histLock], 2*n)
			wantIllegal(t, "counter", counterModel, hists[histCounter], n)
		})
		t.Run(tg.name+"/local-tokens", func(t *testing.T) {
			hists := s.runHelpers(t, config{Role: "broken-token-mutex", Addrs: tg.addrs(t), Name: uniqueName(t)}, sc)
			wantIllegal(t, "lock", lockModel, hists[histLock], 2*n)
			// Exclusion is right, so the sections are atomic: only the
			// tokens give this lock away.
			wantLinearizable(t, "counter", counterModel, hists[histCounter], n)
		})
	}
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

func brokenSemaphoreRole(t *testing.T, p proc, start func(func(*recorder)) []record) []record {
	c, cfg := p.c, p.cfg
	s := checkThenIncrSemaphore{c: c, key: cfg.Name + ":used", capacity: cfg.Capacity}
	return start(semaphoreWorker(t, c, cfg, s))
}

// TestBrokenSemaphoreCaught requires the checker to reject the history of a
// semaphore that checks and increments in two round trips.
func TestBrokenSemaphoreCaught(t *testing.T) {
	s, helper := begin(t, newRueidisCache)
	if helper {
		return
	}
	sc := brokenScale
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			hists := s.runHelpers(t, config{Role: "broken-semaphore", Addrs: tg.addrs(t), Name: uniqueName(t), Capacity: semCapacity}, sc)
			wantIllegal(t, "semaphore", semaphoreModel(semCapacity), hists[histSemaphore], 2*sc.procs*sc.goroutines*sc.ops)
		})
	}
}

// readThenIncrLimiter is a broken fixed-window limiter: it reads the count
// and, if the request fits, adds its cost in a second round trip. Clients
// that read the same count near the limit are all allowed.
type readThenIncrLimiter struct {
	c     rueidis.Client
	key   string
	limit int64
}

func (l readThenIncrLimiter) allow(ctx context.Context, n int64) (bool, error) {
	used, err := l.c.Do(ctx, l.c.B().Get().Key(l.key).Build()).AsInt64()
	if rueidis.IsRedisNil(err) {
		used, err = 0, nil
	}
	if err != nil {
		return false, err
	}
	time.Sleep(raceWindow)
	if used+n > l.limit {
		return false, nil
	}
	return true, l.c.Do(ctx, l.c.B().Incrby().Key(l.key).Increment(n).Build()).Error()
}

const histBrokenLimiter = "broken-limiter"

// brokenLimit is the broken limiter's limit: low, so that it is overrun
// early in the history. To prove a history illegal porcupine must rule out
// every order of the operations before the overrun, and that work grows
// with how many there are and how many run at once.
const brokenLimit = 30

func brokenRatelimitRole(t *testing.T, p proc, start func(func(*recorder)) []record) []record {
	c, cfg := p.c, p.cfg
	l := readThenIncrLimiter{c: c, key: cfg.Name + ":count", limit: int64(cfg.Limit)}
	return start(limiterWorker(t, cfg, []string{histBrokenLimiter}, []limiterFunc{l.allow}))
}

// TestBrokenRateLimitCaught requires the checker to reject the history of a
// limiter that reads and then increments in two round trips.
func TestBrokenRateLimitCaught(t *testing.T) {
	s, helper := begin(t, newRueidisCache)
	if helper {
		return
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			sc := brokenScale
			hists := s.runHelpers(t, config{Role: "broken-ratelimit", Addrs: tg.addrs(t), Name: uniqueName(t), Limit: brokenLimit}, sc)
			wantIllegal(t, "limiter", limiterModel(brokenLimit), hists[histBrokenLimiter], sc.procs*sc.goroutines*sc.ops)
		})
	}
}
