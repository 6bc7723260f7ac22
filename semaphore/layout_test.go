package semaphore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// The rules of the layout that keep the common acquire and release lean
// (semaphore_acquire.lua): a release publishes only when an Acquire may
// wait, and the sorted set lists only permits the state hash counts.

// waitAttempts starts an Acquire of one permit of s and waits until it has
// made its two refused attempts, before and after its subscription was
// confirmed: it is waiting, and a release from now on must wake it.
func waitAttempts(t *testing.T, ctx context.Context, e *env, s *semaphore.Semaphore) <-chan acquired {
	t.Helper()
	before := scriptCalls(t, e.client)
	c := acquireAsync(ctx, s, 1)
	if !redistest.WaitFor(ctx, signalWait, func() bool { return scriptCalls(t, e.client)-before >= 2 }) {
		t.Fatal("the Acquire did not make its two attempts")
	}
	return c
}

// TestReleasePublishesOnlyForWaiters: a release publishes its wake-up only
// when an Acquire may be waiting. One refused by TryAcquire does not wait,
// so a release after it publishes nothing; one after a refused Acquire
// publishes, and wakes it.
func TestReleasePublishesOnlyForWaiters(t *testing.T) {
	srv := redistest.NewServer(t) // its own, so that its PUBLISH count is this test's
	e := newEnv(t, []string{srv.Addr()}, semaphore.Options{})
	s := e.sem(t, uniqueName(t), 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*signalWait)
	defer cancel()

	p := acquire(t, s, 1)
	if _, err := s.TryAcquire(ctx, 1); !errors.Is(err, semaphore.ErrNotObtained) {
		t.Fatalf("TryAcquire of a full semaphore = %v, want ErrNotObtained", err)
	}
	release(t, p)
	if n := commandCalls(t, srv)["publish"]; n != 0 {
		t.Fatalf("%d PUBLISH after releases nobody waited for, want 0", n)
	}

	p = acquire(t, s, 1)
	waiter := waitAttempts(t, ctx, e, s)
	release(t, p)
	release(t, got(t, waiter, "the waiter"))
	if n := commandCalls(t, srv)["publish"]; n < 1 {
		t.Fatalf("%d PUBLISH after the release of a permit an Acquire waited for, want at least 1", n)
	}
}

// TestWaitedGrantPassesWakeUpOn: two Acquires of one process wait for the
// only permit; the holder's release deletes the keys and wakes one of them
// (its budget is one permit). The second must be woken by the release of
// the first, whose grant, after a wait, marked the new keys: it must not
// sleep until the holder's lease (30 s) would have ended.
func TestWaitedGrantPassesWakeUpOn(t *testing.T) {
	srv := redistest.NewServer(t)
	holderEnv := newEnv(t, []string{srv.Addr()}, semaphore.Options{})
	waiterEnv := newEnv(t, []string{srv.Addr()}, semaphore.Options{})
	name := uniqueName(t)
	holder := acquire(t, holderEnv.sem(t, name, 1), 1)
	s := waiterEnv.sem(t, name, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*signalWait)
	defer cancel()
	first := waitAttempts(t, ctx, waiterEnv, s)
	second := waitAttempts(t, ctx, waiterEnv, s)

	release(t, holder)
	p := got(t, first, "the first waiter")
	if left := waiterEnv.keysLeft(t, name); left != 2 {
		t.Fatalf("%d keys while the first waiter holds, want 2", left)
	}
	release(t, p)
	release(t, got(t, second, "the second waiter, woken by the first's release"))
}

// TestHashDeletedAloneForgetsItsPermits: an operator deletes the state
// hash of a held semaphore and leaves its sorted set. What the set lists
// is counted nowhere, so the next grant drops it: the holder is told of
// its loss, and its release frees nothing of the permit granted since.
func TestHashDeletedAloneForgetsItsPermits(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		ctx := context.Background()
		e := newEnv(t, addrs, semaphore.Options{WatchdogLease: time.Second})
		name := uniqueName(t)
		s := e.sem(t, name, 1)
		p := acquire(t, s, 1)
		if err := e.client.Do(ctx, e.client.B().Del().Key(keyspace.Key(e.prefix, name, "")).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		q := acquire(t, s, 1) // nothing is counted: granted
		if err := waitLost(t, p); !errors.Is(err, semaphore.ErrLost) {
			t.Fatalf("Err of the permit whose hash was deleted = %v, want ErrLost", err)
		}
		if err := p.Release(ctx); !errors.Is(err, semaphore.ErrNotHeld) {
			t.Fatalf("Release of the permit whose hash was deleted = %v, want ErrNotHeld", err)
		}
		if r, err := s.TryAcquire(ctx, 1); !errors.Is(err, semaphore.ErrNotObtained) {
			if r != nil {
				r.Release(ctx)
			}
			t.Fatalf("TryAcquire while the later permit is held = %v, want ErrNotObtained: the stale release freed it", err)
		}
		release(t, q)
		if left := e.keysLeft(t, name); left != 0 {
			t.Fatalf("%d keys left after the last release, want 0", left)
		}
	})
}

// TestReleaseOfExpiredPermit: a permit of a fixed lease runs out and nobody
// reclaims it, so the server still lists it (a permit of a longer lease
// keeps the keys). Its holder was told; its Release asks the server
// whether the permit expired, and is told it was not held, as before the
// release could skip that question. It frees its own weight only.
func TestReleaseOfExpiredPermit(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		ctx := context.Background()
		short := newEnv(t, addrs, semaphore.Options{Lease: 100 * time.Millisecond})
		long := newEnv(t, addrs, semaphore.Options{Lease: time.Minute})
		name := uniqueName(t)
		p := acquire(t, short.sem(t, name, 3), 1)
		s := long.sem(t, name, 3)
		other := acquire(t, s, 1)
		waitLost(t, p)
		// The server's own expiry comes a margin after the client's.
		set := keyspace.Key(long.prefix, name, ":e")
		if !redistest.WaitFor(ctx, signalWait, func() bool {
			score, err := long.client.Do(ctx, long.client.B().Zscore().Key(set).Member(p.ID()).Build()).AsFloat64()
			if err != nil {
				t.Fatalf("the expired permit is not listed: %v", err)
			}
			return int64(score) < serverMs(t, long)
		}) {
			t.Fatal("the permit did not expire on the server")
		}
		if err := p.Release(ctx); !errors.Is(err, semaphore.ErrNotHeld) || !errors.Is(err, semaphore.ErrLost) {
			t.Fatalf("Release of a permit expired on the server = %v, want ErrNotHeld wrapping ErrLost", err)
		}
		wantAvailable(t, s, 2) // its own weight freed, the other permit kept
		release(t, other)
		if left := long.keysLeft(t, name); left != 0 {
			t.Fatalf("%d keys left after the last release, want 0", left)
		}
	})
}
