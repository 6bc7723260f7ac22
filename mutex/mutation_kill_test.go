package mutex_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// Tests written against mutants that escaped every other test (issue 32;
// internal/harness/mutation lists them). Each says which mutant it kills.

// TestRWLastRUnlockWakesWriter: the release of the last live reader
// publishes the writers' wake-up when a writer waits, and that writer then
// gets the lock; an RUnlock that leaves another reader in publishes
// nothing. A waiting writer also retries every third of its mark, so
// without the wake-up it still got in after up to 0.7 s and no test saw
// the difference: an outside mutant that dropped rwmutex_runlock's
// PUBLISH escaped, and so did ones that broke its SPUBLISH on a cluster.
// What the writers' channel hears (SSUBSCRIBE on a cluster, as the
// primitives listen there) is what a missing wake-up changes, whatever
// the machine's speed.
func TestRWLastRUnlockWakesWriter(t *testing.T) {
	for _, tg := range []struct {
		name    string
		servers func(t *testing.T) []*redistest.Server
	}{
		{"single", func(t *testing.T) []*redistest.Server { return []*redistest.Server{redistest.NewServer(t)} }},
		{"cluster", func(t *testing.T) []*redistest.Server { return redistest.SharedCluster(t).Nodes }},
	} {
		t.Run(tg.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*signal)
			defer cancel()
			servers := tg.servers(t)
			var addrs []string
			for _, s := range servers {
				addrs = append(addrs, s.Addr())
			}
			l := newLocker(t, redistest.Client(t, addrs...), mutex.Options{Lease: time.Minute})
			name := "rwwake:" + t.Name()
			r1, r2, w := newRW(t, l, name), newRW(t, l, name), newRW(t, l, name)
			for _, r := range []*mutex.RWMutex{r1, r2} {
				if err := r.RLock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			done := make(chan error, 1)
			go func() { done <- w.Lock(ctx) }()
			if !redistest.WaitFor(ctx, signal, func() bool {
				in, err := r1.Info(ctx)
				return err == nil && in.WriterWaiting > 0
			}) {
				t.Fatal("the writer's Lock left no writer-waiting mark")
			}
			heard := listen(t, addrs, rwKey(name, "wr"))
			if err := r1.RUnlock(ctx); err != nil {
				t.Fatal(err)
			}
			if got := heard()[rwKey(name, "wr")]; got != 0 {
				t.Errorf("an RUnlock that left a reader in published %d wake-ups, want 0", got)
			}
			if err := r2.RUnlock(ctx); err != nil {
				t.Fatal(err)
			}
			if got := heard()[rwKey(name, "wr")]; got != 1 {
				t.Errorf("the last reader's RUnlock, with a writer waiting, published %d wake-ups on the writers' channel, want 1", got)
			}
			if err := <-done; err != nil {
				t.Fatalf("waiting writer's Lock = %v, want the lock", err)
			}
			if err := w.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestExtendAfterTakeoverBySameOwner: a Mutex whose lock was taken over by
// another value with the same owner id (WithOwner, as a restarted process
// does) finds the loss at its next Extend, which must neither succeed nor
// lengthen the new holder's lease. mutex_renew checks the owner and the
// acquisition's token; with only the owner checked (an outside mutant
// turned its and into or) the old value's Extend renewed the new holder's
// lock and reported success, and no test saw it: the other Extend tests
// end the hold by deleting the key, which fails either check.
func TestExtendAfterTakeoverBySameOwner(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	oldProc, newProc := newLocker(t, client, mutex.Options{}), newLocker(t, client, mutex.Options{})
	name := "extend-takeover:" + t.Name()
	a := newMutex(t, oldProc, name, mutex.WithOwner("worker-7"), mutex.WithLease(time.Minute))
	b := newMutex(t, newProc, name, mutex.WithOwner("worker-7"), mutex.WithLease(time.Minute))
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Token() <= a.Token() {
		t.Fatalf("takeover token %d, want greater than the old holder's %d", b.Token(), a.Token())
	}
	if until, err := a.Extend(ctx, 5*time.Minute); !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("the old holder's Extend after a takeover = %v, %v; want ErrLost", until, err)
	}
	info, err := b.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Held || info.Token != b.Token() || info.Remain > time.Minute {
		t.Fatalf("Info = %+v after the old holder's Extend, want held with token %d and at most the new holder's minute left", info, b.Token())
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// listen subscribes to channels, with SSUBSCRIBE on a cluster (as the
// primitives do there) and SUBSCRIBE on a single server, and returns a
// function that reports how many messages each has received since,
// probes left out. Each call first publishes a numbered probe on every
// channel and waits for it: the server delivers one subscriber's messages
// of a channel in order, so whatever was published before the call has
// arrived by then.
func listen(t *testing.T, addrs []string, channels ...string) func() map[string]int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	counts, probed := map[string]int{}, map[string]int{}
	pub := redistest.Client(t, addrs...)
	sharded := len(addrs) > 1
	var wg sync.WaitGroup
	for _, ch := range channels {
		c := redistest.Client(t, addrs...)
		sub := c.B().Subscribe().Channel(ch).Build()
		if sharded {
			sub = c.B().Ssubscribe().Channel(ch).Build()
		}
		wg.Go(func() {
			_ = c.Receive(ctx, sub, func(m rueidis.PubSubMessage) {
				mu.Lock()
				defer mu.Unlock()
				if n, ok := strings.CutPrefix(m.Message, "probe-"); ok {
					probed[m.Channel], _ = strconv.Atoi(n)
				} else {
					counts[m.Channel]++
				}
			})
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	n := 0
	// probe publishes probe n on every channel and waits up to wait for
	// all of them.
	probe := func(wait time.Duration) bool {
		n++
		for _, ch := range channels {
			cmd := pub.B().Publish().Channel(ch).Message("probe-" + strconv.Itoa(n)).Build()
			if sharded {
				cmd = pub.B().Spublish().Channel(ch).Message("probe-" + strconv.Itoa(n)).Build()
			}
			if err := pub.Do(ctx, cmd).Error(); err != nil {
				t.Fatal(err)
			}
		}
		return redistest.WaitFor(ctx, wait, func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, ch := range channels {
				if probed[ch] < n {
					return false
				}
			}
			return true
		})
	}
	// Probes published before the subscriptions are up are lost (and
	// PUBSUB NUMSUB counts the primitives' own subscribers too): probe
	// until one comes back.
	if !redistest.WaitFor(ctx, signal, func() bool { return probe(200 * time.Millisecond) }) {
		t.Fatal("subscription not confirmed")
	}
	return func() map[string]int {
		if !probe(signal) {
			t.Fatal("a probe message did not come back")
		}
		mu.Lock()
		defer mu.Unlock()
		out := map[string]int{}
		for _, ch := range channels {
			out[ch] = counts[ch]
		}
		return out
	}
}

// TestRWForceUnlockWakesBothSides: ForceUnlock of a write-held lock wakes
// the writers and the readers, each on its own channel, and a waiting
// writer then gets the lock; of a lock nobody holds (its only reader's
// lease ran out) it reports that nothing was held and wakes nobody.
// Outside the mutation runner's mutants, no test looked at what
// rwmutex_force publishes, or at its answer for an expired reader: a
// waiting writer retries on its own within a third of its mark.
func TestRWForceUnlockWakesBothSides(t *testing.T) {
	for _, tg := range []struct {
		name  string
		addrs func(t *testing.T) []string
	}{
		{"single", func(t *testing.T) []string { return []string{redistest.NewServer(t).Addr()} }},
		{"cluster", func(t *testing.T) []string { return redistest.SharedCluster(t).Addrs() }},
	} {
		t.Run(tg.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*signal)
			defer cancel()
			addrs := tg.addrs(t)
			l := newLocker(t, redistest.Client(t, addrs...), mutex.Options{Lease: time.Minute})
			name := "rwforce:" + t.Name()
			heard := listen(t, addrs, rwKey(name, "wr"), rwKey(name, "rd"))
			holder, waiter, operator := newRW(t, l, name), newRW(t, l, name), newRW(t, l, name)
			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- waiter.Lock(ctx) }()
			if !redistest.WaitFor(ctx, signal, func() bool {
				in, err := operator.Info(ctx)
				return err == nil && in.WriterWaiting > 0
			}) {
				t.Fatal("the waiting writer left no mark")
			}
			if ok, err := operator.ForceUnlock(ctx); !ok || err != nil {
				t.Fatalf("ForceUnlock of a write-held lock = %v, %v; want true", ok, err)
			}
			if got := heard(); got[rwKey(name, "wr")] != 1 || got[rwKey(name, "rd")] != 1 {
				t.Errorf("ForceUnlock published %v, want one wake-up on each channel", got)
			}
			if err := <-done; err != nil {
				t.Fatalf("waiting writer's Lock = %v, want the lock", err)
			}
			if err := waiter.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if in, err := operator.Info(ctx); err != nil || in.Writer != "" || in.Readers != 0 {
				t.Fatalf("Info after the release = %+v, %v; want nobody", in, err)
			}

			// A reader with a fixed lease that runs out: nothing is held then.
			short := newRW(t, l, name, mutex.WithLease(200*time.Millisecond))
			if err := short.RLock(ctx); err != nil {
				t.Fatal(err)
			}
			if !redistest.WaitFor(ctx, signal, func() bool {
				in, err := operator.Info(ctx)
				return err == nil && in.Readers == 0
			}) {
				t.Fatal("the reader's lease did not run out")
			}
			before := heard()
			if ok, err := operator.ForceUnlock(ctx); ok || err != nil {
				t.Errorf("ForceUnlock with only an expired reader = %v, %v; want false", ok, err)
			}
			if got := heard(); got[rwKey(name, "wr")] != before[rwKey(name, "wr")] || got[rwKey(name, "rd")] != before[rwKey(name, "rd")] {
				t.Errorf("ForceUnlock of a free lock published %v (before: %v), want nothing", got, before)
			}
			if err := short.RUnlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
				t.Errorf("RUnlock after the lease ran out and a ForceUnlock = %v, want ErrNotHeld", err)
			}
		})
	}
}

// TestReleasedHashKeptBriefly: after a final Unlock the lock's hash stays
// only for the keep time (at most a second), not for the rest of the
// holder's lease, as mutex_release promises; a ForceUnlock the same, and
// both for a read-write lock. Mutants that set the expiry on the wake-up
// channel's name instead of the hash (mutex_release) or dropped it
// (rwmutex_force) left it for the whole remaining lease, and no test
// looked.
func TestReleasedHashKeptBriefly(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	l := newLocker(t, client, mutex.Options{})
	for _, force := range []bool{false, true} {
		name := "keep:" + t.Name() + map[bool]string{false: ":unlock", true: ":force"}[force]
		m := newMutex(t, l, name, mutex.WithLease(time.Minute))
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if force {
			if ok, err := m.ForceUnlock(ctx); !ok || err != nil {
				t.Fatalf("ForceUnlock = %v, %v", ok, err)
			}
		} else if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		pttl, err := client.Do(ctx, client.B().Pttl().Key(lockKey(name)).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if pttl > time.Second.Milliseconds() {
			t.Errorf("force %v: the released hash expires in %d ms, want the keep time (at most 1000 ms), not the lease", force, pttl)
		}

		// The same for a read-write lock's state hash (no writer waits, so
		// no mark keeps it longer).
		rw := newRW(t, l, name, mutex.WithLease(time.Minute))
		if err := rw.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if force {
			if ok, err := rw.ForceUnlock(ctx); !ok || err != nil {
				t.Fatalf("RWMutex.ForceUnlock = %v, %v", ok, err)
			}
		} else if err := rw.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		pttl, err = client.Do(ctx, client.B().Pttl().Key(rwKey(name, "h")).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if pttl > time.Second.Milliseconds() {
			t.Errorf("force %v: the released read-write hash expires in %d ms, want the keep time (at most 1000 ms), not the lease", force, pttl)
		}
	}
}

// TestRWUnlockAfterTakeoverBySameOwner: a writer whose lock was taken over
// by another RWMutex value with the same owner id (WithOwner) must not
// release the new holder's lock with its Unlock: rwmutex_unlock checks the
// owner and the token. With either check alone (an and turned into or)
// the old value's Unlock released the new holder, and every test passed.
func TestRWUnlockAfterTakeoverBySameOwner(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	oldProc, newProc := newLocker(t, client, mutex.Options{}), newLocker(t, client, mutex.Options{})
	name := "rw-takeover:" + t.Name()
	a := newRW(t, oldProc, name, mutex.WithOwner("worker-7"), mutex.WithLease(time.Minute))
	b := newRW(t, newProc, name, mutex.WithOwner("worker-7"), mutex.WithLease(time.Minute))
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Token() <= a.Token() {
		t.Fatalf("takeover token %d, want greater than the old writer's %d", b.Token(), a.Token())
	}
	if err := a.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Fatalf("the old writer's Unlock after a takeover = %v, want ErrNotHeld", err)
	}
	in, err := b.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in.Writer != "worker-7" || in.Token != b.Token() {
		t.Fatalf("Info = %+v after the old writer's Unlock, want still held with token %d", in, b.Token())
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReadersSetExpiresWithLease: the first reader of a read-write lock
// gives the readers' set an expiry of its lease, so a reader that crashes
// leaves no key behind once its lease is over. A mutant of rwmutex_rlock
// without that PEXPIRE left the set forever, and no test looked.
func TestReadersSetExpiresWithLease(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l := newLocker(t, client, mutex.Options{})
	name := "rw-set-ttl:" + t.Name()
	r := newRW(t, l, name, mutex.WithLease(time.Minute))
	if err := r.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	pttl, err := client.Do(ctx, client.B().Pttl().Key(rwKey(name, "z")).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	if pttl <= 0 || pttl > time.Minute.Milliseconds() {
		t.Errorf("the readers' set expires in %d ms, want within the reader's lease (60000 ms)", pttl)
	}
	if err := r.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRWWaitingWriterMarks: what a waiting writer leaves in Redis. Its
// refused attempts must not shorten the holder's lease (rwmutex_lock
// lengthens the hash's expiry to the mark, never shortens it; a negated
// test cut a one-minute hold to the two-second mark); its mark goes once
// it gets the lock (a ZREM on the wrong key left readers refused for the
// rest of the mark); and an acquisition removes the read acquisitions
// whose leases ran out (a ZREM on the wrong key kept them). No test looked
// at any of the three.
func TestRWWaitingWriterMarks(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*signal)
	defer cancel()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l := newLocker(t, client, mutex.Options{})
	name := "rw-marks:" + t.Name()
	pttl := func(key string) int64 {
		t.Helper()
		n, err := client.Do(ctx, client.B().Pttl().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	holder := newRW(t, l, name, mutex.WithLease(time.Minute))
	waiter := newRW(t, l, name, mutex.WithLease(time.Minute))
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- waiter.Lock(ctx) }()
	if !redistest.WaitFor(ctx, signal, func() bool {
		in, err := holder.Info(ctx)
		return err == nil && in.WriterWaiting > 0
	}) {
		t.Fatal("the waiting writer left no mark")
	}
	if ms := pttl(rwKey(name, "h")); ms < (50 * time.Second).Milliseconds() {
		t.Fatalf("the holder's hash expires in %d ms once a writer waits, want the holder's minute", ms)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiting writer's Lock = %v", err)
	}
	// Its mark is withdrawn with the grant: the mark would otherwise run
	// for up to two seconds more, which this check comes well within
	// unless the machine stalls (then it can only miss the bug).
	if in, err := waiter.Info(ctx); err != nil || in.WriterWaiting != 0 {
		t.Errorf("Info after the waiting writer got the lock = %+v, %v; want no writer waiting", in, err)
	}
	if err := waiter.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// Read acquisitions whose leases ran out are removed by the next
	// acquisition: one reader stays, one runs out.
	long := newRW(t, l, name, mutex.WithLease(time.Minute))
	short := newRW(t, l, name, mutex.WithLease(200*time.Millisecond))
	for _, r := range []*mutex.RWMutex{long, short} {
		if err := r.RLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !redistest.WaitFor(ctx, signal, func() bool {
		in, err := long.Info(ctx)
		return err == nil && in.Readers == 1
	}) {
		t.Fatal("the short reader's lease did not run out")
	}
	if err := waiter.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("TryLock beside a reader = %v, want ErrNotObtained", err)
	}
	n, err := client.Do(ctx, client.B().Zcard().Key(rwKey(name, "z")).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("the readers' set holds %d members after an acquisition, want 1 (the expired reader removed)", n)
	}
	if err := long.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRWLossKeptByNewReadHold: Lost stays closed, and Err keeps the
// loss, until the value holds nothing and acquires again: a value that
// holds the write lock, lost its read hold beside it and released that,
// still reports the loss after it takes a new read hold, since the write
// hold never ended. A Go mutant that cleared the loss when either side was
// free (|| for &&) reopened Lost there, and no test took a read hold
// beside a write hold after a loss.
func TestRWLossKeptByNewReadHold(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*signal)
	defer cancel()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l := newLocker(t, client, mutex.Options{WatchdogLease: 600 * time.Millisecond})
	name := "rw-loss-kept:" + t.Name()
	rw := newRW(t, l, name)
	if err := rw.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	// The read hold goes; the write hold stays.
	if err := client.Do(ctx, client.B().Del().Key(rwKey(name, "z")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rw.Lost():
	case <-ctx.Done():
		t.Fatal("the reader was not told of its loss")
	}
	if err := rw.RUnlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Fatalf("RUnlock of the lost read hold = %v, want ErrNotHeld", err)
	}
	if err := rw.RLock(ctx); err != nil {
		t.Fatalf("a new read hold beside the write hold = %v", err)
	}
	select {
	case <-rw.Lost():
	default:
		t.Error("Lost is open again after a new read hold while the write hold never ended")
	}
	if err := rw.Err(); !errors.Is(err, mutex.ErrLost) {
		t.Errorf("Err after a new read hold while the write hold never ended = %v, want the read hold's loss", err)
	}
	if err := rw.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestNestedLockAfterForceUnlock: a nested Lock of a hold that a
// ForceUnlock ended meets the released record (kept for the keep time,
// with no hold in it) and must report the loss (ErrLost, Lost closed), as
// it does when the key is gone. A mutant of mutex_nest that parsed a hold
// out of a record that has none ("s and s < #v" to "or") made that call
// fail with WRONGTYPE instead, and every test passed: none nested a Lock
// inside the keep time of a forced release.
func TestNestedLockAfterForceUnlock(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l := newLocker(t, client, mutex.Options{})
	name := "nest-forced:" + t.Name()
	m := newMutex(t, l, name, mutex.WithLease(time.Minute)) // no watchdog to notice first
	other := newMutex(t, l, name)
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := other.ForceUnlock(ctx); !ok || err != nil {
		t.Fatalf("ForceUnlock = %v, %v", ok, err)
	}
	if n, err := client.Do(ctx, client.B().Exists().Key(lockKey(name)).Build()).AsInt64(); err != nil || n != 1 {
		t.Fatalf("EXISTS of the released record = %d, %v; want it kept for the keep time", n, err)
	}
	if err := m.Lock(ctx); !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("nested Lock after a ForceUnlock = %v, want ErrLost", err)
	}
	select {
	case <-m.Lost():
	default:
		t.Fatal("Lost not closed after the nested Lock found the hold ended")
	}
	if err := m.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Fatalf("Unlock after the loss = %v, want ErrNotHeld", err)
	}
}

// rwScriptKeys returns the keys of RWMutex name as rwmutex_lock,
// rwmutex_unlock and rwmutex_abandon take them.
func rwScriptKeys(name string) (lock, unlock, abandon []string) {
	return []string{rwKey(name, "h"), rwKey(name, "z"), rwKey(name, "t"), rwKey(name, "m")},
		[]string{rwKey(name, "h"), rwKey(name, "rd"), rwKey(name, "wr")},
		[]string{rwKey(name, "h"), rwKey(name, "z"), rwKey(name, "t"), rwKey(name, "rd"), rwKey(name, "wr"), rwKey(name, "m")}
}

// TestRWRefusedWriterMarkExpires: a Lock refused by readers sets its
// writer-waiting mark (q) on a state hash that did not exist (readers
// alone write none); the hash must then expire, no later than the mark, as
// every key of an RWMutex has a TTL. A mutant of rwmutex_lock without the
// PEXPIRE of the hash in its refusal left a hash without a TTL, forever if
// the writer vanished, and no test looked at its TTL.
func TestRWRefusedWriterMarkExpires(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*signal)
	defer cancel()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l := newLocker(t, client, mutex.Options{Lease: time.Minute})
	name := "rwmark-ttl:" + t.Name() + strconv.Itoa(rand.IntN(1e9))
	r, w := newRW(t, l, name), newRW(t, l, name)
	if err := r.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Lock(wctx) }()
	waitRedis(t, "the writer's mark", func() bool {
		in, err := r.Info(ctx)
		return err == nil && in.WriterWaiting > 0
	})
	for _, suffix := range []string{"h", "m"} {
		ttl, err := client.Do(ctx, client.B().Pttl().Key(rwKey(name, suffix)).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= 0 || ttl > 2000 {
			t.Errorf("PTTL of %q while a writer's mark of 2 s runs = %d ms, want in (0, 2000]", suffix, ttl)
		}
	}
	wcancel()
	if err := <-done; err == nil {
		t.Fatal("the writer's Lock got the lock while a reader held")
	}
	if err := r.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestScriptRWWithdrawalDropsDeadMarks: a writer that gives up withdraws
// its mark (rwmutex_abandon, kind "m"), and marks of writers that vanished
// (their end passed) go with it, so the marks set does not keep them. A
// mutant without that removal left them; q and the readers' refusals
// were right either way, and no test read the set.
func TestScriptRWWithdrawalDropsDeadMarks(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc := newScripts(t, client)
	lock, _ := sc.Script("rwmutex_lock")
	abandon, _ := sc.Script("rwmutex_abandon")
	name := "rw-dead-marks:" + strconv.Itoa(rand.IntN(1e9))
	lockKeys, _, abandonKeys := rwScriptKeys(name)
	try := func(owner, attempt, markMs, markID string) int64 {
		t.Helper()
		vs, err := lock.Exec(ctx, lockKeys, []string{owner, "30000", "0", attempt, "", markMs, markID}).AsIntSlice()
		if err != nil || len(vs) != 3 {
			t.Fatalf("lock %s = %v, %v", attempt, vs, err)
		}
		return vs[0]
	}
	if try("H", "h.1", "0", "") != 1 {
		t.Fatal("the first writer was refused")
	}
	if try("X", "x.1", "50", "mx.1") != 0 || try("Y", "y.1", "30000", "my.1") != 0 {
		t.Fatal("a writer got in while another held")
	}
	marks := rwKey(name, "m")
	waitRedis(t, "X's mark to end", func() bool {
		end, err := client.Do(ctx, client.B().Zscore().Key(marks).Member("mx.1").Build()).AsInt64()
		if err != nil {
			t.Fatalf("X's mark: %v", err)
		}
		now, err := client.Do(ctx, client.B().Time().Build()).AsIntSlice()
		if err != nil || len(now) != 2 {
			t.Fatalf("TIME: %v, %v", now, err)
		}
		return end < now[0]*1000+now[1]/1000
	})
	n, err := abandon.Exec(ctx, abandonKeys, []string{"Y", "my.1", "m", "p", "1000", "30000", "my.1"}).AsInt64()
	if err != nil || n != 1 {
		t.Fatalf("Y's withdrawal = %d, %v; want 1", n, err)
	}
	left, err := client.Do(ctx, client.B().Zrange().Key(marks).Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("marks left after the only live one was withdrawn: %q, want none (the dead ones go with it)", left)
	}
}

// TestScriptRWRunKeepsUnlockedHoldsAfterExpiry: a grant that replaces a
// write hold whose lease ran out lists that hold in c and keeps the run's
// start, so a write hold that ended by its Unlock before it is still
// known as released: that Unlock, retried after a later release (so r,
// the last release, names another), is told 0 (its first try released),
// while the expired hold's is told -1. A mutant that read c
// as empty there (the "or" of its HGET made "and") started a new run
// after the expired hold and forgot the earlier one: its retried Unlock was told -1, a loss
// that never happened. TestScriptRWUnlockRetryAfterExpiry had no hold
// before the expired one.
func TestScriptRWRunKeepsUnlockedHoldsAfterExpiry(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc := newScripts(t, client)
	lock, _ := sc.Script("rwmutex_lock")
	unlock, _ := sc.Script("rwmutex_unlock")
	name := "rw-run-expiry:" + strconv.Itoa(rand.IntN(1e9))
	lockKeys, unlockKeys, _ := rwScriptKeys(name)
	take := func(owner, attempt, leaseMs string) []int64 {
		t.Helper()
		vs, err := lock.Exec(ctx, lockKeys, []string{owner, leaseMs, "0", attempt, "", "0", ""}).AsIntSlice()
		if err != nil || len(vs) != 3 {
			t.Fatalf("lock %s = %v, %v", attempt, vs, err)
		}
		return vs
	}
	release := func(owner string, token int64) int64 {
		t.Helper()
		n, err := unlock.Exec(ctx, unlockKeys, []string{owner, "1", strconv.FormatInt(token, 10), "p", "30000"}).AsInt64()
		if err != nil {
			t.Fatalf("unlock %s %d: %v", owner, token, err)
		}
		return n
	}
	w0 := take("W0", "w0.1", "30000")
	if n := release("W0", w0[2]); n != 0 {
		t.Fatalf("W0's unlock = %d", n)
	}
	w1 := take("W1", "w1.1", "50")
	var w2 []int64
	waitRedis(t, "W1's lease to run out", func() bool {
		w2 = take("W2", "w2.1", "30000")
		return w2[0] == 1
	})
	if n := release("W2", w2[2]); n != 0 {
		t.Fatalf("W2's unlock = %d", n)
	}
	// W2's release is the last (r): the retries are judged by c.
	if n := release("W0", w0[2]); n != 0 {
		t.Errorf("W0's retried unlock after an expired hold was replaced = %d, want 0 (its first try released)", n)
	}
	if n := release("W1", w1[2]); n != -1 {
		t.Errorf("unlock of the hold whose lease ran out = %d, want -1", n)
	}
}

// TestScriptLockRepeatedAttemptRenewsLease: a Lock call that repeats the
// attempt id of the current hold (a retry whose first reply was lost, or
// the waiter a release handed the lock to) is told it holds the lock, and
// the lease starts again from now: the record's TTL is the new call's
// lease, not what was left of the first one. A mutant of mutex_lock that
// set the expiry on the tombstones' key instead answered {2, ...} all the
// same, and no test read the record's TTL after it.
func TestScriptLockRepeatedAttemptRenewsLease(t *testing.T) {
	for _, mode := range []string{"", "f"} {
		t.Run("mode="+mode, func(t *testing.T) {
			r := newScriptRig(t, "repeat-renews:"+mode+strconv.Itoa(rand.IntN(1e9)))
			if a := r.takeLease("A", "a.1", mode, "1000"); a[0] != 1 {
				t.Fatalf("A's lock = %v, want granted", a)
			}
			if a := r.takeLease("A", "a.1", mode, "60000"); a[0] != 2 {
				t.Fatalf("A's lock repeated = %v, want {2, holds, token}", a)
			}
			ttl, err := r.client.Do(r.ctx, r.client.B().Pttl().Key(r.keys.lock[0]).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			if ttl <= 1000 {
				t.Errorf("PTTL of the record after the repeated call with a lease of 60 s = %d ms, want the new lease (above the first call's 1 s)", ttl)
			}
		})
	}
}

// TestScriptRWShorterMarkKeepsLongerOnes: the writers' marks set lives as
// long as its longest mark: a writer refused with a shorter mark (a
// shorter lease) than one already set must not cut the set's TTL to its
// own, or the longer mark would vanish with the set while q still holds
// readers off for it, and its writer's grant or withdrawal would no longer
// find it to bring q back. A mutant of rwmutex_lock that compared the
// tombstones' TTL instead (none: always shorter) set the set's TTL to
// every refused writer's mark, and no test had two marks of different
// lengths.
func TestScriptRWShorterMarkKeepsLongerOnes(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc := newScripts(t, client)
	lock, _ := sc.Script("rwmutex_lock")
	name := "rw-mark-ttl:" + strconv.Itoa(rand.IntN(1e9))
	lockKeys, _, _ := rwScriptKeys(name)
	for _, c := range []struct{ owner, attempt, markMs, markID string }{
		{"H", "h.1", "0", ""}, // holds
		{"X", "x.1", "2000", "mx.1"},
		{"Y", "y.1", "100", "my.1"},
	} {
		vs, err := lock.Exec(ctx, lockKeys, []string{c.owner, "30000", "0", c.attempt, "", c.markMs, c.markID}).AsIntSlice()
		if err != nil || len(vs) != 3 || (vs[0] == 1) != (c.owner == "H") {
			t.Fatalf("lock %s = %v, %v; want only H granted", c.attempt, vs, err)
		}
	}
	ttl, err := client.Do(ctx, client.B().Pttl().Key(rwKey(name, "m")).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= 100 {
		t.Errorf("PTTL of the marks set after a mark of 2 s and one of 100 ms = %d ms, want the longer mark's (above 100)", ttl)
	}
}

// TestScriptRWGiveBackOfGrantThatReplacedExpiredHold: a write grant that
// replaces a hold whose lease ran out records its own attempt id (a), as
// every grant does, so that the give-back of that attempt (its Lock was
// abandoned while the reply was on its way) releases it and the next
// writer gets in at once. A mutant of rwmutex_lock that wrote the nested
// token (empty) as a on that path only left the give-back without effect:
// the abandoned grant held the lock for its whole lease.
func TestScriptRWGiveBackOfGrantThatReplacedExpiredHold(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc := newScripts(t, client)
	lock, _ := sc.Script("rwmutex_lock")
	unlock, _ := sc.Script("rwmutex_unlock")
	abandon, _ := sc.Script("rwmutex_abandon")
	name := "rw-giveback-replaced:" + strconv.Itoa(rand.IntN(1e9))
	lockKeys, unlockKeys, abandonKeys := rwScriptKeys(name)
	take := func(owner, attempt, leaseMs string) []int64 {
		t.Helper()
		vs, err := lock.Exec(ctx, lockKeys, []string{owner, leaseMs, "0", attempt, "", "0", ""}).AsIntSlice()
		if err != nil || len(vs) != 3 {
			t.Fatalf("lock %s = %v, %v", attempt, vs, err)
		}
		return vs
	}
	// W0's release keeps the hash for 30 s, so W1's short lease leaves its
	// hold (o) behind when it runs out, for W2's grant to replace.
	w0 := take("W0", "w0.1", "30000")
	if n, err := unlock.Exec(ctx, unlockKeys, []string{"W0", "1", strconv.FormatInt(w0[2], 10), "p", "30000"}).AsInt64(); err != nil || n != 0 {
		t.Fatalf("W0's unlock = %d, %v", n, err)
	}
	take("W1", "w1.1", "50")
	waitRedis(t, "W1's lease to run out", func() bool { return take("W2", "w2.1", "30000")[0] == 1 })
	n, err := abandon.Exec(ctx, abandonKeys, []string{"W2", "w2.1", "w", "p", "1000", "30000", ""}).AsInt64()
	if err != nil || n != 1 {
		t.Fatalf("give-back of W2's grant = %d, %v; want 1 (released)", n, err)
	}
	if w3 := take("W3", "w3.1", "30000"); w3[0] != 1 {
		t.Fatalf("W3's lock after W2's grant was given back = %v, want granted", w3)
	}
}

// TestScriptRWRLockAfterOwnWriteHoldExpired: an RWMutex value's RLock goes
// through a writer-waiting mark only while the write hold it names is
// held; once that hold's lease has run out, its RLock is a reader like any
// other and is refused while another writer's mark runs. A mutant of
// rwmutex_rlock that made the last "and" of that test an "or" let the
// expired holder's RLock through on the token alone.
func TestScriptRWRLockAfterOwnWriteHoldExpired(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc := newScripts(t, client)
	lock, _ := sc.Script("rwmutex_lock")
	rlock, _ := sc.Script("rwmutex_rlock")
	name := "rw-rlock-expired-writer:" + strconv.Itoa(rand.IntN(1e9))
	lockKeys, _, _ := rwScriptKeys(name)
	rlockKeys := []string{rwKey(name, "h"), rwKey(name, "z"), rwKey(name, "t")}
	w, err := lock.Exec(ctx, lockKeys, []string{"W", "2000", "0", "w.1", "", "0", ""}).AsIntSlice()
	if err != nil || w[0] != 1 {
		t.Fatalf("W's lock = %v, %v", w, err)
	}
	token := strconv.FormatInt(w[2], 10)
	if x, err := lock.Exec(ctx, lockKeys, []string{"X", "30000", "0", "x.1", "", "30000", "mx.1"}).AsIntSlice(); err != nil || x[0] != 0 {
		t.Fatalf("X's lock while W holds = %v, %v; want refused, with its mark", x, err)
	}
	rl := func(attempt string) int64 {
		t.Helper()
		vs, err := rlock.Exec(ctx, rlockKeys, []string{"W", "30000", "0", attempt, token}).AsIntSlice()
		if err != nil || len(vs) != 3 {
			t.Fatalf("W's rlock %s = %v, %v", attempt, vs, err)
		}
		return vs[0]
	}
	if got := rl("w.2"); got != 1 {
		t.Fatalf("W's rlock while it holds the write lock = %d, want granted through X's mark", got)
	}
	waitRedis(t, "W's write lease to run out", func() bool {
		e, err := client.Do(ctx, client.B().Hget().Key(rwKey(name, "h")).Field("e").Build()).AsInt64()
		if err != nil {
			t.Fatalf("W's lease end: %v", err)
		}
		now, err := client.Do(ctx, client.B().Time().Build()).AsIntSlice()
		if err != nil || len(now) != 2 {
			t.Fatalf("TIME: %v, %v", now, err)
		}
		return e < now[0]*1000+now[1]/1000
	})
	if got := rl("w.3"); got != 0 {
		t.Errorf("W's rlock naming its expired write hold while X's mark runs = %d, want refused (0)", got)
	}
}

// rwScriptRig runs the read-write lock's scripts by hand, with the keys
// and arguments package mutex sends, through scriptcache (so the mutation
// runner selects the tests that use it), on a lock of its own.
type rwScriptRig struct {
	t                                   *testing.T
	ctx                                 context.Context
	lock, rlock, unlock, abandon, force *scriptcache.Script
	lockKeys, unlockKeys, forceKeys     []string
	rlockKeys, abandonKeys              []string
}

func newRWScriptRig(t *testing.T, name string) *rwScriptRig {
	t.Helper()
	ctx := context.Background()
	sc, err := scriptcache.New(ctx, redistest.Client(t, redistest.Single(t).Addr()))
	if err != nil {
		t.Fatal(err)
	}
	r := &rwScriptRig{t: t, ctx: ctx}
	r.lock, _ = sc.Script("rwmutex_lock")
	r.rlock, _ = sc.Script("rwmutex_rlock")
	r.unlock, _ = sc.Script("rwmutex_unlock")
	r.abandon, _ = sc.Script("rwmutex_abandon")
	r.force, _ = sc.Script("rwmutex_force")
	name += strconv.Itoa(rand.IntN(1e9))
	r.lockKeys, r.unlockKeys, r.abandonKeys = rwScriptKeys(name)
	r.rlockKeys = r.lockKeys[:3]
	r.forceKeys = []string{rwKey(name, "h"), rwKey(name, "z"), rwKey(name, "rd"), rwKey(name, "wr")}
	return r
}

// take runs an outermost Lock attempt of owner with a lease of 30 s; a
// refusal leaves the mark markID for markMs ("0", "": none, a TryLock).
func (r *rwScriptRig) take(owner, attempt, markMs, markID string) []int64 {
	r.t.Helper()
	vs, err := r.lock.Exec(r.ctx, r.lockKeys, []string{owner, "30000", "0", attempt, "", markMs, markID}).AsIntSlice()
	if err != nil || len(vs) != 3 {
		r.t.Fatalf("lock %s = %v, %v", attempt, vs, err)
	}
	return vs
}

// rtake runs an outermost RLock attempt of owner (holding no write lock)
// with a lease of 30 s.
func (r *rwScriptRig) rtake(owner, attempt string) []int64 {
	r.t.Helper()
	vs, err := r.rlock.Exec(r.ctx, r.rlockKeys, []string{owner, "30000", "0", attempt, ""}).AsIntSlice()
	if err != nil || len(vs) != 3 {
		r.t.Fatalf("rlock %s = %v, %v", attempt, vs, err)
	}
	return vs
}

// release runs the final Unlock of owner's write hold with token.
func (r *rwScriptRig) release(owner string, token int64) int64 {
	r.t.Helper()
	n, err := r.unlock.Exec(r.ctx, r.unlockKeys, []string{owner, "1", strconv.FormatInt(token, 10), "p", "30000"}).AsInt64()
	if err != nil {
		r.t.Fatalf("unlock %s %d: %v", owner, token, err)
	}
	return n
}

// forceUnlock runs ForceUnlock and returns {1 if a writer held, live
// readers released}.
func (r *rwScriptRig) forceUnlock() []int64 {
	r.t.Helper()
	vs, err := r.force.Exec(r.ctx, r.forceKeys, []string{"p", "1000"}).AsIntSlice()
	if err != nil || len(vs) != 2 {
		r.t.Fatalf("force unlock = %v, %v", vs, err)
	}
	return vs
}

// giveBack runs the give-back of owner's abandoned attempt (kind "w" or
// "r"), withdrawing the Lock call's mark too ("": none).
func (r *rwScriptRig) giveBack(owner, attempt, kind, mark string) int64 {
	r.t.Helper()
	n, err := r.abandon.Exec(r.ctx, r.abandonKeys, []string{owner, attempt, kind, "p", "1000", "30000", mark}).AsInt64()
	if err != nil {
		r.t.Fatalf("give-back of %s: %v", attempt, err)
	}
	return n
}

// TestScriptRWGiveBackBeforeAttempt: the give-back of an abandoned Lock or
// RLock is sent without waiting for the attempt's reply, so it may reach
// Redis first; its tombstone must then make the attempt take nothing when
// it arrives, or nobody (the caller has gone) would release that hold and
// everyone else would wait out its lease. Here a writer gets the lock at
// once after each late attempt. A mutant of rwmutex_lock that looked the
// tombstone up under ARGV[5] (the nested token) let the late write
// attempt take the lock, and no test sent an RWMutex attempt after its
// give-back (TestGiveBackBeforeAttempt does it for Mutex).
func TestScriptRWGiveBackBeforeAttempt(t *testing.T) {
	r := newRWScriptRig(t, "rw-giveback-first:")
	if n := r.giveBack("R", "r.3", "r", ""); n != 0 {
		t.Fatalf("give-back of read attempt r.3 before it ran = %d, want 0 (nothing held yet)", n)
	}
	r.rtake("R", "r.3")
	x := r.take("X", "x.1", "0", "")
	if x[0] != 1 {
		t.Fatalf("a writer after the late read attempt r.3 = %v, want granted (the attempt took no read hold)", x)
	}
	if n := r.release("X", x[2]); n != 0 {
		t.Fatalf("X's unlock = %d", n)
	}
	if n := r.giveBack("W", "w.5", "w", "mw.5"); n != 0 {
		t.Fatalf("give-back of write attempt w.5 before it ran = %d, want 0 (nothing held yet)", n)
	}
	r.take("W", "w.5", "30000", "mw.5")
	if y := r.take("Y", "y.1", "0", ""); y[0] != 1 {
		t.Errorf("a writer after the late write attempt w.5 = %v, want granted (the attempt took no hold)", y)
	}
}

// TestScriptRWStaleAttemptCannotRetag: attempt 2 of an RWMutex value holds
// the write lock when the value's abandoned attempt 1 arrives (as
// TestStaleAttemptCannotRetag for Mutex). Attempt 1 must take nothing, so
// that its give-back leaves attempt 2's hold alone and attempt 2's Unlock
// releases it. A mutant of rwmutex_lock that read c instead of a (the
// holding attempt) never found an older attempt: attempt 1 replaced
// attempt 2's hold, and its give-back released it, a lock released that
// its holder did not give up.
func TestScriptRWStaleAttemptCannotRetag(t *testing.T) {
	r := newRWScriptRig(t, "rw-retag:")
	w2 := r.take("W", "n0nce.2", "0", "")
	if w2[0] != 1 {
		t.Fatalf("attempt 2 = %v, want granted", w2)
	}
	r.take("W", "n0nce.1", "30000", "n0nce.0")
	if n := r.giveBack("W", "n0nce.1", "w", "n0nce.0"); n != 0 {
		t.Errorf("give-back of the stale attempt 1 = %d, want 0 (it holds nothing)", n)
	}
	if n := r.release("W", w2[2]); n != 0 {
		t.Errorf("attempt 2's Unlock after the stale attempt 1 and its give-back = %d, want 0 (it still held)", n)
	}
}

// TestScriptRWWriteReleaseKeepsOtherWritersMark: the end of a write hold
// (the give-back of its granted attempt, its Unlock, a ForceUnlock)
// releases that hold and nothing else: another writer that was refused
// and left its mark still keeps new readers out until it gets in, or
// readers could take the lock it was about to get, for ever under a
// steady stream of them (rwmutex_force's header says the mark stays).
// Mutants of rwmutex_abandon (issue 32, run 11), rwmutex_unlock and
// rwmutex_force whose HDEL of the hold took q (the mark's end) instead of
// o let a reader in at once, and no test read what the end of a hold left
// for other waiters.
func TestScriptRWWriteReleaseKeepsOtherWritersMark(t *testing.T) {
	for _, end := range []string{"give-back", "unlock", "force"} {
		t.Run(end, func(t *testing.T) {
			r := newRWScriptRig(t, "rw-release-mark:"+end)
			w := r.take("W", "w.1", "30000", "mw.1")
			if w[0] != 1 {
				t.Fatalf("W's lock = %v, want granted", w)
			}
			if x := r.take("X", "x.1", "30000", "mx.1"); x[0] != 0 {
				t.Fatalf("X's lock while W holds = %v, want refused, with its mark", x)
			}
			switch end {
			case "give-back":
				if n := r.giveBack("W", "w.1", "w", "mw.1"); n != 1 {
					t.Fatalf("give-back of W's grant = %d, want 1 (released)", n)
				}
			case "unlock":
				if n := r.release("W", w[2]); n != 0 {
					t.Fatalf("W's unlock = %d, want 0 (released)", n)
				}
			case "force":
				if got := r.forceUnlock(); got[0] != 1 {
					t.Fatalf("force unlock = %v, want the writer released", got)
				}
			}
			if got := r.rtake("R", "r.1"); got[0] != 0 || got[1] <= 0 {
				t.Errorf("a reader's RLock while X's mark runs = %v, want refused until the mark ends", got)
			}
			if x := r.take("X", "x.2", "30000", "mx.1"); x[0] != 1 {
				t.Errorf("X's lock after W's hold ended = %v, want granted", x)
			}
		})
	}
}

// TestScriptRWUnlockRetryAfterGiveBack: a write hold given back lists its
// token in c and leaves f, so that a final Unlock of an earlier hold, retried
// after the give-back (and after another release, so r names another), is
// still told its first try released the lock, as docs/guarantees.md promises for
// up to 16 holds that ended otherwise. A mutant of rwmutex_abandon whose
// HDEL took f instead of e left the retry nothing to judge by: it was told
// -1, a loss that never happened.
func TestScriptRWUnlockRetryAfterGiveBack(t *testing.T) {
	r := newRWScriptRig(t, "rw-retry-giveback:")
	w0 := r.take("W0", "w0.1", "0", "")
	if n := r.release("W0", w0[2]); n != 0 {
		t.Fatalf("W0's unlock = %d", n)
	}
	w2 := r.take("W2", "w2.1", "0", "")
	if n := r.release("W2", w2[2]); n != 0 {
		t.Fatalf("W2's unlock = %d", n)
	}
	if w1 := r.take("W1", "w1.1", "0", ""); w1[0] != 1 {
		t.Fatalf("W1's lock = %v, want granted", w1)
	}
	if n := r.giveBack("W1", "w1.1", "w", ""); n != 1 {
		t.Fatalf("give-back of W1's grant = %d, want 1 (released)", n)
	}
	if n := r.release("W0", w0[2]); n != 0 {
		t.Errorf("W0's retried unlock after a later hold was given back = %d, want 0 (its first try released)", n)
	}
}

// TestScriptRWWithdrawalWakesReadersOnlyWhenMarkEndsSooner: a writer's
// withdrawal of its mark (rwmutex_abandon, kind "m", or the give-back of
// its refused attempt) wakes the waiting readers when it lets them in
// sooner: it ends the last running mark, or brings the latest end
// forward. It wakes nobody when the readers' wait does not change: a
// mark shorter than another that still runs, a mark already withdrawn,
// or a mark that ran out on its own (readers refused until its end have
// tried again by then). Every needless wake-up makes every waiting
// reader of the lock call Redis once more, for nothing. A mutant of
// rwmutex_abandon that woke the readers whenever the withdrawal was told
// to wake ("or" for "and") escaped: the tests counted the wake-ups of
// withdrawals that changed q, never of one that did not.
func TestScriptRWWithdrawalWakesReadersOnlyWhenMarkEndsSooner(t *testing.T) {
	r := newRWScriptRig(t, "rw-withdraw-wake:")
	addr := redistest.Single(t).Addr()
	client := redistest.Client(t, addr)
	state, readers, marks := r.abandonKeys[0], r.abandonKeys[3], r.abandonKeys[5]
	heard := listen(t, []string{addr}, readers)
	woken := 0
	expect := func(what string, want int) {
		t.Helper()
		got := heard()[readers] - woken
		woken += got
		if got != want {
			t.Errorf("%s published %d readers' wake-ups, want %d", what, got, want)
		}
	}
	q := func() int64 { // the readers' wait (0: none)
		t.Helper()
		v, err := client.Do(r.ctx, client.B().Hget().Key(state).Field("q").Build()).AsInt64()
		if err != nil && !rueidis.IsRedisNil(err) {
			t.Fatal(err)
		}
		return v
	}
	markEnd := func(mark string) int64 {
		t.Helper()
		end, err := client.Do(r.ctx, client.B().Zscore().Key(marks).Member(mark).Build()).AsInt64()
		if err != nil {
			t.Fatalf("mark %s: %v", mark, err)
		}
		return end
	}
	withdraw := func(mark string) int64 { return r.giveBack("W", mark, "m", mark) }
	refuse := func(owner, attempt, markMs, mark string) {
		t.Helper()
		if vs := r.take(owner, attempt, markMs, mark); vs[0] != 0 {
			t.Fatalf("%s's lock while H holds = %v, want refused", owner, vs)
		}
	}

	if h := r.take("H", "h.1", "0", ""); h[0] != 1 {
		t.Fatalf("H's lock = %v, want granted", h)
	}
	refuse("X", "x.1", "1000", "mx.1")
	refuse("Y", "y.1", "30000", "my.1")
	qy := q()
	if qy != markEnd("my.1") {
		t.Fatalf("q = %d with marks of 1 s and 30 s, want the later end %d", qy, markEnd("my.1"))
	}
	refuse("V", "v.1", "20000", "mv.1")
	if n := withdraw("mv.1"); n != 1 {
		t.Fatalf("withdrawal of V's mark = %d, want 1", n)
	}
	expect("the withdrawal of a mark shorter than another still running", 0)
	if v := q(); v != qy {
		t.Errorf("q = %d after a shorter mark was withdrawn, want Y's end %d", v, qy)
	}
	// Y gives up through the give-back of its refused attempt: X's mark,
	// which ends sooner, is the readers' wait now.
	if n := r.giveBack("Y", "y.1", "w", "my.1"); n != 0 {
		t.Fatalf("give-back of Y's refused attempt = %d, want 0 (it held nothing)", n)
	}
	expect("the withdrawal of the latest mark, another ending sooner", 1)
	qx := markEnd("mx.1")
	if v := q(); v != qx {
		t.Fatalf("q = %d after Y's mark was withdrawn, want X's end %d", v, qx)
	}
	// X's mark runs out on its own (the set lives on, for Y's 30 s); its
	// withdrawal afterwards lets no reader in sooner.
	waitRedis(t, "X's mark to run out", func() bool {
		now, err := client.Do(r.ctx, client.B().Time().Build()).AsIntSlice()
		if err != nil || len(now) != 2 {
			t.Fatalf("TIME: %v, %v", now, err)
		}
		return qx < now[0]*1000+now[1]/1000
	})
	if n := withdraw("mx.1"); n != 1 {
		t.Fatalf("withdrawal of X's mark that ran out = %d, want 1 (it was there)", n)
	}
	expect("the withdrawal of a mark that had run out", 0)
	if v := q(); v != 0 {
		t.Errorf("q = %d after the only mark was withdrawn, want none", v)
	}
	if n := withdraw("mx.1"); n != 0 {
		t.Fatalf("second withdrawal of X's mark = %d, want 0", n)
	}
	expect("a second withdrawal of a mark", 0)
	// The last running mark withdrawn: readers go in now.
	refuse("Z", "z.1", "10000", "mz.1")
	if n := withdraw("mz.1"); n != 1 {
		t.Fatalf("withdrawal of Z's mark = %d, want 1", n)
	}
	expect("the withdrawal of the last running mark", 1)
	if v := q(); v != 0 {
		t.Errorf("q = %d after the last mark was withdrawn, want none", v)
	}
}

// TestReleaseSkipsEntryEndingThisMillisecond: a release hands the lock
// only to a waiter whose queue entry still lives; an entry whose expiry
// is the release's own millisecond is dead (a grant would get no lease
// at all), and the release goes on as for any dead entry: it succeeds and
// leaves the lock free. A mutant of mutex_release that took an entry
// ending now as live ("expiry >= now") wrote the grant with PX 0, which
// Redis refuses: the Unlock failed and the lock stayed held by the owner
// who had let it go. The dead-entry tests used entries long dead. Only
// iterations whose release ran in the millisecond the entry ends (TIME
// read before and after agree) test the boundary; the others must pass
// as well.
func TestReleaseSkipsEntryEndingThisMillisecond(t *testing.T) {
	r := newReviewRig(t, "release-entry-ends-now:"+strconv.Itoa(rand.IntN(1e9)))
	serverMs := func() int64 {
		t.Helper()
		tm, err := r.client.Do(r.ctx, r.client.B().Time().Build()).AsIntSlice()
		if err != nil || len(tm) != 2 {
			t.Fatalf("TIME: %v, %v", tm, err)
		}
		return tm[0]*1000 + tm[1]/1000
	}
	hits := 0
	for i := 0; i < 300 && hits < 3; i++ {
		h := r.takeL("H", "h."+strconv.Itoa(i), "", "30000")
		if h[0] != 1 {
			t.Fatalf("H's lock = %v, want granted", h)
		}
		w := "w." + strconv.Itoa(i)
		if got := r.takeL("W", w, "f", "30000"); got[0] != 0 {
			t.Fatalf("W's fair lock while H holds = %v, want queued", got)
		}
		t0 := serverMs()
		r.do("HSET", r.keys.lock[3], w, strconv.FormatInt(t0, 10)+" W") // W's entry ends now
		if n := r.unlock("H", h[2]); n != 0 {
			t.Fatalf("H's unlock = %d, want 0", n)
		}
		if serverMs() == t0 {
			hits++
		}
		if o := r.field("o"); o != "" {
			t.Fatalf("after H's release the lock is held by %q, want free (W's entry had ended)", o)
		}
		if err := r.do(append([]string{"DEL"}, r.keys.lock...)...).Error(); err != nil {
			t.Fatal(err)
		}
	}
	if hits == 0 {
		t.Skip("no release ran in the millisecond its waiter's entry ended (a slow machine): the boundary went untested")
	}
}

// TestNestedUnlockCountsDownInRedis: each Unlock of a nested hold lowers
// the hold count the lock record keeps (what Info reports, and what
// another process of the same owner id sees), keeps the lease, and writes
// no other key; the last Unlock frees the lock. A mutant of mutex_release
// that wrote the lowered count under the wake-up channel's name (KEYS[2]
// for KEYS[1]) left the record at its old count and made a key without a
// TTL, and no test read the count between a nested Unlock and the last.
func TestNestedUnlockCountsDownInRedis(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l := newLocker(t, client, mutex.Options{})
	name := "nested-unlock:" + strconv.Itoa(rand.IntN(1e9))
	m := newMutex(t, l, name, mutex.WithLease(time.Minute))
	for range 3 {
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wake := lockKey(name) + ":w"
	for want := int64(2); want >= 0; want-- {
		if err := m.Unlock(ctx); err != nil {
			t.Fatalf("Unlock down to %d holds: %v", want, err)
		}
		in, err := m.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if in.Held != (want > 0) || in.Holds != want {
			t.Errorf("Info after an Unlock down to %d holds = %+v, want held %v with %d holds", want, in, want > 0, want)
		}
		if want > 0 && (in.Remain <= 0 || in.Remain > time.Minute) {
			t.Errorf("remaining lease after a nested Unlock = %v, want the hold's lease kept (up to a minute)", in.Remain)
		}
		if n, err := client.Do(ctx, client.B().Exists().Key(wake).Build()).AsInt64(); err != nil || n != 0 {
			t.Errorf("EXISTS %s (the wake-up channel's name) after an Unlock = %d, %v; want 0 (no key written)", wake, n, err)
		}
	}
}

// TestScriptUnlockOfSameTokenOtherOwnerIsLost: an Unlock whose token is
// the current hold's but whose owner is not (the record expired and was
// made again, its new token from a clock that had gone back, as after a
// failover to a replica whose clock is behind) did not release anything:
// it is told the hold was lost (-1), and the other owner keeps the lock.
// An Unlock of the same token once the hold is gone (the retry of one
// that released) is told 0. A mutant of mutex_release that judged a
// token equal to the current one by the run alone ("mine <= last") told
// the first Unlock 0, a release that never happened; the tests had the
// equal token only on a free record.
func TestScriptUnlockOfSameTokenOtherOwnerIsLost(t *testing.T) {
	r := newReviewRig(t, "unlock-same-token:"+strconv.Itoa(rand.IntN(1e9)))
	a := r.takeL("A", "a.1", "", "30000")
	if a[0] != 1 {
		t.Fatalf("A's lock = %v, want granted", a)
	}
	f := strconv.FormatInt(a[2], 10)
	// A's record expires; B's acquisition makes it again with A's token.
	r.do("SET", r.keys.lock[0], "L:"+f+":"+f+"|1:b.1:B", "PX", "30000")
	if n := r.unlock("A", a[2]); n != -1 {
		t.Errorf("A's Unlock while B holds with A's token = %d, want -1 (A's hold was lost)", n)
	}
	if o := r.field("o"); o != "B" {
		t.Fatalf("the lock is held by %q after A's Unlock, want B", o)
	}
	if n := r.unlock("B", a[2]); n != 0 {
		t.Fatalf("B's Unlock = %d, want 0", n)
	}
	if n := r.unlock("B", a[2]); n != 0 {
		t.Errorf("B's retried Unlock = %d, want 0 (its first try released)", n)
	}
}

// TestScriptRWGrantKeepsOtherWritersMark: a writer that waited gets the
// lock and withdraws its own mark with the grant; the mark of another
// writer still waiting stays the readers' wait (q), so that once this
// hold ends, that writer still goes before new readers. A mutant of
// rwmutex_lock that read the marks set's range wrongly there (ZRANGE
// -1 -2: nothing) dropped q with the grant: after the Unlock, readers got
// in ahead of the waiting writer. The grant tests had one waiting writer.
func TestScriptRWGrantKeepsOtherWritersMark(t *testing.T) {
	r := newRWScriptRig(t, "rw-grant-mark:")
	client := redistest.Client(t, redistest.Single(t).Addr())
	q := func() int64 {
		t.Helper()
		v, err := client.Do(r.ctx, client.B().Hget().Key(r.lockKeys[0]).Field("q").Build()).AsInt64()
		if err != nil && !rueidis.IsRedisNil(err) {
			t.Fatal(err)
		}
		return v
	}
	h := r.take("H", "h.1", "0", "")
	if h[0] != 1 {
		t.Fatalf("H's lock = %v, want granted", h)
	}
	if x := r.take("X", "x.1", "20000", "mx.1"); x[0] != 0 {
		t.Fatalf("X's lock while H holds = %v, want refused", x)
	}
	qx := q()
	if w := r.take("W", "w.1", "30000", "mw.1"); w[0] != 0 {
		t.Fatalf("W's lock while H holds = %v, want refused", w)
	}
	if v := q(); v <= qx {
		t.Fatalf("q = %d after W's longer mark, want past X's end %d", v, qx)
	}
	if n := r.release("H", h[2]); n != 0 {
		t.Fatalf("H's unlock = %d", n)
	}
	w := r.take("W", "w.2", "30000", "mw.1")
	if w[0] != 1 {
		t.Fatalf("W's lock after H's release = %v, want granted", w)
	}
	if v := q(); v != qx {
		t.Errorf("q = %d after W's grant withdrew its mark, want X's end %d (X still waits)", v, qx)
	}
	if n := r.release("W", w[2]); n != 0 {
		t.Fatalf("W's unlock = %d", n)
	}
	if rd := r.rtake("R", "r.1"); rd[0] != 0 {
		t.Errorf("a reader after W's Unlock while X's mark runs = %v, want refused", rd)
	}
	if x := r.take("X", "x.2", "20000", "mx.1"); x[0] != 1 {
		t.Errorf("X's lock after W's Unlock = %v, want granted", x)
	}
}

// TestScriptRWRunForgetsOldestEnding: the run (c) of a read-write lock
// lists at most 16 write holds that ended otherwise than by their Unlock;
// a 17th pushes the oldest out and the run starts after it, so the holds
// before it are told lost (-1) by a retried Unlock, never released (0).
// U's hold is released by its Unlock; then owner A's outermost Locks
// supersede each other (each lists the one before), 16 or 17 times; A's
// last hold is released. With 16 listed, U's retried Unlock is still in
// the run (0); with 17, it is forgotten (-1); every superseded hold of A
// is -1 either way. A mutant of rwmutex_lock that wrote the new start
// over the second entry (c[2] for c[1]) kept the old start and dropped a
// listed token: U's and A's first two Unlocks were told 0, releases that
// never happened. TestScriptRWRunKeepsUnlockedHoldsAfterExpiry listed one
// ending, never 17.
func TestScriptRWRunForgetsOldestEnding(t *testing.T) {
	for _, listed := range []int{16, 17} {
		t.Run(strconv.Itoa(listed)+" listed", func(t *testing.T) {
			r := newRWScriptRig(t, "rw-run-limit:")
			u := r.take("U", "u.1", "0", "")
			if u[0] != 1 {
				t.Fatalf("U's lock = %v, want granted", u)
			}
			if n := r.release("U", u[2]); n != 0 {
				t.Fatalf("U's unlock = %d", n)
			}
			var tokens []int64
			for i := range listed + 1 {
				w := r.take("A", "n"+strconv.Itoa(i)+".1", "0", "")
				if w[0] != 1 {
					t.Fatalf("A's outermost lock %d = %v, want granted (superseding its earlier hold)", i, w)
				}
				tokens = append(tokens, w[2])
			}
			last := tokens[listed]
			if n := r.release("A", last); n != 0 {
				t.Fatalf("Unlock of A's current hold = %d, want 0", n)
			}
			want := int64(0)
			if listed > 16 {
				want = -1
			}
			if n := r.release("U", u[2]); n != want {
				t.Errorf("U's retried Unlock with %d holds listed after it = %d, want %d", listed, n, want)
			}
			for i, tok := range tokens[:listed] {
				if n := r.release("A", tok); n != -1 {
					t.Errorf("Unlock of A's superseded hold %d = %d, want -1 (it ended without an Unlock)", i, n)
				}
			}
			if n := r.release("A", last); n != 0 {
				t.Errorf("retried Unlock of A's released hold = %d, want 0", n)
			}
		})
	}
}

// TestScriptRWRUnlockAfterLeaseIsLost: an RUnlock of a read hold whose
// lease ran out is told the hold was lost (-1), whether or not the
// expired member is still in the readers' set, and the member goes; one
// whose hold lives releases (0), and so does its retry. A mutant of
// rwmutex_runlock that answered 0 for the expired member (still listed)
// told the caller its read hold had lasted to its release, and no test
// released a read hold after its lease.
func TestScriptRWRUnlockAfterLeaseIsLost(t *testing.T) {
	r := newRWScriptRig(t, "rw-runlock-expired:")
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc, err := scriptcache.New(r.ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	runlock, err := sc.Script("rwmutex_runlock")
	if err != nil {
		t.Fatal(err)
	}
	readers := r.lockKeys[1]
	keys := []string{readers, r.unlockKeys[2]}
	runlockOf := func(id string) int64 {
		t.Helper()
		n, err := runlock.Exec(r.ctx, keys, []string{id, "p", "1000"}).AsInt64()
		if err != nil {
			t.Fatalf("runlock %s: %v", id, err)
		}
		return n
	}
	rtakeLease := func(attempt, leaseMs string) {
		t.Helper()
		vs, err := r.rlock.Exec(r.ctx, r.rlockKeys, []string{"R", leaseMs, "0", attempt, ""}).AsIntSlice()
		if err != nil || len(vs) != 3 || vs[0] != 1 {
			t.Fatalf("rlock %s = %v, %v; want granted", attempt, vs, err)
		}
	}
	rtakeLease("r.1", "50")
	rtakeLease("r.2", "30000")
	waitRedis(t, "r.1's lease to run out", func() bool {
		end, err := client.Do(r.ctx, client.B().Zscore().Key(readers).Member("r.1").Build()).AsInt64()
		if err != nil {
			t.Fatalf("r.1's member: %v", err)
		}
		now, err := client.Do(r.ctx, client.B().Time().Build()).AsIntSlice()
		if err != nil || len(now) != 2 {
			t.Fatalf("TIME: %v, %v", now, err)
		}
		return end < now[0]*1000+now[1]/1000
	})
	if n := runlockOf("r.1"); n != -1 {
		t.Errorf("RUnlock of a read hold whose lease ran out = %d, want -1", n)
	}
	if err := client.Do(r.ctx, client.B().Zscore().Key(readers).Member("r.1").Build()).Error(); !rueidis.IsRedisNil(err) {
		t.Errorf("the expired member after its RUnlock: %v, want gone", err)
	}
	if n := runlockOf("r.1"); n != -1 {
		t.Errorf("second RUnlock of the expired read hold = %d, want -1", n)
	}
	if n := runlockOf("r.2"); n != 0 {
		t.Errorf("RUnlock of a live read hold = %d, want 0", n)
	}
	if n := runlockOf("r.2"); n != 0 {
		t.Errorf("retried RUnlock of the released read hold = %d, want 0", n)
	}
}

// slowGrantClient is a scriptcache.Client whose script calls for which
// delay says so wait that long before they are sent (a slow network), and
// whose calls for which fail says so fail without being sent (the server
// out of reach).
type slowGrantClient struct {
	scriptcache.Client
	mu    sync.Mutex
	delay func(keys, args []string) time.Duration
	fail  func(keys, args []string) bool
}

var errUnreachable = errors.New("test: server out of reach")

func (c *slowGrantClient) Eval(ctx context.Context, sha, body string, keys, args []string) scriptcache.Reply {
	c.mu.Lock()
	delay, fail := c.delay, c.fail
	c.mu.Unlock()
	if fail != nil && fail(keys, args) {
		return scriptcache.ErrorReply(errUnreachable)
	}
	if delay != nil {
		if d := delay(keys, args); d > 0 {
			time.Sleep(d)
		}
	}
	return c.Client.Eval(ctx, sha, body, keys, args)
}

// TestRWReadAfterLostWriteHoldLeftOnServer: after this RWMutex lost its
// write hold, and its Unlock could not give the hold back, the hold still
// runs on the server until its lease ends there. An RLock of the same
// value is then a reader like any other: it is refused until that lease
// ends, and not let through as the writer's own read (which only a write
// hold this value holds now may do). A mutant of RWMutex.attempt that sent
// the token of the last write hold, held or not (rw.w.holds >= 0 for
// > 0), let it in.
//
// The fixed lease of 3 s ends on the client 3 s after the Lock was sent,
// and on the server 3 s after the call reached it, which a 1.5 s delay
// puts 1.5 s later: the read attempt comes in between. The test judges
// only an attempt that ended before the server's lease did.
func TestRWReadAfterLostWriteHoldLeftOnServer(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	c := &slowGrantClient{}
	l := wrappedLocker(t, []string{srv.Addr()}, mutex.Options{}, func(sc scriptcache.Client) scriptcache.Client {
		c.Client = sc
		return c
	})
	name := "rw-read-after-lost:" + strconv.Itoa(rand.IntN(1e9))
	rw := newRW(t, l, name, mutex.WithLease(3*time.Second))
	owner := rw.Owner()
	c.mu.Lock()
	c.delay = func(keys, args []string) time.Duration {
		if len(args) == 7 && args[0] == owner && args[2] == "0" { // the outermost Lock
			return 1500 * time.Millisecond
		}
		return 0
	}
	c.mu.Unlock()
	if err := rw.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rw.Lost():
	case <-time.After(signal):
		t.Fatal("the fixed lease did not end on the client")
	}
	c.mu.Lock()
	c.delay = nil
	c.fail = func(keys, args []string) bool { return isRWUnlockOf(owner, keys, args) }
	c.mu.Unlock()
	if err := rw.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Fatalf("Unlock after the loss = %v, want ErrNotHeld", err)
	}
	// The give-back failed: the hold is still on the server.
	client := redistest.Client(t, srv.Addr())
	h, err := client.Do(ctx, client.B().Hmget().Key(rwKey(name, "h")).Field("o", "e").Build()).AsStrSlice()
	if err != nil || len(h) != 2 || h[0] != owner {
		t.Fatalf("the write hold on the server after the failed give-back = %q, %v; want held by %s", h, err, owner)
	}
	end, _ := strconv.ParseInt(h[1], 10, 64)
	serverNow := func() int64 {
		t.Helper()
		now, err := client.Do(ctx, client.B().Time().Build()).AsIntSlice()
		if err != nil || len(now) != 2 {
			t.Fatalf("TIME: %v, %v", now, err)
		}
		return now[0]*1000 + now[1]/1000
	}
	err = rw.TryRLock(ctx)
	if now := serverNow(); now < end {
		if !errors.Is(err, mutex.ErrNotObtained) {
			t.Fatalf("TryRLock while this value's lost write hold still runs on the server (%d ms more) = %v, want ErrNotObtained", end-now, err)
		}
	} else {
		t.Logf("the server's lease ended before the read attempt did (slow machine): TryRLock = %v, not judged", err)
		if err == nil {
			if err := rw.RUnlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Once the lease ends on the server, the reader gets in.
	rctx, cancel := context.WithTimeout(ctx, signal)
	defer cancel()
	if err := rw.RLock(rctx); err != nil {
		t.Fatalf("RLock after the lost hold's lease = %v, want granted", err)
	}
	if now := serverNow(); now < end {
		t.Errorf("RLock granted %d ms before the lost write hold's lease ended on the server", end-now)
	}
	if err := rw.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
}
