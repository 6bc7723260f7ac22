package semaphore_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
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

// script returns the script called name, to run by hand on e's client.
func script(t *testing.T, e *env, name string) *scriptcache.Script {
	t.Helper()
	sc, err := scriptcache.New(context.Background(), e.client)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sc.Script(name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitExpiredOnServer waits until permit id of name is past its expiry by
// the server's clock (the client's lease ends a margin earlier), still
// listed: nothing has reclaimed it.
func waitExpiredOnServer(t *testing.T, e *env, name, id string) {
	t.Helper()
	ctx := context.Background()
	if !redistest.WaitFor(ctx, signalWait, func() bool {
		score, err := e.client.Do(ctx, e.client.B().Zscore().Key(e.key(name, ":e")).Member(id).Build()).AsFloat64()
		if err != nil {
			t.Fatalf("permit %s is not listed: %v", id, err)
		}
		return int64(score) < serverMs(t, e)
	}) {
		t.Fatalf("permit %s did not expire on the server", id)
	}
}

// TestExpiredPermitsFreeTheCallersCapacity: the capacity callers bring is
// fixed only while a permit is held; once every permit listed has expired
// (its holder died) and the keys live on (another permit's lease, since
// released, set their expiry), a caller with another capacity is not refused with
// ErrCapacityMismatch: the call reclaims them and the caller's capacity
// applies. A mutant of semaphore_queue's quick-grant check (stored ~= c
// made ==) let a fair caller of another capacity skip the reclaim, and it
// was refused, as if the dead holder still held.
func TestExpiredPermitsFreeTheCallersCapacity(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(map[bool]string{false: "unfair", true: "fair"}[fair], func(t *testing.T) {
			ctx := context.Background()
			addr := redistest.Single(t).Addr()
			short := newEnv(t, []string{addr}, semaphore.Options{Fair: fair, Lease: 100 * time.Millisecond})
			long := newEnv(t, []string{addr}, semaphore.Options{Fair: fair, Lease: time.Minute})
			name := uniqueName(t)
			// The other permit's lease keeps the keys (so the expired one
			// listed) after its release.
			dead := acquire(t, short.sem(t, name, 2), 1)
			release(t, acquire(t, long.sem(t, name, 2), 1))
			waitExpiredOnServer(t, long, name, dead.ID())
			p, err := long.sem(t, name, 3).TryAcquire(ctx, 1)
			if err != nil {
				t.Fatalf("TryAcquire with capacity 3 after the only permit (capacity 1) expired = %v, want a permit", err)
			}
			wantAvailable(t, long.sem(t, name, 3), 2)
			release(t, p)
		})
	}
}

// TestGrantThatFitsLeavesExpiredPermits: a grant that fits as things are,
// with nobody queued, is the common path, and both acquire scripts keep it
// lean by design: it does not look for expired permits (they are counted
// until a call they are in the way of reclaims them), so it costs no
// ZRANGEBYSCORE nor removals. The expired permit is still listed after
// such a grant. Mutants of semaphore_queue's quick-grant check (ARGV[3],
// n, for the caller's capacity; stored ~= c made ==) sent every fair grant
// with a permit held through the reclaim, and no test looked.
func TestGrantThatFitsLeavesExpiredPermits(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(map[bool]string{false: "unfair", true: "fair"}[fair], func(t *testing.T) {
			ctx := context.Background()
			addr := redistest.Single(t).Addr()
			short := newEnv(t, []string{addr}, semaphore.Options{Fair: fair, Lease: 100 * time.Millisecond})
			long := newEnv(t, []string{addr}, semaphore.Options{Fair: fair, Lease: time.Minute})
			name := uniqueName(t)
			dead := acquire(t, short.sem(t, name, 3), 1)
			other := acquire(t, long.sem(t, name, 3), 1) // its lease keeps the keys
			waitExpiredOnServer(t, long, name, dead.ID())
			p, err := long.sem(t, name, 3).TryAcquire(ctx, 1)
			if err != nil {
				t.Fatalf("TryAcquire(1) with 2 of 3 used = %v, want a permit", err)
			}
			if err := long.client.Do(ctx, long.client.B().Zscore().Key(long.key(name, ":e")).Member(dead.ID()).Build()).Error(); err != nil {
				t.Errorf("the expired permit after a grant that fit: %v, want it still listed (the grant reclaims nothing)", err)
			}
			release(t, p)
			release(t, other)
		})
	}
}

// TestSetCapacityKeptAfterExpiredPermitsReclaimed: a call that reclaims
// the last permits, all expired, deletes the semaphore's keys but keeps a
// set capacity (':cap' and ':set'), so the set capacity still applies to
// callers that bring another one, for CapacityRetention. A mutant of
// semaphore_acquire that wrote the retention under another field (':w')
// kept ':cap' but lost ':set'; the reclaiming call itself still answered
// the set capacity, so TestSetCapacityExpiredPermitsReclaimed passed.
func TestSetCapacityKeptAfterExpiredPermitsReclaimed(t *testing.T) {
	ctx := context.Background()
	addr := redistest.Single(t).Addr()
	short := newEnv(t, []string{addr}, semaphore.Options{Lease: 100 * time.Millisecond})
	long := newEnv(t, []string{addr}, semaphore.Options{Lease: time.Minute})
	name := uniqueName(t)
	s := short.sem(t, name, 2)
	if err := s.SetCapacity(ctx, 3); err != nil {
		t.Fatal(err)
	}
	dead := acquire(t, s, 2)
	waitExpiredOnServer(t, short, name, dead.ID())
	wantAvailable(t, s, 3) // reclaims the expired permit, the last one
	one := long.sem(t, name, 1)
	wantAvailable(t, one, 3)
	var held []*semaphore.Permit
	for i := range 3 {
		p, err := one.TryAcquire(ctx, 1)
		if err != nil {
			t.Fatalf("TryAcquire %d of 3 under the set capacity 3 = %v, want a permit", i+1, err)
		}
		held = append(held, p)
	}
	for _, p := range held {
		release(t, p)
	}
}

// TestKeysExpireSoonAfterPermit: a grant makes both keys of the semaphore
// expire no earlier than the permit and at most 1 + lease/16 ms after it
// (semaphore_acquire's layout), so that nothing outlives the permits for
// long and the grants of the next moments need not move the expiry. A
// mutant that added 2 ms instead of 1 survived: no test read the keys'
// expiry against the permit's.
func TestKeysExpireSoonAfterPermit(t *testing.T) {
	const leaseDur = 16 * time.Second
	ctx := context.Background()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{Lease: leaseDur})
	name := uniqueName(t)
	p := acquire(t, e.sem(t, name, 3), 1)
	expiry := permitExpiry(t, e, name)
	most := expiry + 1 + leaseDur.Milliseconds()/16
	for _, suffix := range []string{"", ":e"} {
		at, err := e.client.Do(ctx, e.client.B().Pexpiretime().Key(e.key(name, suffix)).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if at < expiry || at > most {
			t.Errorf("key %q expires at %d, want in [%d, %d]: from the permit's expiry to 1 + lease/16 ms after it", suffix, at, expiry, most)
		}
	}
	release(t, p)
}

// TestQueueRefreshCountsPermitWeight: the batched refresh of fair waiters
// asks a waiter for its own call (2) when a grant pass would grant its
// semaphore's head now. The weight in use for that is the permits listed
// plus ':h', their weight beyond one each: with a permit of 4 of 5 held,
// a head of 2 does not fit, and the refresh answers 1 (nothing to do). A
// mutant that read ':h' from a field the HMGET never asked for counted the
// permit as 1, and sent the waiter a needless call every refresh round,
// which nothing measured.
func TestQueueRefreshCountsPermitWeight(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), signalWait)
	defer cancel()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{Fair: true, Lease: time.Minute})
	name := uniqueName(t)
	s := e.sem(t, name, 5)
	holder := acquire(t, s, 4)
	waiting := acquireAsync(ctx, s, 2)
	e.waitQueued(t, name, 1)
	refresh := script(t, e, "semaphore_queue_refresh")
	head := e.queued(t, name)[0]
	keys := []string{e.key(name, ""), e.key(name, ":e"), e.key(name, ":q"), e.key(name, ":qe")}
	got, err := refresh.Exec(ctx, keys, []string{"60000", "1", head, "2"}).AsIntSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != 1 {
		t.Errorf("refresh of a head of 2 with 4 of 5 held = %v, want [1] (it does not fit: nothing to do)", got)
	}
	release(t, holder)
	r := <-waiting
	if r.err != nil {
		t.Fatalf("the waiter's Acquire after the release = %v", r.err)
	}
	release(t, r.p)
}

// TestFairPassLooksAt32Waiters: the grant pass of a fair semaphore looks
// at the first 32 entries of the queue at most, so a call's work is
// bounded however long the queue: a release that frees 40 permits with 40
// waiters of one queued grants the first 32, in arrival order, leaves the
// other 8 queued and publishes the 8 still free as a budget for them. It
// reads the queue once (one ZRANGE, one HMGET) when that read covers the
// 32. A mutant that checked the bound at 33 read the queue again past
// the 32nd entry (an empty range, as the read's end is the 32nd), a call
// more on every long pass, and no test counted the reads. The script is
// run by hand, on a server of its own, so that nothing else (waiters
// woken) runs commands meanwhile.
func TestFairPassLooksAt32Waiters(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	e := newEnv(t, []string{srv.Addr()}, semaphore.Options{Fair: true})
	name := uniqueName(t)
	queue := script(t, e, "semaphore_queue")
	keys := []string{e.key(name, ""), e.key(name, ":e"), e.key(name, ":w"), e.key(name, ":q"), e.key(name, ":qe")}
	call := func(mode, n, id string) []int64 {
		t.Helper()
		r, err := queue.Exec(ctx, keys, []string{mode, "40", n, id, "60000", "p"}).AsIntSlice()
		if err != nil {
			t.Fatalf("semaphore_queue %s %s %s: %v", mode, n, id, err)
		}
		return r
	}
	if r := call("a", "40", "holder"); r[0] != 1 {
		t.Fatalf("the holder's Acquire of 40 = %v, want granted", r)
	}
	var waiters []string
	for i := range 40 {
		id := "w" + strconv.Itoa(i)
		if r := call("a", "1", id); r[0] != 0 {
			t.Fatalf("waiter %s's Acquire with all 40 held = %v, want queued", id, r)
		}
		waiters = append(waiters, id)
	}
	before := commandCalls(t, srv)
	if r := call("r", "", "holder"); r[0] != 1 || r[1] != 32 {
		t.Fatalf("the holder's release = %v, want {1, 32}: held, and 32 granted", r)
	}
	after := commandCalls(t, srv)
	for _, c := range []struct {
		cmd  string
		want int64
	}{{"zrange", 1}, {"hmget", 2}, {"publish", 33}} { // hmget: the state hash's, and the entries'
		if got := after[c.cmd] - before[c.cmd]; got != c.want {
			t.Errorf("%s calls of the release = %d, want %d", c.cmd, got, c.want)
		}
	}
	if got := e.queued(t, name); !slices.Equal(got, waiters[32:]) {
		t.Errorf("queued after the release: %q, want the last 8 %q", got, waiters[32:])
	}
	for _, id := range waiters[:32] {
		if err := e.client.Do(ctx, e.client.B().Zscore().Key(e.key(name, ":e")).Member(id).Build()).Error(); err != nil {
			t.Fatalf("waiter %s among the first 32 holds no permit: %v", id, err)
		}
	}
}

// TestReclaimTakes16ExpiredAtMost: a call that reclaims expired permits
// takes 16 at most (bounded work), the oldest first, and says with a wait
// of 0 that more remain; a call of weight 0 (Available) has no permit of
// its own to look up. With 17 expired and one live, one such call leaves
// the 17th listed. A mutant of semaphore_acquire that reclaimed a 17th
// was told from the original by no test; the count of ZSCORE calls is
// for one that would look up the id of a call of weight 0 (n > 0 made
// n >= 0: a ZSCORE more on every Available). The script is run by hand,
// on a server of its own, to count its calls.
func TestReclaimTakes16ExpiredAtMost(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	e := newEnv(t, []string{srv.Addr()}, semaphore.Options{})
	name := uniqueName(t)
	acq := script(t, e, "semaphore_acquire")
	keys := []string{e.key(name, ""), e.key(name, ":e"), e.key(name, ":w")}
	call := func(n, id, leaseMs string) scriptcache.Reply {
		return acq.Exec(ctx, keys, []string{"20", n, id, leaseMs, "pt"})
	}
	// The live permit first: its lease keeps the keys.
	if got, err := call("1", "live", "60000").AsInt64(); err != nil || got != 1 {
		t.Fatalf("the live permit = %d, %v; want granted", got, err)
	}
	for i := range 17 {
		if got, err := call("1", "p"+strconv.Itoa(i), "50").AsInt64(); err != nil || got != 1 {
			t.Fatalf("permit %d = %d, %v; want granted", i, got, err)
		}
	}
	waitExpiredOnServer(t, e, name, "p16")
	before := commandCalls(t, srv)
	r, err := call("0", "", "60000").AsIntSlice()
	if err != nil {
		t.Fatal(err)
	}
	if zscore := commandCalls(t, srv)["zscore"] - before["zscore"]; zscore != 0 {
		t.Errorf("a call of weight 0 made %d ZSCORE calls, want none (it has no permit of its own)", zscore)
	}
	if len(r) != 4 || r[0] != 1 || r[1] != 2 || r[3] != 0 {
		t.Errorf("the reclaiming call = %v, want {1, 2 used, 20, wait 0}: 16 reclaimed, one expired left to reclaim", r)
	}
	left, err := e.client.Do(ctx, e.client.B().Zrange().Key(e.key(name, ":e")).Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 {
		t.Errorf("permits left after one reclaiming call: %q, want 2 (the live one and the 17th expired)", left)
	}
}

// TestFairPassReadsPastDeadEntries: the grant pass reads as many entries
// as the permits free could be granted to, plus one, and reads further
// when those do not use the permits up (entries dead, or granted with
// permits to spare): with 2 permits freed and the queue x, d1, d2, w (d1
// and d2 dead), it grants x, drops d1 and d2, and reads on to grant w. A
// mutant of semaphore_queue that stopped after the first read whenever it
// returned as many entries as asked left w queued with a permit free.
func TestFairPassReadsPastDeadEntries(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{Fair: true})
	name := uniqueName(t)
	queue := script(t, e, "semaphore_queue")
	keys := []string{e.key(name, ""), e.key(name, ":e"), e.key(name, ":w"), e.key(name, ":q"), e.key(name, ":qe")}
	call := func(mode, n, id, leaseMs string) []int64 {
		t.Helper()
		r, err := queue.Exec(ctx, keys, []string{mode, "2", n, id, leaseMs, "p"}).AsIntSlice()
		if err != nil {
			t.Fatalf("semaphore_queue %s %s: %v", mode, id, err)
		}
		return r
	}
	if r := call("a", "2", "holder", "60000"); r[0] != 1 {
		t.Fatalf("the holder's Acquire of 2 = %v, want granted", r)
	}
	// x first: its lease keeps the queue keys while d1 and d2 die.
	for _, w := range []struct{ id, lease string }{{"x", "60000"}, {"d1", "50"}, {"d2", "50"}, {"w", "60000"}} {
		if r := call("a", "1", w.id, w.lease); r[0] != 0 {
			t.Fatalf("%s's Acquire with all held = %v, want queued", w.id, r)
		}
	}
	if !redistest.WaitFor(ctx, signalWait, func() bool {
		exp, _, _ := strings.Cut(e.entry(name, "d2"), " ")
		ms, err := strconv.ParseInt(exp, 10, 64)
		return err == nil && ms < serverMs(t, e)
	}) {
		t.Fatal("d2's entry did not die")
	}
	if r := call("r", "", "holder", ""); r[0] != 1 || r[1] != 2 {
		t.Fatalf("the holder's release = %v, want {1, 2}: held, and x and w granted", r)
	}
	for _, id := range []string{"x", "w"} {
		if err := e.client.Do(ctx, e.client.B().Zscore().Key(e.key(name, ":e")).Member(id).Build()).Error(); err != nil {
			t.Errorf("%s holds no permit after the release: %v", id, err)
		}
	}
	if q := e.queued(t, name); len(q) != 0 {
		t.Errorf("queued after the release: %q, want none", q)
	}
}

// TestFairSetCapacityKeepsKeysWhilePermitsHeld: SetCapacity on a fair
// semaphore while a permit is held makes the keys live at least
// CapacityRetention, as it does on an idle one, so the capacity set is not
// lost when the permits' shorter leases end. A mutant of semaphore_queue
// that set no expiry for SetCapacity (and one for every other call)
// left the keys to expire with the permit.
func TestFairSetCapacityKeepsKeysWhilePermitsHeld(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{Fair: true, Lease: time.Minute})
	name := uniqueName(t)
	s := e.sem(t, name, 2)
	p := acquire(t, s, 1)
	if err := s.SetCapacity(ctx, 3); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"", ":e"} {
		ttl, err := e.client.Do(ctx, e.client.B().Pttl().Key(e.key(name, suffix)).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Duration(ttl) * time.Millisecond; d < semaphore.CapacityRetention-time.Minute {
			t.Errorf("key %q expires in %v after SetCapacity with a permit of a 1 min lease held, want at least about %v", suffix, d, semaphore.CapacityRetention)
		}
	}
	release(t, p)
	wantAvailable(t, e.sem(t, name, 2), 3)
}

// TestFairGrantWithNobodyQueuedSkipsQueue: a fair Acquire that fits, with
// nobody queued, is granted without touching the queue: one ZADD (its
// permit), no grant pass (no ZRANGE of the queue, no ZREM). That is the
// common fair grant, and a request that fills the capacity exactly (every
// grant of a semaphore of capacity 1) is one. A mutant of semaphore_queue
// whose check read used + n < stored sent exactly those through the queue
// (join, then a pass that granted them): the same state and reply, at
// about a dozen calls more, and no test counted them. The script is run by
// hand, on a server of its own, to count its calls.
func TestFairGrantWithNobodyQueuedSkipsQueue(t *testing.T) {
	for _, c := range []struct {
		name             string
		capacity, before string // before: the weight held first
	}{
		{"fills exactly", "3", "2"},
		{"room to spare", "4", "2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.NewServer(t)
			e := newEnv(t, []string{srv.Addr()}, semaphore.Options{Fair: true})
			name := uniqueName(t)
			queue := script(t, e, "semaphore_queue")
			keys := []string{e.key(name, ""), e.key(name, ":e"), e.key(name, ":w"), e.key(name, ":q"), e.key(name, ":qe")}
			call := func(n, id string) []int64 {
				t.Helper()
				r, err := queue.Exec(ctx, keys, []string{"a", c.capacity, n, id, "60000", "p"}).AsIntSlice()
				if err != nil || len(r) == 0 || r[0] != 1 {
					t.Fatalf("Acquire of %s for %s = %v, %v; want granted", n, id, r, err)
				}
				return r
			}
			call(c.before, "first")
			before := commandCalls(t, srv)
			call("1", "second")
			after := commandCalls(t, srv)
			for _, w := range []struct {
				cmd  string
				want int64
			}{{"zadd", 1}, {"zrange", 0}, {"zrem", 0}} {
				if got := after[w.cmd] - before[w.cmd]; got != w.want {
					t.Errorf("%s calls of the grant = %d, want %d", w.cmd, got, w.want)
				}
			}
		})
	}
}

// TestReclaimOfLastHeavyPermitKeepsNoWeight: a grant that first reclaims
// the last permit listed, expired and of weight 2, must leave nothing of
// that permit counted: with a capacity of 2, the next caller's permit of 1
// fits beside the new one. The reclaim drops the semaphore's keys (its
// weight and ':h' go with the hash) and the grant writes a new hash. Mutants
// of semaphore_acquire that kept the hash there (no DEL, or a DEL of the
// sorted set twice) left ':h' at 1 under the new permit, and the
// semaphore lost one of its two permits for as long as the hash lived; no
// test reclaimed the last heavy permit in the call that grants.
func TestReclaimOfLastHeavyPermitKeepsNoWeight(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(map[bool]string{false: "unfair", true: "fair"}[fair], func(t *testing.T) {
			ctx := context.Background()
			addr := redistest.Single(t).Addr()
			short := newEnv(t, []string{addr}, semaphore.Options{Fair: fair, Lease: 100 * time.Millisecond})
			long := newEnv(t, []string{addr}, semaphore.Options{Fair: fair, Lease: time.Minute})
			name := uniqueName(t)
			dead := acquire(t, short.sem(t, name, 2), 2)
			// Alone, the dead permit's keys expire a few milliseconds after
			// it, a window a poll for its expiry can miss on a loaded
			// machine. Keep them, as the lease of another permit, since
			// released, would have.
			for _, k := range []string{long.key(name, ""), long.key(name, ":e")} {
				if err := long.client.Do(ctx, long.client.B().Pexpire().Key(k).Milliseconds(time.Minute.Milliseconds()).Build()).Error(); err != nil {
					t.Fatalf("PEXPIRE %s: %v", k, err)
				}
			}
			waitExpiredOnServer(t, long, name, dead.ID())
			s := long.sem(t, name, 2)
			p, err := s.TryAcquire(ctx, 1) // reclaims the dead permit, then grants
			if err != nil {
				t.Fatalf("TryAcquire(1) after the only permit (weight 2) expired = %v, want a permit", err)
			}
			q, err := s.TryAcquire(ctx, 1)
			if err != nil {
				t.Fatalf("TryAcquire(1) with 1 of 2 held = %v, want a permit (the reclaimed permit's weight still counted)", err)
			}
			release(t, q)
			release(t, p)
		})
	}
}

// TestFairCallThatReclaimsAnnouncesBudget: a fair Acquire that reclaims
// an expired permit and leaves permits free publishes the budget (how
// many are free) on the wake-up channel, whatever its own answer: the
// permit's holder died, so no release will wake the Acquires waiting for
// it, and this call may be the only one to see the room. A call that
// reclaims nothing publishes nothing. Each answer's path announces it:
// a caller with another capacity (refused, -1) and one asking for more
// than the capacity (-2). A mutant of semaphore_queue that announced only
// when more than one permit was reclaimed ("freed > 1") left waiters
// asleep after a mismatched call reclaimed one, and no test counted the
// messages of those paths.
func TestFairCallThatReclaimsAnnouncesBudget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity string // the call's capacity (the semaphore's is 2)
		n        string
		status   int64
	}{
		{"capacity mismatch", "3", "1", -1},
		{"more than the capacity", "2", "3", -2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			addr := redistest.Single(t).Addr()
			short := newEnv(t, []string{addr}, semaphore.Options{Fair: true, Lease: 100 * time.Millisecond})
			long := newEnv(t, []string{addr}, semaphore.Options{Fair: true, Lease: time.Minute})
			name := uniqueName(t)
			queue := script(t, long, "semaphore_queue")
			keys := []string{long.key(name, ""), long.key(name, ":e"), long.key(name, ":w"), long.key(name, ":q"), long.key(name, ":qe")}
			heard := listenBudget(t, addr, keys[2])
			call := func(what string, wantMsgs int) {
				t.Helper()
				vs, err := queue.Exec(ctx, keys, []string{"a", tc.capacity, tc.n, "caller.1", "60000", "p"}).AsIntSlice()
				if err != nil || len(vs) != 4 || vs[0] != tc.status {
					t.Fatalf("%s: semaphore_queue = %v, %v; want status %d", what, vs, err, tc.status)
				}
				if got := heard(); len(got) != wantMsgs || (wantMsgs > 0 && got[0] != "1") {
					t.Errorf("%s published %q, want %d budget message(s) of 1 free permit", what, got, wantMsgs)
				}
			}
			other := acquire(t, long.sem(t, name, 2), 1) // its lease keeps the keys
			call("a call that reclaims nothing", 0)
			dead := acquire(t, short.sem(t, name, 2), 1)
			waitExpiredOnServer(t, long, name, dead.ID())
			call("a call that reclaimed one expired permit", 1)
			release(t, other)
		})
	}
}

// TestFairGrantFromQueueAfterReclaimAnnouncesBudget: the join-the-queue
// path of TestFairCallThatReclaimsAnnouncesBudget. A fair Acquire finds a
// queue (its only entry a waiter that died), reclaims an expired permit,
// joins, and the pass grants it with a permit still free: it publishes
// that budget, as no release will come for the dead holder. A mutant of
// semaphore_queue that announced there only when more than one permit
// was reclaimed left waiters of other processes asleep.
func TestFairGrantFromQueueAfterReclaimAnnouncesBudget(t *testing.T) {
	ctx := context.Background()
	addr := redistest.Single(t).Addr()
	short := newEnv(t, []string{addr}, semaphore.Options{Fair: true, Lease: 100 * time.Millisecond})
	long := newEnv(t, []string{addr}, semaphore.Options{Fair: true, Lease: time.Minute})
	name := uniqueName(t)
	queue := script(t, long, "semaphore_queue")
	keys := []string{long.key(name, ""), long.key(name, ":e"), long.key(name, ":w"), long.key(name, ":q"), long.key(name, ":qe")}
	other := acquire(t, long.sem(t, name, 3), 1) // its lease keeps the keys
	dead := acquire(t, short.sem(t, name, 3), 1)
	// A waiter of weight 2 queues (2 of 3 used) with an entry of 50 ms,
	// and dies.
	vs, err := queue.Exec(ctx, keys, []string{"a", "3", "2", "gone.1", "50", "p"}).AsIntSlice()
	if err != nil || len(vs) != 4 || vs[0] != 0 {
		t.Fatalf("the waiter's call = %v, %v; want queued (0)", vs, err)
	}
	// The queue's keys outlive that entry, as the join of a waiter since
	// granted would have made them (each join extends them to its lease).
	for _, k := range keys[3:] {
		if err := long.client.Do(ctx, long.client.B().Pexpire().Key(k).Milliseconds(60000).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	waitExpiredOnServer(t, long, name, dead.ID())
	if !redistest.WaitFor(ctx, signalWait, func() bool {
		e, err := long.client.Do(ctx, long.client.B().Hget().Key(keys[4]).Field("gone.1").Build()).ToString()
		if err != nil {
			t.Fatalf("the waiter's entry: %v", err)
		}
		expiry, err := strconv.ParseInt(strings.Fields(e)[0], 10, 64)
		if err != nil {
			t.Fatalf("entry %q: %v", e, err)
		}
		return expiry < serverMs(t, long)
	}) {
		t.Fatal("the waiter's entry did not expire on the server")
	}
	heard := listenBudget(t, addr, keys[2])
	vs, err = queue.Exec(ctx, keys, []string{"a", "3", "1", "caller.1", "60000", "p"}).AsIntSlice()
	if err != nil || len(vs) != 4 || vs[0] != 1 || vs[1] != 2 {
		t.Fatalf("the caller's call = %v, %v; want granted with 2 of 3 used", vs, err)
	}
	if got := heard(); len(got) != 1 || got[0] != "1" {
		t.Errorf("the grant after reclaiming a permit published %q, want one budget message of 1 free permit", got)
	}
	release(t, other)
}

// listenBudget subscribes to channel and returns a function that reports
// the messages received since its last call. Each call first publishes a
// probe and waits for it: the server delivers a subscriber's messages in
// order, so whatever was published before the call has arrived by then.
func listenBudget(t *testing.T, addr, channel string) func() []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := redistest.Client(t, addr)
	var mu sync.Mutex
	var got []string
	probed := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Receive(ctx, c.B().Subscribe().Channel(channel).Build(), func(m rueidis.PubSubMessage) {
			mu.Lock()
			defer mu.Unlock()
			if n, ok := strings.CutPrefix(m.Message, "probe-"); ok {
				probed, _ = strconv.Atoi(n)
			} else {
				got = append(got, m.Message)
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	n := 0
	probe := func(wait time.Duration) bool {
		n++
		if err := c.Do(ctx, c.B().Publish().Channel(channel).Message("probe-"+strconv.Itoa(n)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		return redistest.WaitFor(ctx, wait, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return probed >= n
		})
	}
	// Until the subscription is confirmed, probes are lost: send one
	// every 20 ms (not every 200, which cost each of the many state cases
	// of the queue scripts 0.2 s and put TestQueueScriptPaths past the
	// mutation runner's time budget).
	if !redistest.WaitFor(ctx, signalWait, func() bool { return probe(20 * time.Millisecond) }) {
		t.Fatal("subscription not confirmed")
	}
	mu.Lock()
	got = nil
	mu.Unlock()
	return func() []string {
		t.Helper()
		if !probe(signalWait) {
			t.Fatal("a probe message did not come back")
		}
		mu.Lock()
		defer mu.Unlock()
		out := got
		got = nil
		return out
	}
}

// countingClient counts the calls of one script (by its SHA-1).
type countingClient struct {
	scriptcache.Client
	sha string
	n   atomic.Int64
}

func (c *countingClient) Eval(ctx context.Context, sha, body string, keys, args []string) scriptcache.Reply {
	if sha == c.sha {
		c.n.Add(1)
	}
	return c.Client.Eval(ctx, sha, body, keys, args)
}

// TestWokenAcquireThatGetsInKeepsItsWakeUp: a release's wake-up of one
// permit wakes one waiting Acquire of the process; if that Acquire gets
// the permit, the wake-up was used, and the other waiter sleeps on until
// the next release wakes it: its calls are the two of its start and the
// one after that release. A mutant of acquireWaiting that passed the used
// wake-up on after a success (Leave for Close) made the other waiter call
// once more for nothing at every such hand-over (issue 32, seed 6); no
// test counted the calls of a waiter that was not woken.
func TestWokenAcquireThatGetsInKeepsItsWakeUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), signalWait)
	defer cancel()
	sc0, err := scriptcache.New(ctx, redistest.Client(t, redistest.Single(t).Addr()))
	if err != nil {
		t.Fatal(err)
	}
	acq, err := sc0.Script("semaphore_acquire")
	if err != nil {
		t.Fatal(err)
	}
	c := &countingClient{Client: sc0.Client(), sha: acq.SHA1()}
	sc, err := scriptcache.NewFrom(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := semaphore.NewManager(sc, semaphore.Options{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgr.Close)
	s, err := mgr.NewSemaphore(uniqueName(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	h, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *semaphore.Permit, 2)
	for range 2 {
		go func() {
			p, err := s.Acquire(ctx, 1)
			if err != nil {
				t.Errorf("waiting Acquire: %v", err)
			}
			got <- p
		}()
	}
	// Each waiter calls twice: its first attempt, and one once subscribed.
	if !redistest.WaitFor(ctx, signalWait, func() bool { return c.n.Load() == 5 }) {
		t.Fatalf("%d calls of semaphore_acquire, want 5 (the holder's, two per waiter)", c.n.Load())
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := <-got
	if first == nil {
		t.FailNow()
	}
	// Nothing signals a call that does not come: a spurious wake-up's call
	// would follow at once, so a short look finds it (on the tree, the
	// count stays at 6 however long one looks).
	if redistest.WaitFor(ctx, 300*time.Millisecond, func() bool { return c.n.Load() > 6 }) {
		t.Errorf("%d calls of semaphore_acquire while the first waiter holds, want 6: the other waiter was woken for nothing", c.n.Load())
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-got
	if second == nil {
		t.FailNow()
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.n.Load(); n != 7 {
		t.Errorf("%d calls of semaphore_acquire, want 7: each waiter's two, then one per release's wake-up", n)
	}
}
