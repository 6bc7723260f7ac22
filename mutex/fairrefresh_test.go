package mutex_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// queueIDs returns the attempt ids queued on a fair lock, in order.
func queueIDs(t *testing.T, client rueidis.Client, name string) []string {
	t.Helper()
	ids, err := client.Do(context.Background(), client.B().Zrange().Key(lockKey(name)+":q").Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestFairEntriesRefreshedInBatches: 400 fair Locks of one process wait on
// 20 held locks. Their queue entries are refreshed by the Locker in a few
// calls per round, not by a call of each waiter every recheck (which made
// 400 calls per 300 ms here), and none is dropped or queued anew: every
// queue keeps its attempts in their order. Then all acquire.
func TestFairEntriesRefreshedInBatches(t *testing.T) {
	const names, perName = 20, 20
	const watchdog, rounds = 900 * time.Millisecond, 5 // recheck: watchdog/3
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			client := clientFor(t, tg)
			opts := mutex.Options{Fair: true, WatchdogLease: watchdog}
			held := lockAll(t, newLocker(t, clientFor(t, tg), opts), heldNames("fairbatch:"+t.Name()+":", names, tg.name == "cluster"))
			l := newLocker(t, client, opts)
			ctx, cancel := context.WithTimeout(context.Background(), 4*signal)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, names*perName)
			for _, h := range held {
				for range perName {
					m := newMutex(t, l, h.Name())
					wg.Go(func() {
						err := m.Lock(ctx)
						if err == nil {
							err = m.Unlock(ctx)
						}
						errs <- err
					})
				}
			}
			queues := make([][]string, len(held))
			for i, h := range held {
				waitQueued(t, client, h.Name(), perName)
				queues[i] = queueIDs(t, client, h.Name())
			}
			before := scriptCalls(t, client)
			time.Sleep(rounds * watchdog / 3) // nothing to wait for: counting what happens meanwhile
			calls := scriptCalls(t, client) - before
			own := int64(names * perName * rounds) // one call per waiter per recheck, as before
			t.Logf("%d script calls in %d rechecks of %d waiters (holders' renewals included)", calls, rounds, names*perName)
			if calls*5 > own {
				t.Errorf("%d script calls, want at most %d (a fifth of one per waiter per recheck)", calls, own/5)
			}
			for i, h := range held {
				if got := queueIDs(t, client, h.Name()); !slices.Equal(got, queues[i]) {
					t.Fatalf("queue of %s changed while everyone waited:\n got %q\nwant %q", h.Name(), got, queues[i])
				}
			}
			unlockAll(held)
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestFairFreeWhileQueued: the lock's holder vanishes without a release
// (its hash deleted by hand, as an expiry would), so no release will hand
// the lock on. The queued waiter, which otherwise waits out the holder's
// 30 s lease, is woken by the next refresh (every second) and takes it.
func TestFairFreeWhileQueued(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	name := "freequeued"
	holder := newMutex(t, newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{Fair: true}), name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waiter := newMutex(t, newLocker(t, client, mutex.Options{Fair: true}), name)
	got := make(chan error, 1)
	go func() { got <- waiter.Lock(ctx) }()
	waitQueued(t, client, name, 1)
	if _, err := srv.Do("DEL", lockKey(name)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(signal):
		t.Fatal("the waiter did not take the free lock")
	}
	if d := time.Since(start); d > signal/2 {
		t.Fatalf("took the free lock after %v, want about one refresh (1 s), far below the holder's 30 s lease", d)
	}
	waiter.Unlock(ctx)
}

// TestFairEntryDropped: a waiter's entry is removed by hand, as a release
// does with an entry it finds dead. The next refresh wakes the waiter, which
// queues again, and it gets the lock on the next release.
func TestFairEntryDropped(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	name := "entrydropped"
	l := newLocker(t, client, mutex.Options{Fair: true})
	holder, waiter := newMutex(t, l, name), newMutex(t, l, name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- waiter.Lock(ctx) }()
	waitQueued(t, client, name, 1)
	id := queueIDs(t, client, name)[0]
	if _, err := srv.Do("ZREM", lockKey(name)+":q", id); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("HDEL", lockKey(name)+":e", id); err != nil {
		t.Fatal(err)
	}
	waitQueued(t, client, name, 1) // queued again, by its own attempt
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(signal):
		t.Fatal("the waiter did not get the lock")
	}
	waiter.Unlock(ctx)
}

// TestFairWaiterOneAttempt: a fair Lock that waits while its process has
// the lock's subscription up registers before its first attempt and needs
// no second one: its wait costs that attempt and the release that hands
// the lock over. Without the subscription up (the first waiter) it
// subscribes after its attempt and attempts again once subscribed.
func TestFairWaiterOneAttempt(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	client := redistest.Client(t, srv.Addr())
	l := newLocker(t, client, mutex.Options{Fair: true})
	name := "oneattempt"
	holder := newMutex(t, l, name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	for i, attempts := range []int64{2, 1, 1} {
		waiter := newMutex(t, l, name)
		before := scriptCalls(t, client)
		got := make(chan error, 1)
		go func() { got <- waiter.Lock(ctx) }()
		waitQueued(t, client, name, 1)
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		// Script calls only: waitQueued's ZCARD is not one.
		if calls := scriptCalls(t, client) - before; calls != attempts+1 {
			t.Errorf("waiter %d: %d script calls for its wait and the release, want %d attempts and the release", i, calls, attempts)
		}
		holder = waiter
	}
	holder.Unlock(ctx)
}
