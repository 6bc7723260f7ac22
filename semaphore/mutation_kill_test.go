package semaphore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// Tests written against mutants that escaped every other test (issue 32;
// internal/harness/mutation lists them). Each says which mutant it kills.

// TestReleaseTakesPermitOutOfExpirySet: a released permit leaves the
// semaphore's expiry set at once, while other permits are held, and the
// last release leaves none of the semaphore's keys behind (no capacity was
// set, so nothing is kept). A mutant of semaphore_release that took the
// permit out of the wrong key left it in the expiry set until its lease
// ran out, and no test looked there after a release.
func TestReleaseTakesPermitOutOfExpirySet(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{})
	name := uniqueName(t)
	s := e.sem(t, name, 3)
	p1, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := s.Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := p1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	expiry := keyspace.Key(e.prefix, name, ":e")
	if err := e.client.Do(ctx, e.client.B().Zscore().Key(expiry).Member(p1.ID()).Build()).Error(); !rueidis.IsRedisNil(err) {
		t.Errorf("the released permit's entry in the expiry set: %v, want none", err)
	}
	if err := p2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"", ":e"} {
		key := keyspace.Key(e.prefix, name, suffix)
		n, err := e.client.Do(ctx, e.client.B().Exists().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("key %q is left after the last permit's release, want none", key)
		}
	}
}

// TestCapacityBoundIs2To53Less1: 2^53 - 1 is the largest capacity (the
// scripts count in Lua numbers, exact up to 2^53) and 2^53 is refused,
// by NewSemaphore and SetCapacity alike. A Go mutant that made
// MaxCapacity 2^53 + 1 passed every test: none tried the bound's
// neighbours.
func TestCapacityBoundIs2To53Less1(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{})
	if _, err := e.mgr.NewSemaphore(uniqueName(t), 1<<53); !errors.Is(err, semaphore.ErrInvalidCapacity) {
		t.Errorf("NewSemaphore with capacity 2^53 = %v, want ErrInvalidCapacity", err)
	}
	s, err := e.mgr.NewSemaphore(uniqueName(t), 1<<53-1)
	if err != nil {
		t.Fatalf("NewSemaphore with capacity 2^53 - 1 = %v, want it accepted", err)
	}
	if err := s.SetCapacity(ctx, 1<<53); !errors.Is(err, semaphore.ErrInvalidCapacity) {
		t.Errorf("SetCapacity(2^53) = %v, want ErrInvalidCapacity", err)
	}
}
