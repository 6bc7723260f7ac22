// Package failover holds failover scenarios that every Redis client sluice
// runs on must pass; its tests measure what a failover does to granted locks
// and permits.
//
// RunSentinel is the Redis Sentinel scenario: a primary, a replica and three
// sentinels, a client that finds the primary through the sentinels, and a
// failover after kill -9 of the primary. Each client's tests call it with a
// function that builds a scriptcache.Cache on that client.
package failover

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// NewCache builds a Cache on a client that finds the primary named
// masterName through the sentinels at sentinelAddrs, and follows it across
// a failover. The client must be closed when t ends (t.Cleanup).
type NewCache func(t testing.TB, sentinelAddrs []string, masterName string) *scriptcache.Cache

// RecoveryBound is how long after the primary is killed the primitives must
// work again on the promoted replica. Sentinel needs about 2 s here (1 s
// down-after, election, promotion); the rest is room for a loaded machine
// running -race.
const RecoveryBound = 30 * time.Second

const (
	lagLocks    = 10 // lock grants made while the replica lags
	semCapacity = 10
	semBefore   = 5 // permits granted and replicated before the lag
	semLag      = 5 // permits granted while the replica lags
)

// RunSentinel runs the Sentinel failover scenario through the client
// newCache builds, once without and once with ReplicaAcks:
//
//  1. Mutex, semaphore and rate limiter work through the client.
//  2. Grants are made and replicated; one more lock is taken with the
//     ReplicaAcks setting under test.
//  3. The replica is paused and cut off, and 10 locks and 5 permits are
//     granted while it lags (as in TestFailoverWithLaggingReplica).
//  4. The primary is killed (kill -9), the replica resumed, and the
//     sentinels promote it. Probes time how long after the kill each
//     primitive works again through the client.
//  5. Fresh owners count the lag grants the promoted replica lets them take
//     again (doubled grants) and the permits over capacity.
//
// It asserts what the README promises: the primitives work again within
// RecoveryBound; a fencing token issued after the failover is above every
// token issued before it (the promoted replica had every write and runs on
// the same clock); with ReplicaAcks no lag grant is made, so none is doubled,
// and a grant the replica acknowledged is still held after the failover;
// without it the lag grants are all lost (10 doubled locks, 5 permits over
// capacity), the figures in the README. The figures are logged.
func RunSentinel(t *testing.T, newCache NewCache) {
	for _, acks := range []int{0, 1} {
		t.Run(fmt.Sprintf("replicaAcks=%d", acks), func(t *testing.T) {
			runSentinel(t, newCache, acks)
		})
	}
}

func runSentinel(t *testing.T, newCache NewCache, acks int) {
	ctx := context.Background()
	s := redistest.NewSentinel(t)
	sc := newCache(t, s.SentinelAddrs(), s.Name)
	repl := mutex.Options{ReplicaAcks: acks, ReplicaTimeout: 200 * time.Millisecond}
	plain := newLocker(t, sc, mutex.Options{})
	acked := newLocker(t, sc, repl)
	semPlain := newSemManager(t, sc, semaphore.Options{})
	semAcked := newSemManager(t, sc, semaphore.Options{ReplicaAcks: acks, ReplicaTimeout: 200 * time.Millisecond})
	limiter, err := ratelimit.New(sc, ratelimit.Options{Limit: ratelimit.PerMinute(1_000_000)})
	if err != nil {
		t.Fatal(err)
	}

	// 1. Everything works before the failover.
	var fenceBefore int64
	if err := probe(ctx, plain, semPlain, limiter, "before", func(token int64) { fenceBefore = token }); err != nil {
		t.Fatalf("before the failover: %v", err)
	}

	// 2. Replicated grants.
	workers, err := semAcked.NewSemaphore("workers", semCapacity)
	if err != nil {
		t.Fatal(err)
	}
	permitsHeld := 0
	for range semBefore {
		if _, err := workers.Acquire(ctx, 1); err != nil {
			t.Fatal(err)
		}
		permitsHeld++
	}
	if err := s.WaitSynced(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	survivor, _ := acked.NewMutex("survivor")
	if err := survivor.Lock(ctx); err != nil {
		t.Fatalf("lock with ReplicaAcks=%d and the replica up: %v", acks, err)
	}
	survivorToken := survivor.Token()

	// 3. The replica lags: paused, and its link cut on the primary, so
	// nothing granted from now on reaches it, not even through socket
	// buffers.
	if err := s.Replica.Pause(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Primary.Do("CLIENT", "KILL", "TYPE", "replica"); err != nil {
		t.Fatal(err)
	}
	if !redistest.WaitFor(ctx, 10*time.Second, func() bool {
		info, _ := s.Primary.Do("INFO", "replication")
		return strings.Contains(info, "connected_slaves:0")
	}) {
		t.Fatal("the primary still counts the replica after CLIENT KILL")
	}
	var lagHeld []string
	lockRefused := 0
	for i := range lagLocks {
		name := "lag:" + strconv.Itoa(i)
		m, _ := acked.NewMutex(name)
		switch err := m.Lock(ctx); {
		case err == nil:
			lagHeld = append(lagHeld, name)
		case errors.Is(err, mutex.ErrNotReplicated):
			lockRefused++
		default:
			t.Fatal(err)
		}
	}
	permitsRefused := 0
	for range semLag {
		switch _, err := workers.Acquire(ctx, 1); {
		case err == nil:
			permitsHeld++
		case errors.Is(err, semaphore.ErrNotReplicated):
			permitsRefused++
		default:
			t.Fatal(err)
		}
	}

	// 4. Failover. The primary dies before the replica runs again:
	// otherwise the replica could resync the lag grants from the primary's
	// backlog in between.
	s.Primary.Kill()
	killed := time.Now()
	if err := s.Replica.Resume(); err != nil {
		t.Fatal(err)
	}
	var (
		switched    time.Duration
		switchedErr error
		wg          sync.WaitGroup
	)
	wg.Go(func() { switched, switchedErr = s.WaitPrimary(s.Replica, RecoveryBound) })
	rec, err := waitRecovered(ctx, plain, semPlain, limiter, killed)
	wg.Wait()
	if switchedErr != nil {
		t.Error(switchedErr)
	}
	if err != nil {
		t.Fatalf("primitives do not work %v after the primary was killed: %v", RecoveryBound, err)
	}

	// 5. What the promoted replica lost.
	doubled := 0
	for _, name := range lagHeld {
		m, _ := plain.NewMutex(name)
		switch err := m.TryLock(ctx); {
		case err == nil:
			doubled++
		case !errors.Is(err, mutex.ErrNotObtained):
			t.Fatalf("TryLock %s after the failover: %v", name, err)
		}
	}
	after, err := semPlain.NewSemaphore("workers", semCapacity)
	if err != nil {
		t.Fatal(err)
	}
	free, err := after.Available(ctx)
	if err != nil {
		t.Fatal(err)
	}
	over := max(0, int64(permitsHeld)+free-semCapacity)

	// The grant made before the lag: another owner must not get it, and
	// its holder can still release it on the new primary; the next owner's
	// token is above the holder's.
	other, _ := plain.NewMutex("survivor")
	survived := false
	switch err := other.TryLock(ctx); {
	case errors.Is(err, mutex.ErrNotObtained):
		survived = true
		if err := survivor.Unlock(ctx); err != nil {
			t.Errorf("Unlock of the lock held across the failover: %v", err)
		} else if err := other.TryLock(ctx); err != nil {
			t.Errorf("TryLock after the holder's Unlock: %v", err)
		} else if other.Token() <= survivorToken {
			t.Errorf("fencing token went backwards: %d held across the failover, %d for the next owner", survivorToken, other.Token())
		}
	case err == nil:
	default:
		t.Fatal(err)
	}
	if acks > 0 && !survived {
		t.Errorf("ReplicaAcks=%d: a lock the replica acknowledged was free after the failover", acks)
	}

	// Fencing tokens: the promoted replica had every write up to the lag
	// and shares the old primary's clock, so a new token is above the old.
	var fenceAfter int64
	if err := probe(ctx, plain, semPlain, limiter, "after", func(token int64) { fenceAfter = token }); err != nil {
		t.Fatalf("after the failover: %v", err)
	}
	if fenceAfter <= fenceBefore {
		t.Errorf("fencing token went backwards: %d before the failover, %d after", fenceBefore, fenceAfter)
	}

	// With no replica left, a ReplicaAcks lock cannot be confirmed.
	if acks > 0 {
		m, _ := acked.NewMutex("no-replica")
		if err := m.Lock(ctx); !errors.Is(err, mutex.ErrNotReplicated) {
			t.Errorf("ReplicaAcks=%d Lock with no replica left: %v, want ErrNotReplicated", acks, err)
		}
	}

	t.Logf("Sentinel failover, ReplicaAcks=%d: sentinels reported the replica as primary %v after kill -9 of the primary; "+
		"through the client, mutex worked again after %v, semaphore after %v, rate limiter after %v",
		acks, switched.Round(time.Millisecond), rec.lock.Round(time.Millisecond),
		rec.sem.Round(time.Millisecond), rec.limit.Round(time.Millisecond))
	t.Logf("Sentinel failover, ReplicaAcks=%d: locks granted while the replica lagged: %d of %d, %d refused as unreplicated, %d doubled after the failover; "+
		"permits: %d held by clients, %d refused, %d free on the promoted replica, %d over capacity %d; "+
		"lock taken before the lag survived: %v; fencing token %d before, %d after",
		acks, len(lagHeld), lagLocks, lockRefused, doubled,
		permitsHeld, permitsRefused, free, over, semCapacity, survived, fenceBefore, fenceAfter)

	if acks == 0 && (doubled != lagLocks || over != semLag) {
		t.Errorf("without ReplicaAcks: %d doubled locks and %d permits over capacity, want %d and %d (every grant made while the replica lagged)",
			doubled, over, lagLocks, semLag)
	}
	if acks > 0 && (doubled != 0 || lockRefused != lagLocks || over != 0 || permitsRefused != semLag) {
		t.Errorf("with ReplicaAcks: %d doubled locks (%d refused), %d permits over capacity (%d refused); want 0 (%d) and 0 (%d)",
			doubled, lockRefused, over, permitsRefused, lagLocks, semLag)
	}
}

// recovery is how long after the kill each primitive first worked.
type recovery struct{ lock, sem, limit time.Duration }

// waitRecovered probes each primitive until it works, every 20 ms, each attempt
// bounded by 2 s, and returns when it first worked for each, counted from
// since. It gives up after RecoveryBound.
func waitRecovered(ctx context.Context, l *mutex.Locker, mgr *semaphore.Manager, lim *ratelimit.Limiter, since time.Time) (recovery, error) {
	var rec recovery
	deadline := since.Add(RecoveryBound)
	var lockErr, semErr, limitErr error
	for i := 0; ; i++ {
		suffix := ":recover:" + strconv.Itoa(i)
		if rec.lock == 0 {
			if _, lockErr = lockUnlock(ctx, l, suffix); lockErr == nil {
				rec.lock = time.Since(since)
			}
		}
		if rec.sem == 0 {
			if semErr = acquireRelease(ctx, mgr, suffix); semErr == nil {
				rec.sem = time.Since(since)
			}
		}
		if rec.limit == 0 {
			if limitErr = allow(ctx, lim, suffix); limitErr == nil {
				rec.limit = time.Since(since)
			}
		}
		if rec.lock != 0 && rec.sem != 0 && rec.limit != 0 {
			return rec, nil
		}
		if time.Now().After(deadline) {
			return rec, fmt.Errorf("mutex: %v; semaphore: %v; rate limiter: %v", lockErr, semErr, limitErr) //nolint:errorlint // err may be nil here: %v prints <nil>, %w would print %!w(<nil>)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// probe locks and unlocks the lock "fence" (passing its token to fence),
// acquires and releases a permit and passes a rate limit check, each under
// a name with suffix where fresh state is needed.
func probe(ctx context.Context, l *mutex.Locker, mgr *semaphore.Manager, lim *ratelimit.Limiter, suffix string, fence func(int64)) error {
	token, err := lockUnlock(ctx, l, "")
	if err != nil {
		return err
	}
	fence(token)
	if err := acquireRelease(ctx, mgr, suffix); err != nil {
		return err
	}
	return allow(ctx, lim, suffix)
}

// lockUnlock locks "fence" + suffix, unlocks it, and returns the fencing
// token of that hold.
func lockUnlock(ctx context.Context, l *mutex.Locker, suffix string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := l.NewMutex("fence" + suffix)
	if err != nil {
		return 0, err
	}
	if err := m.Lock(ctx); err != nil {
		return 0, fmt.Errorf("mutex Lock: %w", err)
	}
	token := m.Token()
	if err := m.Unlock(ctx); err != nil {
		return 0, fmt.Errorf("mutex Unlock: %w", err)
	}
	return token, nil
}

func acquireRelease(ctx context.Context, mgr *semaphore.Manager, suffix string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	sem, err := mgr.NewSemaphore("probe:"+suffix, 2)
	if err != nil {
		return err
	}
	p, err := sem.Acquire(ctx, 1)
	if err != nil {
		return fmt.Errorf("semaphore Acquire: %w", err)
	}
	if err := p.Release(ctx); err != nil {
		return fmt.Errorf("semaphore Release: %w", err)
	}
	return nil
}

func allow(ctx context.Context, lim *ratelimit.Limiter, suffix string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, err := lim.Allow(ctx, "probe:"+suffix)
	if err != nil {
		return fmt.Errorf("rate limiter Allow: %w", err)
	}
	if !r.Allowed {
		return fmt.Errorf("rate limiter Allow: denied the first request of a fresh key (%+v)", r)
	}
	return nil
}

func newLocker(t testing.TB, sc *scriptcache.Cache, opts mutex.Options) *mutex.Locker {
	t.Helper()
	l, err := mutex.NewLocker(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

func newSemManager(t testing.TB, sc *scriptcache.Cache, opts semaphore.Options) *semaphore.Manager {
	t.Helper()
	m, err := semaphore.NewManager(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}
