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

// TestSetCapacityShrink: shrinking below the weight held revokes nothing,
// and grants nothing until the weight held is below the new capacity.
func TestSetCapacityShrink(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		ctx := context.Background()
		e := newEnv(t, addrs, semaphore.Options{})
		name := uniqueName(t)
		s := e.sem(t, name, 4)
		held := []*semaphore.Permit{acquire(t, s, 1), acquire(t, s, 1), acquire(t, s, 1)}
		if err := s.SetCapacity(ctx, 2); err != nil {
			t.Fatal(err)
		}
		wantAvailable(t, s, 0) // 3 held, capacity 2
		if _, err := s.TryAcquire(ctx, 1); !errors.Is(err, semaphore.ErrNotObtained) {
			t.Fatalf("TryAcquire with 3 held of capacity 2 = %v, want ErrNotObtained", err)
		}
		release(t, held[0])
		if _, err := s.TryAcquire(ctx, 1); !errors.Is(err, semaphore.ErrNotObtained) {
			t.Fatalf("TryAcquire with 2 held of capacity 2 = %v, want ErrNotObtained", err)
		}
		release(t, held[1])
		p, err := s.TryAcquire(ctx, 1)
		if err != nil {
			t.Fatalf("TryAcquire with 1 held of capacity 2: %v", err)
		}
		if _, err := s.TryAcquire(ctx, 3); !errors.Is(err, semaphore.ErrInvalidWeight) {
			t.Fatalf("TryAcquire(3) under capacity 2 = %v, want ErrInvalidWeight", err)
		}
		for _, q := range []*semaphore.Permit{held[2], p} {
			select {
			case <-q.Lost():
				t.Fatalf("a permit held across the shrink was lost: %v", q.Err())
			default:
			}
			release(t, q)
		}
		wantAvailable(t, s, 2)
	})
}

// TestSetCapacityGrowWakes: growing grants the new permits to a waiting
// Acquire at once, not when the holder's 30 s lease would end.
func TestSetCapacityGrowWakes(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(map[bool]string{false: "unfair", true: "fair"}[fair], func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{Fair: fair})
			name := uniqueName(t)
			s := e.sem(t, name, 2)
			holder := acquire(t, s, 2)
			waiting := acquireAsync(ctx, s, 1)
			e.waitSubscribed(t, name)
			if fair {
				e.waitQueued(t, name, 1)
			}
			if err := s.SetCapacity(ctx, 3); err != nil {
				t.Fatal(err)
			}
			p := got(t, waiting, "Acquire(1) after growing from 2 to 3")
			wantAvailable(t, s, 0)
			release(t, p)
			release(t, holder)
			wantAvailable(t, s, 3)
		})
	}
}

// waitSubscribed waits until some process listens on name's channel: a
// waiter there has made its first attempt.
func (e *env) waitSubscribed(t testing.TB, name string) {
	t.Helper()
	ctx := context.Background()
	ch := keyspace.Key(e.prefix, name, ":w")
	if !redistest.WaitFor(ctx, signalWait, func() bool {
		subs, _ := e.client.Do(ctx, e.client.B().PubsubNumsub().Channel(ch).Build()).AsIntMap()
		return subs[ch] > 0
	}) {
		t.Fatal("nobody subscribed to the channel")
	}
}

// TestSetCapacityOverridesConfigured: a set capacity applies to Semaphores
// made with any capacity, without ErrCapacityMismatch, also while the
// semaphore is idle, and is kept for CapacityRetention.
func TestSetCapacityOverridesConfigured(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{})
	name := uniqueName(t)
	two, five := e.sem(t, name, 2), e.sem(t, name, 5)
	if err := two.SetCapacity(ctx, 0); !errors.Is(err, semaphore.ErrInvalidCapacity) {
		t.Fatalf("SetCapacity(0) = %v, want ErrInvalidCapacity", err)
	}
	if err := two.SetCapacity(ctx, 3); err != nil {
		t.Fatal(err)
	}
	wantAvailable(t, five, 3)
	if _, err := five.TryAcquire(ctx, 4); !errors.Is(err, semaphore.ErrInvalidWeight) {
		t.Fatalf("TryAcquire(4) under a set capacity of 3 = %v, want ErrInvalidWeight", err)
	}
	p := acquire(t, two, 3) // above its own capacity of 2, within the set one
	wantAvailable(t, five, 0)
	release(t, p)
	ttl, err := e.client.Do(ctx, e.client.B().Pttl().Key(keyspace.Key(e.prefix, name, "")).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Duration(ttl) * time.Millisecond; d <= semaphore.CapacityRetention-time.Minute || d > semaphore.CapacityRetention {
		t.Fatalf("idle semaphore with a set capacity expires in %v, want about %v", d, semaphore.CapacityRetention)
	}
	wantAvailable(t, two, 3)
	e.client.Do(ctx, e.client.B().Del().Key(keyspace.Key(e.prefix, name, "")).Build())
	// Once it is gone, the configured capacities apply again.
	wantAvailable(t, five, 5)
}

// TestSetCapacityExpiredPermitsReclaimed: with a set capacity the hash
// outlives the permits; permits that expire without a release (their
// holder died) must still be counted free, not stay in the weight in use after the
// keys that list them expired.
func TestSetCapacityExpiredPermitsReclaimed(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{Lease: 50 * time.Millisecond})
	s := e.sem(t, uniqueName(t), 2)
	if err := s.SetCapacity(ctx, 3); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, 2) // never released: expires after 50 ms
	if !redistest.WaitFor(ctx, signalWait, func() bool {
		n, err := s.Available(ctx)
		return err == nil && n == 3
	}) {
		t.Fatalf("Available = %d long after the only permit expired, want 3", available(t, s))
	}
}
