package semaphore_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// TestGrantClearsLeftoverWeight: a grant that finds the hash's ':h' (the
// weight beyond one of the permits listed) with no permit listed (an
// operator deleted the sorted set) writes it back to 0, or the weight in
// use would count permits that are gone, and fewer would be granted.
func TestGrantClearsLeftoverWeight(t *testing.T) {
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{})
	name := uniqueName(t)
	s := e.sem(t, name, 4)
	heavy := acquire(t, s, 3)
	ctx := context.Background()
	if err := e.client.Do(ctx, e.client.B().Del().Key(e.key(name, ":e")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	p := acquire(t, s, 1)
	if n := available(t, s); n != 3 {
		t.Errorf("Available = %d after a grant of 1 on a hash whose permits were deleted, want 3", n)
	}
	release(t, p)
	if err := heavy.Release(ctx); !errors.Is(err, semaphore.ErrNotHeld) {
		t.Errorf("Release of the deleted permit = %v, want ErrNotHeld", err)
	}
}

// TestSetCapacityEqualToRetentionText: the acquire script takes the
// caller's capacity when its text is the stored one; a capacity set by
// SetCapacity applies whatever the caller brings, also when the caller's
// capacity reads like another field of the hash (here the retention, in
// ms).
func TestSetCapacityEqualToRetentionText(t *testing.T) {
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{})
	s := e.sem(t, uniqueName(t), semaphore.CapacityRetention.Milliseconds())
	ctx := context.Background()
	if err := s.SetCapacity(ctx, 2); err != nil {
		t.Fatal(err)
	}
	a, b := acquire(t, s, 1), acquire(t, s, 1)
	if p, err := s.TryAcquire(ctx, 1); !errors.Is(err, semaphore.ErrNotObtained) {
		if p != nil {
			release(t, p)
		}
		t.Errorf("TryAcquire past the set capacity 2 (made with %s) = %v, want ErrNotObtained",
			strconv.FormatInt(semaphore.CapacityRetention.Milliseconds(), 10), err)
	}
	release(t, a)
	release(t, b)
}
