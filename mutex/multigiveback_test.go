package mutex_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// endClient records, for each script call on one lock's keys, how long
// its context had left when it was sent (-1: no end).
type endClient struct {
	scriptcache.Client
	tag string // "{name}"

	mu   sync.Mutex
	left []time.Duration
}

func (c *endClient) Eval(ctx context.Context, sha, body string, keys, args []string) scriptcache.Reply {
	if len(keys) > 0 && strings.Contains(keys[0], c.tag) {
		left := time.Duration(-1)
		if d, ok := ctx.Deadline(); ok {
			left = time.Until(d)
		}
		c.mu.Lock()
		c.left = append(c.left, left)
		c.mu.Unlock()
	}
	return c.Client.Eval(ctx, sha, body, keys, args)
}

// last returns what the latest recorded call had left, and how many calls
// were recorded.
func (c *endClient) last() (time.Duration, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.left) == 0 {
		return 0, 0
	}
	return c.left[len(c.left)-1], len(c.left)
}

// takeAndRelease checks that name is free (when): l's TryLock takes it,
// and its Unlock lets it go again.
func takeAndRelease(t *testing.T, l *mutex.Locker, name, when string) {
	t.Helper()
	ctx := context.Background()
	m := newMutex(t, l, name)
	if err := m.TryLock(ctx); err != nil {
		t.Fatalf("TryLock(%q) %s = %v, want it free", name, when, err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMultiGiveBackEnds: the Unlocks a MultiMutex sends on its own, to
// give back what a failed Lock or nested Lock took, outlive the caller's
// context but not the lease: a caller's context with no end must not give
// them none (a release met by TRYAGAIN, as a slot left half migrated
// answers, is sent again for as long as its context lasts), and the
// member is free (or back to its hold) after.
func TestMultiGiveBackEnds(t *testing.T) {
	ctx := context.Background()
	const lease = 30 * time.Second // no renewal during the test
	srv := redistest.Single(t)
	other := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{WatchdogLease: lease})
	// a is the member the set locks first, b the second.
	order := newMulti(t, other, []string{"multigb:a", "multigb:b"}).Names()
	a, b := order[0], order[1]
	sc0, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	c := &endClient{Client: sc0.Client(), tag: "{" + a + "}"}
	sc, err := scriptcache.NewFrom(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	l, err := mutex.NewLocker(sc, mutex.Options{WatchdogLease: lease})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	check := func(t *testing.T, what string, calls int) {
		t.Helper()
		left, n := c.last()
		if n <= calls {
			t.Fatalf("%s: no call on %q after the failed attempt", what, a)
		}
		if left < 0 || left > lease {
			t.Errorf("%s: the give-back's context had %v left (-1: no end), want at most the lease %v", what, left, lease)
		}
	}

	t.Run("unwind", func(t *testing.T) {
		ob := newMutex(t, other, b)
		if err := ob.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer ob.Unlock(ctx)
		mm := newMulti(t, l, []string{a, b})
		_, before := c.last()
		if err := mm.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
			t.Fatalf("TryLock with %q held elsewhere = %v, want ErrNotObtained", b, err)
		}
		check(t, "TryLock", before+1) // its own attempt at a, then the give-back
		takeAndRelease(t, other, a, "after the failed TryLock")
	})

	t.Run("settle", func(t *testing.T) {
		mm := newMulti(t, l, []string{a, b})
		if err := mm.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		// b is taken from the set behind its back (an operator's DEL,
		// then another owner): the set learns of it only from its nested
		// Lock, which nests in a and is refused at b.
		if _, err := srv.Do("DEL", "sluice:mutex:{"+b+"}"); err != nil {
			t.Fatal(err)
		}
		ob := newMutex(t, other, b)
		if err := ob.TryLock(ctx); err != nil {
			t.Fatal(err)
		}
		defer ob.Unlock(ctx)
		_, before := c.last()
		if err := mm.TryLock(ctx); err == nil {
			t.Fatal("nested TryLock with b held elsewhere succeeded")
		}
		check(t, "nested TryLock", before+1) // a's nested attempt, then a's Unlock
		// a is back to the set's one hold: still held, by one count,
		// which the set's Unlock gives back.
		oa := newMutex(t, other, a)
		if err := oa.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
			t.Fatalf("%q after the refused nested TryLock: TryLock by another = %v, want ErrNotObtained (the set's hold kept)", a, err)
		}
		_ = mm.Unlock(ctx) // the set is lost: its error says so
		takeAndRelease(t, other, a, "after the set's Unlock")
	})
}

// TestMultiNestFailedCallKeepsSet: a nested Lock whose call at one member
// fails on the connection (no loss: the set still holds) brings the other
// members back to the set's hold and leaves the set whole: not lost, one
// hold, every name still taken, and its Unlock frees them all. Settling
// must not drop a member it brought back.
func TestMultiNestFailedCallKeepsSet(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	l, c := newFailingLocker(t, srv.Addr(), mutex.Options{WatchdogLease: 30 * time.Second})
	other := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{})
	mm := newMulti(t, l, []string{"multinest:a", "multinest:b"})
	names := mm.Names()
	if err := mm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	c.arm("{"+names[1]+"}", false) // the nested attempt at the second member
	if err := mm.TryLock(ctx); err == nil {
		t.Fatal("nested TryLock with its call at the second member failing succeeded")
	}
	if err := mm.Err(); err != nil {
		t.Errorf("Err() after the failed nested call = %v, want nil (the set still holds)", err)
	}
	if h := mm.Holds(); h != 1 {
		t.Errorf("Holds() after the failed nested call = %d, want 1", h)
	}
	for _, name := range names {
		if err := newMutex(t, other, name).TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
			t.Fatalf("TryLock(%q) by another while the set holds = %v, want ErrNotObtained", name, err)
		}
	}
	if err := mm.Unlock(ctx); err != nil {
		t.Fatalf("Unlock = %v", err)
	}
	for _, name := range names {
		takeAndRelease(t, other, name, "after the set's Unlock")
	}
}
