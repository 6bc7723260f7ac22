package mutex

// White-box regression tests from a review (stop 20): they drive the
// internal steps of Mutex.lock in an order the scheduler can produce, where
// the public API cannot force it deterministically.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

func reviewLocker(t *testing.T, opts Options) (*Locker, *redistest.Server) {
	t.Helper()
	srv := redistest.Single(t)
	sc, err := scriptcache.New(context.Background(), redistest.Client(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLocker(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l, srv
}

func reviewMutex(t *testing.T, l *Locker, name string, opts ...LockOption) *Mutex {
	t.Helper()
	m, err := l.NewMutex(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestFairGrantGivenBackNotReused: two goroutines share one fair Mutex
// value (allowed: its methods are safe for concurrent use). Goroutine 1
// waits in the queue; a release hands it the lock. Before it acts on the
// grant message, goroutine 2 takes the lock on the same value, so goroutine
// 1's takeGrant finds the value holding, gives the grant back (which
// leaves a tombstone for its attempt id) and goes on. Goroutine 2 unlocks
// before goroutine 1's next attempt. Found by a review: goroutine 1 then
// kept its tombstoned id (refused for a lease although the lock was free)
// and found the given-back grant again at its next wake-up, started a hold
// with a token Redis no longer had, and held the lock together with
// another owner, with a token below one already issued. Now the grant is
// taken once (TakeGrant) and the Lock goes on under a new id.
//
// Each step below is the call Mutex.lock (or Lock/Unlock of the other
// goroutine) makes, in an interleaving the scheduler can produce and the
// public API cannot force.
func TestFairGrantGivenBackNotReused(t *testing.T) {
	ctx := context.Background()
	l, srv := reviewLocker(t, Options{WatchdogLease: 3 * time.Second})
	name := "fair-grant:" + t.Name()
	m := reviewMutex(t, l, name, WithFair(true)) // shared by goroutines 1 and 2
	holder := reviewMutex(t, l, name)
	third := reviewMutex(t, l, name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}

	// Goroutine 1: m.Lock, as Mutex.lock runs it. First attempt queues.
	id := m.newAttemptID()
	w, err := l.hub.SubscribeID(m.key(keyWake), 1, id)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Ready(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	res, err := m.attempt(ctx, &id, false, false)
	if err != nil || res.ok || !res.queued {
		t.Fatalf("first attempt = %+v, %v; want queued", res, err)
	}
	// The holder's release hands the lock to goroutine 1's attempt.
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var grant string
	for {
		if err := w.Wait(wctx, time.Second); err != nil {
			t.Fatalf("no grant message: %v", err)
		}
		var got bool
		if grant, got = w.TakeGrant(); got {
			break
		}
	}

	// Goroutine 2 locks the same value before goroutine 1 takes the grant.
	if err := m.Lock(ctx); err != nil {
		t.Fatalf("goroutine 2 Lock: %v", err)
	}
	issued := m.Token() // the token goroutine 2's hold was given
	// Goroutine 1: takeGrant finds m holding and gives the grant back.
	oldID := id
	if ok, gaveBack, err := m.takeGrant(ctx, id, grant, res.sent); ok || !gaveBack || err != nil {
		t.Fatalf("takeGrant with holds > 0 = %v, %v, %v; want false, true, nil", ok, gaveBack, err)
	}
	id = m.newAttemptID() // what lock does after a give-back
	w.SetID(id)
	// Goroutine 2 unlocks before goroutine 1's next attempt.
	if err := m.Unlock(ctx); err != nil {
		t.Fatalf("goroutine 2 Unlock: %v", err)
	}
	// The give-back (sent in the background) reaches Redis.
	if !redistest.WaitFor(ctx, 10*time.Second, func() bool {
		out, _ := srv.Do("HEXISTS", m.key(keyTomb), oldID)
		return out == "1"
	}) {
		t.Fatal("the give-back's tombstone never appeared")
	}
	// Goroutine 1's next wake-up finds no grant: the one it gave back is
	// not offered again.
	if stale, got := w.TakeGrant(); got {
		t.Fatalf("TakeGrant offered the given-back grant %q again", stale)
	}
	// Its next attempt, under the new id, takes the free lock.
	res, err = m.attempt(ctx, &id, false, true)
	if err != nil {
		t.Fatal(err)
	}
	if !res.ok {
		info, _ := m.Info(ctx)
		t.Fatalf("the lock is free (Info %+v) but goroutine 1's attempt is refused (%+v)", info, res)
	}
	defer m.Unlock(ctx)
	if err := third.TryLock(ctx); err == nil {
		defer third.Unlock(ctx)
		t.Errorf("mutual exclusion broken: m holds (token %d) and another owner's TryLock succeeded", m.Token())
	} else if !errors.Is(err, ErrNotObtained) {
		t.Fatal(err)
	}
	if m.Token() <= issued {
		t.Errorf("fencing token went backwards: m holds with token %d after token %d was issued", m.Token(), issued)
	}
}

// TestContextsDoNotPileUpDuringHold: every Context (and every Do
// nested in a hold, which calls Context) registers a cancel function in the
// hold that is only dropped when the hold ends; calling the returned cancel
// does not remove it. A long-lived hold (a leader lock) that scopes work
// with Context or nested Do keeps every context ever made.
func TestContextsDoNotPileUpDuringHold(t *testing.T) {
	ctx := context.Background()
	l, _ := reviewLocker(t, Options{})
	m := reviewMutex(t, l, "scoped:"+t.Name())
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Unlock(ctx)
	for range 1000 {
		_, cancel := m.Context(ctx)
		cancel()
	}
	for range 50 {
		if err := m.Do(ctx, func(context.Context) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	m.mu.Lock()
	n := 0
	if m.scoped != nil {
		n = len(*m.scoped)
	}
	m.mu.Unlock()
	if n > 16 {
		t.Errorf("after 1000 Context calls and 50 nested Do, each cancelled, the hold keeps %d cancel functions (and their contexts)", n)
	}

	rw, err := l.NewRWMutex("scoped-rw:" + t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if err := rw.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	defer rw.RUnlock(ctx)
	for range 1000 {
		_, cancel := rw.Context(ctx)
		cancel()
	}
	rw.mu.Lock()
	n = len(rw.scoped)
	rw.mu.Unlock()
	if n > 16 {
		t.Errorf("RWMutex: after 1000 cancelled Context calls the hold keeps %d cancel functions", n)
	}
}
