package semaphore_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// TestFairEntriesRefreshedInBatches: 400 fair Acquires of one process wait
// on 20 full semaphores (on the cluster in 16 slots) for five rechecks.
// Their queue entries are refreshed by the Manager in a few calls per
// round, not by an attempt of each waiter every recheck (which is 400
// calls per 300 ms), and none is dropped or queued anew: every queue keeps
// its waiters in their order. Then all acquire.
func TestFairEntriesRefreshedInBatches(t *testing.T) {
	const sems, perSem = 20, 20
	const watchdog, rounds = 900 * time.Millisecond, 5 // recheck: watchdog/3
	forTargets(t, func(t *testing.T, addrs []string) {
		opts := semaphore.Options{Fair: true, WatchdogLease: watchdog}
		holders, e := newEnv(t, addrs, opts), newEnv(t, addrs, opts)
		names := batchNames("fairbatch:"+uniqueName(t)+":", sems, len(addrs) > 1)
		held := make([]*semaphore.Permit, len(names))
		ss := make([]*semaphore.Semaphore, len(names))
		for i, name := range names {
			held[i] = acquire(t, holders.sem(t, name, 2), 2)
			ss[i] = e.sem(t, name, 2)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*signalWait)
		defer cancel()
		var wg sync.WaitGroup
		errs := make(chan error, sems*perSem)
		for _, s := range ss {
			for range perSem {
				wg.Go(func() {
					p, err := s.Acquire(ctx, 1)
					if err == nil {
						err = p.Release(ctx)
					}
					errs <- err
				})
			}
		}
		queues := make([][]string, len(names))
		for i, name := range names {
			e.waitQueued(t, name, perSem)
			queues[i] = e.queued(t, name)
		}
		before := scriptCalls(t, e.client)
		time.Sleep(rounds * watchdog / 3) // nothing to wait for: counting what happens meanwhile
		calls := scriptCalls(t, e.client) - before
		own := int64(sems * perSem * rounds) // one attempt per waiter per recheck, as before
		t.Logf("%d script calls in %d rechecks of %d waiters (holders' renewals included)", calls, rounds, sems*perSem)
		if calls*5 > own {
			t.Errorf("%d script calls, want at most %d (a fifth of one per waiter per recheck)", calls, own/5)
		}
		for i, name := range names {
			if got := e.queued(t, name); !slices.Equal(got, queues[i]) {
				t.Fatalf("queue of %s changed while everyone waited:\n got %q\nwant %q", name, got, queues[i])
			}
		}
		if lost := lostPermits(held); len(lost) > 0 {
			t.Fatalf("%d holders lost their permits: %v", len(lost), held[lost[0]].Err())
		}
		releaseEach(held)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestFairExpiredHolderGrantedAtRefresh: the holder of a fair semaphore's
// only permit dies (its Manager closes without a release, so its 1 s
// watchdog lease runs out) while three waiters are queued. No release will
// grant the permit to the head; the next refresh of a waiter's entry (every
// second on the default lease) finds the permit expired and wakes a
// waiter, whose attempt reclaims it for the head. Without that, the
// waiters' own timers are a backstop of ten leases (300 s).
func TestFairExpiredHolderGrantedAtRefresh(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		ctx := context.Background()
		e := newEnv(t, addrs, semaphore.Options{Fair: true})
		crashed := newEnv(t, addrs, semaphore.Options{Fair: true, WatchdogLease: time.Second})
		name := uniqueName(t)
		acquire(t, crashed.sem(t, name, 1), 1)
		s := e.sem(t, name, 1)
		var waiting []<-chan acquired
		for i := range 3 {
			waiting = append(waiting, acquireAsync(ctx, s, 1))
			e.waitQueued(t, name, i+1)
		}
		order := e.queued(t, name)
		crashed.mgr.Close() // no release, no renewal: the permit expires within 1 s
		start := time.Now()
		p := got(t, waiting[0], "head waiter after its holder died")
		if d := time.Since(start); d > signalWait/2 {
			t.Fatalf("head granted %v after its holder died, want about its 1 s lease and a refresh (1 s)", d)
		}
		if p.ID() != order[0] {
			t.Fatalf("permit went to %s, want the head %s", p.ID(), order[0])
		}
		if q := e.queued(t, name); !slices.Equal(q, order[1:]) {
			t.Fatalf("queue %q, want %q", q, order[1:])
		}
		for i, c := range waiting[1:] {
			release(t, p)
			if p = got(t, c, "next waiter"); p.ID() != order[i+1] {
				t.Fatalf("permit went to %s, want %s", p.ID(), order[i+1])
			}
		}
		release(t, p)
		wantAvailable(t, s, 1)
	})
}

// TestFairEntryDroppedFoundAtRefresh: a waiter's queue entry is removed by
// hand, as a grant pass does with an entry it finds dead. The next refresh
// wakes the waiter, which queues again, and it gets the permit on the next
// release. Without the wake-up it would not queue again before its
// backstop timer (ten leases).
func TestFairEntryDroppedFoundAtRefresh(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		ctx := context.Background()
		e := newEnv(t, addrs, semaphore.Options{Fair: true})
		name := uniqueName(t)
		s := e.sem(t, name, 1)
		holder := acquire(t, s, 1)
		waiting := acquireAsync(ctx, s, 1)
		e.waitQueued(t, name, 1)
		id := e.queued(t, name)[0]
		for _, cmd := range []rueidis.Completed{
			e.client.B().Zrem().Key(e.key(name, ":q")).Member(id).Build(),
			e.client.B().Hdel().Key(e.key(name, ":qe")).Field(id).Build(),
		} {
			if err := e.client.Do(ctx, cmd).Error(); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		e.waitQueued(t, name, 1) // queued again, by its own attempt
		if d := time.Since(start); d > signalWait/2 {
			t.Fatalf("queued again after %v, want about one refresh (1 s)", d)
		}
		if q := e.queued(t, name); q[0] != id {
			t.Fatalf("queued %q, want the dropped waiter %s", q, id)
		}
		release(t, holder)
		p := got(t, waiting, "dropped waiter")
		if p.ID() != id {
			t.Fatalf("permit %s, want the waiter's %s", p.ID(), id)
		}
		release(t, p)
		wantAvailable(t, s, 1)
	})
}

// TestFairTooHeavyAfterShrink: SetCapacity lowers the capacity below a
// queued waiter's weight while permits are held; no release tells it, but
// the next refresh of its entry wakes it and its Acquire fails with
// ErrInvalidWeight instead of waiting out its backstop timer.
func TestFairTooHeavyAfterShrink(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, targets()[0].addrs(t), semaphore.Options{Fair: true})
	name := uniqueName(t)
	s := e.sem(t, name, 4)
	holder := acquire(t, s, 2)
	waiting := acquireAsync(ctx, s, 4)
	e.waitQueued(t, name, 1)
	// Shrink once the waiter's entry has been written again (by its
	// attempt after subscribing, or a refresh): its own attempts are over,
	// so only a refresh can tell it.
	id := e.queued(t, name)[0]
	first := e.entry(name, id)
	if !redistest.WaitFor(ctx, signalWait, func() bool { return e.entry(name, id) != first }) {
		t.Fatal("the waiter's entry was not written again")
	}
	if err := s.SetCapacity(ctx, 2); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-waiting:
		if !errors.Is(r.err, semaphore.ErrInvalidWeight) {
			t.Fatalf("Acquire(4) after the capacity went to 2 = %v, %v; want ErrInvalidWeight", r.p, r.err)
		}
	case <-time.After(signalWait):
		t.Fatal("Acquire(4) still waiting after the capacity went to 2")
	}
	if q := e.queued(t, name); len(q) != 0 {
		t.Fatalf("queued %q after the heavy waiter failed, want none", q)
	}
	release(t, holder)
}
