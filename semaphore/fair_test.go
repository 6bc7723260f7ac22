package semaphore_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// queued returns the ids queued on a fair semaphore, in queue order.
func (e *env) queued(t testing.TB, name string) []string {
	t.Helper()
	ids, err := e.client.Do(context.Background(), e.client.B().Zrange().Key(keyspace.Key(e.prefix, name, ":q")).Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// key returns the key of semaphore name with suffix ("" for the permits
// hash, ":q" for its queue, ...).
func (e *env) key(name, suffix string) string { return keyspace.Key(e.prefix, name, suffix) }

// entry returns the queue entry ("expiry_ms weight") of waiter id on name,
// or "" if it has none.
func (e *env) entry(name, id string) string {
	v, _ := e.client.Do(context.Background(), e.client.B().Hget().Key(e.key(name, ":qe")).Field(id).Build()).ToString()
	return v
}

// waitQueued waits until n waiters are queued on name.
func (e *env) waitQueued(t testing.TB, name string, n int) {
	t.Helper()
	if !redistest.WaitFor(context.Background(), signalWait, func() bool { return len(e.queued(t, name)) == n }) {
		t.Fatalf("queued %d, want %d", len(e.queued(t, name)), n)
	}
}

// acquireAsync starts Acquire(ctx, n) and returns where its result goes.
func acquireAsync(ctx context.Context, s *semaphore.Semaphore, n int64) <-chan acquired {
	c := make(chan acquired, 1)
	go func() {
		p, err := s.Acquire(ctx, n)
		c <- acquired{p, err}
	}()
	return c
}

type acquired struct {
	p   *semaphore.Permit
	err error
}

// got waits for an acquireAsync result that must be a permit.
func got(t testing.TB, c <-chan acquired, what string) *semaphore.Permit {
	t.Helper()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.p
	case <-time.After(signalWait):
		t.Fatalf("%s: no permit within %v", what, signalWait)
		return nil
	}
}

// TestFairOrderAcrossProcesses: waiters of 4 processes queue on a full fair
// semaphore; they must get their permits exactly in queue order.
func TestFairOrderAcrossProcesses(t *testing.T) {
	const procs, goroutines = 4, 6
	forTargets(t, func(t *testing.T, addrs []string) {
		ctx := context.Background()
		e := newEnv(t, addrs, semaphore.Options{Fair: true})
		name := uniqueName(t)
		order := "{" + name + "}:order"
		s := e.sem(t, name, 1)
		holder := acquire(t, s, 1)
		hs := make([]*helper, procs)
		for i := range hs {
			hs[i] = startHelper(t, "fairwaiter",
				envAddrs+"="+strings.Join(addrs, ","), envName+"="+name, envCapacity+"=1",
				envFair+"=1", envOrder+"="+order, envWaiters+"="+strconv.Itoa(goroutines))
		}
		e.waitQueued(t, name, procs*goroutines)
		want := e.queued(t, name)
		release(t, holder)
		for _, h := range hs {
			h.line(t, "done")
			for h.out.Scan() {
			}
			if err := h.cmd.Wait(); err != nil {
				t.Fatalf("helper process: %v", err)
			}
		}
		got, err := e.client.Do(ctx, e.client.B().Lrange().Key(order).Start(0).Stop(-1).Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		e.client.Do(ctx, e.client.B().Del().Key(order).Build())
		if !slices.Equal(got, want) {
			t.Fatalf("acquisition order differs from queue order:\n got %q\nwant %q", got, want)
		}
		if left := e.keysLeft(t, name); left != 0 {
			t.Fatalf("keys left = %d, want 0", left)
		}
	})
}

// TestFairNoBarging: a holder that releases and tries again at once finds
// the permit already granted to the waiter that was queued, and then queues
// behind it.
func TestFairNoBarging(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{Fair: true})
	name := uniqueName(t)
	s := e.sem(t, name, 1)
	a := acquire(t, s, 1)
	waiting := acquireAsync(ctx, s, 1)
	e.waitQueued(t, name, 1)
	waiter := e.queued(t, name)[0]
	release(t, a)
	if _, err := s.TryAcquire(ctx, 1); !errors.Is(err, semaphore.ErrNotObtained) {
		t.Fatalf("TryAcquire right after Release with a waiter queued = %v, want ErrNotObtained", err)
	}
	if hs, err := s.Holders(ctx); err != nil || len(hs) != 1 || hs[0].ID != waiter {
		t.Fatalf("Holders after Release = %+v, %v; want the waiter %s", hs, err, waiter)
	}
	b := got(t, waiting, "waiter")
	if b.ID() != waiter {
		t.Fatalf("waiter's permit %s, want %s", b.ID(), waiter)
	}
	again := acquireAsync(ctx, s, 1)
	e.waitQueued(t, name, 1)
	release(t, b)
	release(t, got(t, again, "requeued holder"))
	if left := e.keysLeft(t, name); left != 0 {
		t.Fatalf("keys left = %d, want 0", left)
	}
}

// TestFairWaiterLeaves: a queued waiter whose context ends leaves the queue
// at once, so the release goes to the next waiter without a stall (the
// 30 s lease of a grant nobody takes would show).
func TestFairWaiterLeaves(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{Fair: true})
	name := uniqueName(t)
	s := e.sem(t, name, 2)
	holder := acquire(t, s, 2)
	qctx, cancel := context.WithCancel(ctx)
	quitter := acquireAsync(qctx, s, 1)
	e.waitQueued(t, name, 1)
	next := acquireAsync(ctx, s, 2)
	e.waitQueued(t, name, 2)
	cancel()
	if r := <-quitter; !errors.Is(r.err, semaphore.ErrNotObtained) {
		t.Fatalf("cancelled Acquire = %v, %v; want ErrNotObtained", r.p, r.err)
	}
	e.waitQueued(t, name, 1)
	release(t, holder)
	release(t, got(t, next, "the waiter behind the one that left"))
	wantAvailable(t, s, 2)
}

// TestFairDeadWaiterAtHead: a waiter that died at the head of the queue (its
// process gone: nothing refreshes its entry or takes its grant) blocks the
// semaphore no longer than its entry's lease. Redisson's RFairLock stalled
// here (its issues 1104, 2883, 3004, 3730).
func TestFairDeadWaiterAtHead(t *testing.T) {
	ctx := context.Background()
	addr := redistest.Single(t).Addr()
	const leaseDur = time.Second
	opts := semaphore.Options{Fair: true, WatchdogLease: leaseDur}
	e := newEnv(t, []string{addr}, opts)
	name := uniqueName(t)
	s := e.sem(t, name, 1)
	holder := acquire(t, s, 1)

	// The dead waiter's process: its own client and Manager; the client is
	// closed under it, so nothing it sends reaches Redis, as after kill -9.
	deadClient, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := scriptcache.New(ctx, deadClient)
	if err != nil {
		t.Fatal(err)
	}
	deadMgr, err := semaphore.NewManager(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	deadSem, _ := deadMgr.NewSemaphore(name, 1)
	dctx, dcancel := context.WithCancel(ctx)
	dead := acquireAsync(dctx, deadSem, 1)
	e.waitQueued(t, name, 1)
	live := acquireAsync(ctx, s, 1)
	e.waitQueued(t, name, 2)
	deadClient.Close()
	dcancel() // its Acquire gives up, but cannot leave the queue
	<-dead
	deadMgr.Close()

	start := time.Now()
	release(t, holder)
	release(t, got(t, live, "the live waiter behind a dead one"))
	// The dead entry's lease (1 s) bounds the stall; a generous margin for
	// a loaded machine, far below the signal bound.
	if d := time.Since(start); d > 5*leaseDur {
		t.Fatalf("stalled %v behind a dead waiter, want at most about its %v entry lease", d, leaseDur)
	}
}

// TestFairLostGrantMessage: the release's grant message never reaches the
// waiter; the Manager's next refresh of its entry (every second) finds it
// no longer queued and wakes it, and its attempt finds the permit, well
// before the 30 s lease would end (and its own backstop timer of ten).
func TestFairLostGrantMessage(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		ctx := context.Background()
		e := newEnv(t, addrs, semaphore.Options{Fair: true})
		sc, err := scriptcache.New(ctx, e.client)
		if err != nil {
			t.Fatal(err)
		}
		name := uniqueName(t)
		s := e.sem(t, name, 1)
		holder := acquire(t, s, 1)
		waiting := acquireAsync(ctx, s, 1)
		e.waitQueued(t, name, 1)
		waiter := e.queued(t, name)[0]
		// Release as Release would, but publish on a channel nobody listens to.
		queue, err := sc.Script("semaphore_queue")
		if err != nil {
			t.Fatal(err)
		}
		keys := []string{e.key(name, ""), e.key(name, ":e"), e.key(name, ":nowhere"), e.key(name, ":q"), e.key(name, ":qe")}
		vs, err := queue.Exec(ctx, keys, []string{"r", "1", "0", holder.ID(), "0", "p"}).AsIntSlice()
		if err != nil || len(vs) != 2 || vs[0] != 1 {
			t.Fatalf("release = %v, %v; want held", vs, err)
		}
		start := time.Now()
		p := got(t, waiting, "waiter whose grant message was lost")
		if d := time.Since(start); d > signalWait/2 {
			t.Fatalf("found the grant after %v, want about one refresh (1 s)", d)
		}
		if p.ID() != waiter {
			t.Fatalf("permit %s, want the waiter's %s", p.ID(), waiter)
		}
		release(t, p)
		wantAvailable(t, s, 1)
	})
}

// TestFairLighterPassesBlockedHead: a heavy waiter at the head that does not
// fit does not block a lighter one behind it that does (within the bypass
// limit): the light waiter gets its permit while the holder still holds.
// Strict FIFO would keep it waiting until the holder released.
func TestFairLighterPassesBlockedHead(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{Fair: true})
	name := uniqueName(t)
	s := e.sem(t, name, 4)
	holder := acquire(t, s, 2)
	heavy := acquireAsync(ctx, s, 4)
	e.waitQueued(t, name, 1)
	light := got(t, acquireAsync(ctx, s, 1), "light waiter behind a blocked heavy head")
	if len(e.queued(t, name)) != 1 {
		t.Fatalf("queued %q, want only the heavy waiter", e.queued(t, name))
	}
	release(t, light)
	release(t, holder)
	release(t, got(t, heavy, "heavy waiter"))
	wantAvailable(t, s, 4)
}

// TestFairArrivalOrder: waiters that arrive one after another are queued,
// and served, in the order they arrived.
func TestFairArrivalOrder(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{Fair: true})
	name := uniqueName(t)
	s := e.sem(t, name, 1)
	holder := acquire(t, s, 1)
	var arrived []string
	var waiting []<-chan acquired
	for i := range 6 {
		waiting = append(waiting, acquireAsync(ctx, s, 1))
		e.waitQueued(t, name, i+1)
		for _, id := range e.queued(t, name) {
			if !slices.Contains(arrived, id) {
				arrived = append(arrived, id)
			}
		}
	}
	if q := e.queued(t, name); !slices.Equal(q, arrived) {
		t.Fatalf("queue order %q, want arrival order %q", q, arrived)
	}
	release(t, holder)
	for i, c := range waiting {
		p := got(t, c, "waiter "+strconv.Itoa(i))
		if p.ID() != arrived[i] {
			t.Fatalf("permit %d went to %s, want %s", i, p.ID(), arrived[i])
		}
		release(t, p)
	}
}

// TestFairReplicaAcksGrant: a grant a waiter learns of by message is
// confirmed through WAIT like any other when ReplicaAcks is set; without
// replicas it is refused and given back.
func TestFairReplicaAcksGrant(t *testing.T) {
	ctx := context.Background()
	addrs := []string{redistest.Single(t).Addr()}
	e := newEnv(t, addrs, semaphore.Options{Fair: true})
	acks := newEnv(t, addrs, semaphore.Options{Fair: true, ReplicaAcks: 1, ReplicaTimeout: 10 * time.Millisecond})
	name := uniqueName(t)
	s := e.sem(t, name, 1)
	holder := acquire(t, s, 1)
	waiting := acquireAsync(ctx, acks.sem(t, name, 1), 1)
	e.waitQueued(t, name, 1)
	// Release once the waiter is subscribed and has refreshed its entry
	// after that, so the grant reaches it by message (released earlier, its
	// next attempt finds the grant, which is confirmed the same way).
	entry := func() string {
		q := e.queued(t, name)
		if len(q) == 0 {
			return ""
		}
		return e.entry(name, q[0])
	}
	first := entry()
	if !redistest.WaitFor(ctx, signalWait, func() bool {
		subs, _ := e.client.Do(ctx, e.client.B().PubsubNumsub().Channel(e.key(name, ":w")).Build()).AsIntMap()
		return subs[e.key(name, ":w")] > 0 && entry() != first
	}) {
		t.Fatal("the waiter did not subscribe and refresh its entry")
	}
	release(t, holder)
	select {
	case r := <-waiting:
		if !errors.Is(r.err, semaphore.ErrNotReplicated) {
			t.Fatalf("Acquire granted by message without replicas: permit %t, err %v; want ErrNotReplicated", r.p != nil, r.err)
		}
	case <-time.After(signalWait):
		t.Fatal("Acquire did not return")
	}
	wantAvailable(t, s, 1)
}
