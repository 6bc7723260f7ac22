package semaphore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// TestReleaseOfUnlistedPermitNotHeld: a Release inside its lease is not
// judged by the server (semaphore_release's "n"), so when its permit is no
// longer listed while others are (an operator removed it), it is the ZREM
// that finds it gone: Release must say ErrNotHeld, and free nothing else.
func TestReleaseOfUnlistedPermitNotHeld(t *testing.T) {
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{})
	name := uniqueName(t)
	s := e.sem(t, name, 3)
	other := acquire(t, s, 1)
	p := acquire(t, s, 1)
	ctx := context.Background()
	if err := e.client.Do(ctx, e.client.B().Zrem().Key(e.key(name, ":e")).Member(p.ID()).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); !errors.Is(err, semaphore.ErrNotHeld) {
		t.Fatalf("Release of a permit removed from the set = %v, want ErrNotHeld", err)
	}
	if n := available(t, s); n != 2 {
		t.Errorf("Available = %d after it, want 2 (the other permit still held)", n)
	}
	release(t, other)
}

// TestHeavyReleaseDropsItsWeight: the release of a permit of more than one
// leaves no field of its id in the state hash while others are held (a
// field per released permit would grow the hash for as long as the
// semaphore is in use), and ':h' counts only the others.
func TestHeavyReleaseDropsItsWeight(t *testing.T) {
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{})
	name := uniqueName(t)
	s := e.sem(t, name, 5)
	other := acquire(t, s, 1)
	heavy := acquire(t, s, 3)
	release(t, heavy)
	ctx := context.Background()
	n, err := e.client.Do(ctx, e.client.B().Hexists().Key(e.key(name, "")).Field(heavy.ID()).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("the released permit's weight is still in the hash")
	}
	if got := available(t, s); got != 4 {
		t.Errorf("Available = %d, want 4", got)
	}
	release(t, other)
}
