package mutex_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// A final Unlock publishes its wake-up only when a Lock was refused while
// the lock's record lived (mutex_lock's w). These tests hold the lock with a
// lease far longer than their deadline: a waiter that missed its wake-up
// would sleep until the lease ends, and fail.

// TestUnlockWakesOnlyWhenRefused: an uncontended pair publishes nothing; a
// release after a refused Lock publishes.
func TestUnlockWakesOnlyWhenRefused(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{Lease: time.Minute})
	a, b := newMutex(t, l, "wakeflag:"+t.Name()), newMutex(t, l, "wakeflag:"+t.Name())
	before := commandCalls(t, srv)
	for range 3 {
		if err := a.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := commandCalls(t, srv)["publish"] - before["publish"]; got != 0 {
		t.Fatalf("uncontended pairs published %d wake-ups, want 0", got)
	}
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.TryLock(ctx); err == nil {
		t.Fatal("TryLock of a held lock succeeded")
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := commandCalls(t, srv)["publish"] - before["publish"]; got != 1 {
		t.Fatalf("release after a refused Lock published %d wake-ups, want 1", got)
	}
}

// TestWakeWhileSubscribing: the holder releases as soon as the waiter's
// first attempt was refused, before or after the waiter's subscription is
// confirmed (a new name each round, so no subscription is up yet); the
// waiter's attempt after subscribing finds the lock free, or the release's
// wake-up reaches it.
func TestWakeWhileSubscribing(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			// Two clients, as two processes have: the Lockers share no
			// subscription.
			client := redistest.Client(t, tg.addrs(t)...)
			holder := newLocker(t, client, mutex.Options{Lease: time.Minute})
			waiter := newLocker(t, redistest.Client(t, tg.addrs(t)...), mutex.Options{Lease: time.Minute})
			for i := range 10 {
				name := "wakesub:" + t.Name() + ":" + strconv.Itoa(i)
				a, b := newMutex(t, holder, name), newMutex(t, waiter, name)
				ctx, cancel := context.WithTimeout(context.Background(), signal)
				if err := a.Lock(ctx); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- b.Lock(ctx) }()
				// The refused attempt marks the record; then release at once.
				if !redistest.WaitFor(ctx, signal, func() bool {
					return recordField(t, client, lockKey(name), "w") == "1"
				}) {
					t.Fatal("the waiter's refused Lock did not mark the record")
				}
				if err := a.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				if err := <-done; err != nil {
					t.Fatalf("round %d: waiter's Lock = %v, want the lock well before the holder's lease", i, err)
				}
				if err := b.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				cancel()
			}
		})
	}
}

// TestWakeEveryWaiter: several waiters in one process and in another; each
// one woken takes the lock and releases it. A release clears nothing, so
// the waiters a wake-up did not reach are woken by the later releases.
func TestWakeEveryWaiter(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			// Two clients, as two processes have: the Lockers share no
			// subscription.
			client := redistest.Client(t, tg.addrs(t)...)
			ls := []*mutex.Locker{
				newLocker(t, client, mutex.Options{Lease: time.Minute}),
				newLocker(t, redistest.Client(t, tg.addrs(t)...), mutex.Options{Lease: time.Minute}),
			}
			name := "wakeall:" + t.Name()
			ctx, cancel := context.WithTimeout(context.Background(), 2*signal)
			defer cancel()
			holder := newMutex(t, ls[0], name)
			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			const perProcess = 3
			var wg sync.WaitGroup
			errs := make(chan error, 2*perProcess)
			for _, l := range ls {
				for range perProcess {
					m := newMutex(t, l, name)
					wg.Go(func() {
						if err := m.Lock(ctx); err != nil {
							errs <- err
							return
						}
						errs <- m.Unlock(ctx)
					})
				}
			}
			// Every waiter has been refused once the record is marked; some may
			// still be on their way, which a later release wakes as well.
			if !redistest.WaitFor(ctx, signal, func() bool {
				return recordField(t, client, lockKey(name), "w") == "1"
			}) {
				t.Fatal("no refused Lock marked the record")
			}
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("a waiter = %v, want every waiter served well before the lease", err)
				}
			}
		})
	}
}
