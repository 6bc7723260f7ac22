package mutex_test

// Tests of what mutex_release promises, as a class (issue 32): its header
// and body read line by line, each behaviour asserted both ways, what must
// be refused and what must be allowed, mostly through the Mutex API
// against a real server. Where the API cannot reach a state in order (a
// clock behind the last token, a tombstone or a dead queue entry left by
// another process), the keys are set up by hand before the API runs; the
// two tests that call the script itself say so in their names
// (TestScriptReleaseClass...) and are kept few, as the script's ARGV may
// change.
//
// The behaviours, and where each is asserted:
//   - a retried final Unlock (reply lost) is told it released however
//     many holds began and ended since, as long as at most 16 of them
//     ended otherwise (forced); past that, and for every hold that ended
//     otherwise, the Unlock is told it lost the lock, and nothing it did
//     not hold is released (RetryAcrossForcedHolds);
//   - the same owner id taking the lock again (WithOwner after a restart)
//     is not released by the earlier Mutex's Unlock, retried or nested
//     (RetryAfterSameOwnerReacquired); an Unlock after the record was lost
//     (expired) is told so and changes nothing, whether the record is gone,
//     made again with lower tokens, or made again with its very token by
//     another owner (UnlockAfterRecordLost); a nested Unlock counts down
//     one, once, also when retried (NestedUnlockRetriedCountsOnce);
//   - a fair release hands the lock over with a token one past the last
//     when the clock is behind it, else from the server's clock, tells the
//     waiter with "g <attempt> <token>" and nothing else, takes the
//     waiter's entry out of both queue keys and keeps q; the waiter's
//     release then clears q (HandOffTokenAndQueueKeys); ForceUnlock's
//     hand-off reports a hold released (ForceHandsOff);
//   - wake-ups: an Unlock publishes only if a Lock was refused (w) or the
//     queue was flagged (then it drops the dead entries and clears q);
//     ForceUnlock of a held lock always publishes, of a free one it
//     changes nothing (Wakeups); PUBLISH in lower case, SPUBLISH in upper
//     case, for every mode (ScriptReleaseClassPublishKind);
//   - give-back: a malformed attempt id is refused and changes nothing;
//     with no record it leaves the tombstone only; the tombstone names the
//     attempt and lives for its lifetime, never cut shorter by a later
//     give-back and whatever the queue keys' expiry; the attempt's queue
//     entry leaves both keys, other entries stay; a hold a later attempt of
//     the same owner made is left alone; the record flags the tombstone,
//     also when the give-back releases the attempt's own hold, which it
//     lists as ended otherwise (ScriptReleaseClassGiveBack, which also
//     checks that ForceUnlock of a free lock answers 0 and writes nothing).

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
)

// className returns a lock name unique in the shared server.
func className(prefix string) string { return prefix + ":" + strconv.Itoa(rand.IntN(1e9)) }

// serverMicros returns the server's TIME in microseconds.
func serverMicros(t *testing.T, client rueidis.Client) int64 {
	t.Helper()
	tm, err := client.Do(context.Background(), client.B().Time().Build()).AsStrSlice()
	if err != nil || len(tm) != 2 {
		t.Fatalf("TIME = %v, %v", tm, err)
	}
	s, _ := strconv.ParseInt(tm[0], 10, 64)
	us, _ := strconv.ParseInt(tm[1], 10, 64)
	return s*1_000_000 + us
}

// seedAhead makes name's record a free one whose last token is far ahead
// of the server's clock (as after a failover to a server whose clock is
// behind) and returns that token: every acquisition then takes the last
// token plus one, so a test knows each token in advance.
func seedAhead(t *testing.T, client rueidis.Client, name string) int64 {
	t.Helper()
	f := serverMicros(t, client) + 1_000_000_000_000 // about 11 days ahead
	fs := strconv.FormatInt(f, 10)
	if err := client.Do(context.Background(), client.B().Set().Key(lockKey(name)).Value("L:"+fs+":"+fs+"|").Px(time.Minute).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	return f
}

// loseNextUnlock makes the next Unlock of owner through hc run, with its
// reply lost.
func loseNextUnlock(hc *hookClient, owner string) {
	var once sync.Once
	hc.set(func(_ context.Context, keys, args []string) bool {
		lose := false
		if isUnlockOf(owner, keys, args) {
			once.Do(func() { lose = true })
		}
		return lose
	}, nil)
}

// unlockLost runs m's Unlock with its reply lost: the release ran, and m
// still counts the hold.
func unlockLost(t *testing.T, hc *hookClient, m *mutex.Mutex) {
	t.Helper()
	loseNextUnlock(hc, m.Owner())
	defer hc.set(nil, nil)
	if err := m.Unlock(context.Background()); !errors.Is(err, errReplyLost) {
		t.Fatalf("Unlock whose reply is lost = %v, want the connection error", err)
	}
}

// lockWithin locks m, giving up after signal: a release that went wrong
// leaves the lock held, and the test then fails instead of waiting out a
// lease.
func lockWithin(m *mutex.Mutex) error {
	ctx, cancel := context.WithTimeout(context.Background(), signal)
	defer cancel()
	return m.Lock(ctx)
}

// wantNotHeld checks that err is an Unlock's answer to a hold that was
// lost: ErrNotHeld, with the loss recorded.
func wantNotHeld(t *testing.T, what string, m *mutex.Mutex, err error) {
	t.Helper()
	if !errors.Is(err, mutex.ErrNotHeld) || !errors.Is(m.Err(), mutex.ErrLost) {
		t.Errorf("%s = %v (Err %v), want ErrNotHeld and the loss", what, err, m.Err())
	}
}

// wantFree checks that nobody holds name.
func wantFree(t *testing.T, m *mutex.Mutex, what string) {
	t.Helper()
	in, err := m.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if in.Held {
		t.Errorf("%s: the lock is held by %q (token %d), want free", what, in.Owner, in.Token)
	}
}

// wantHolder checks that m holds its lock in Redis with holds holds and its
// own token.
func wantHolder(t *testing.T, m *mutex.Mutex, holds int64, what string) {
	t.Helper()
	in, err := m.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !in.Held || in.Owner != m.Owner() || in.Token != m.Token() || in.Holds != holds {
		t.Errorf("%s: Info = %+v, want held by %q with token %d and %d holds", what, in, m.Owner(), m.Token(), holds)
	}
}

// TestReleaseClassRetryAcrossForcedHolds: the run of a record (c) answers
// a retried final Unlock. With the clock behind the last token, every
// token is the one before plus one, so the test knows where the run starts
// and which tokens it lists. a0's release (reply lost) retried at once is
// told it released. a1 and a2 release (replies lost), then 17
// holds are forced, with h's hold (released, reply lost) after the first.
// After 16 forced holds a1's retry is still told it released; the 17th
// pushes the first forced one out of the list and the run then starts
// right after it, at h's token: a2's retry is told it lost the lock, h's
// that it released. Every forced holder's Unlock (the first, one in the
// middle of the list, the last) is told it lost the lock, and no Unlock
// takes anything from anyone.
func TestReleaseClassRetryAcrossForcedHolds(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	// No renewal runs during the test: the forced holders learn of their
	// loss at Unlock.
	opts := mutex.Options{WatchdogLease: 5 * time.Minute}
	l, hc := hookedLocker(t, srv.Addr(), opts)
	name := className("class-forced")
	last := seedAhead(t, client, name)
	forcer := newMutex(t, l, name)

	take := func(what string) *mutex.Mutex {
		t.Helper()
		m := newMutex(t, l, name)
		if err := m.TryLock(ctx); err != nil {
			t.Fatal(err)
		}
		last++
		if m.Token() != last {
			t.Fatalf("%s's token = %d, want %d (one past the last)", what, m.Token(), last)
		}
		return m
	}
	force := func(what string) {
		t.Helper()
		if ok, err := forcer.ForceUnlock(ctx); err != nil || !ok {
			t.Fatalf("ForceUnlock of %s = %v, %v; want true", what, ok, err)
		}
	}

	// The last hold, released, its reply lost: retried at once, on the
	// free record that still names its token, it is told it released.
	a0 := take("a0")
	unlockLost(t, hc, a0)
	if err := a0.Unlock(ctx); err != nil || a0.Err() != nil {
		t.Errorf("a0's Unlock retried at once = %v (Err %v), want nil: its first try released", err, a0.Err())
	}
	a1 := take("a1")
	unlockLost(t, hc, a1)
	a2 := take("a2")
	unlockLost(t, hc, a2)
	var forced []*mutex.Mutex
	b := take("b0")
	force("b0")
	forced = append(forced, b)
	h := take("h")
	unlockLost(t, hc, h)
	for i := 1; i < 16; i++ {
		b := take("b" + strconv.Itoa(i))
		force("b" + strconv.Itoa(i))
		forced = append(forced, b)
	}
	if err := a1.Unlock(ctx); err != nil || a1.Holds() != 0 || a1.Err() != nil {
		t.Errorf("a1's retried Unlock after 16 forced holds = %v (Holds %d, Err %v), want nil: its first try released", err, a1.Holds(), a1.Err())
	}
	wantFree(t, forcer, "after a1's retried Unlock")

	b = take("b16")
	force("b16")
	forced = append(forced, b)
	wantNotHeld(t, "a2's retried Unlock after 17 forced holds (before the run now)", a2, a2.Unlock(ctx))
	if err := h.Unlock(ctx); err != nil || h.Err() != nil {
		t.Errorf("h's retried Unlock (the run's start now) = %v (Err %v), want nil", err, h.Err())
	}
	for _, i := range []int{16, 8, 1, 0} {
		wantNotHeld(t, "Unlock of forced hold b"+strconv.Itoa(i), forced[i], forced[i].Unlock(ctx))
	}
	wantFree(t, forcer, "after the Unlocks")

	// Both ways: a hold taken now is released by its own Unlock only.
	c := take("c")
	wantNotHeld(t, "Unlock of forced hold b2 while c holds", forced[2], forced[2].Unlock(ctx))
	wantHolder(t, c, 1, "after an Unlock of a forced hold")
	if err := c.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wantFree(t, c, "after c's Unlock")
}

// TestReleaseClassRetryAfterSameOwnerReacquired: two Mutex values with
// one owner id (WithOwner, as a process after a restart). The earlier
// one's Unlock must never release the later one's hold: not when it is a
// retry of an Unlock that released (it is told so), not when its own hold
// was forced or taken over (it is told it lost it), not when it is nested
// (the later hold keeps its count).
func TestReleaseClassRetryAfterSameOwnerReacquired(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	l, hc := hookedLocker(t, srv.Addr(), mutex.Options{WatchdogLease: 5 * time.Minute})
	for _, tc := range []struct {
		name string
		// end ends m1's hold before m2 takes the lock; true if m1's
		// Unlock must then succeed (it released).
		end      func(t *testing.T, m1 *mutex.Mutex) bool
		m1Holds  int
		takeOver bool // m2 locks while m1 still holds
	}{
		{name: "retried", m1Holds: 1, end: func(t *testing.T, m1 *mutex.Mutex) bool {
			unlockLost(t, hc, m1)
			return true
		}},
		{name: "forced", m1Holds: 1, end: func(t *testing.T, m1 *mutex.Mutex) bool {
			if ok, err := m1.ForceUnlock(ctx); err != nil || !ok {
				t.Fatalf("ForceUnlock = %v, %v", ok, err)
			}
			return false
		}},
		{name: "nested-forced", m1Holds: 2, end: func(t *testing.T, m1 *mutex.Mutex) bool {
			if ok, err := m1.ForceUnlock(ctx); err != nil || !ok {
				t.Fatalf("ForceUnlock = %v, %v", ok, err)
			}
			return false
		}},
		{name: "taken-over", m1Holds: 1, takeOver: true},
		{name: "nested-taken-over", m1Holds: 3, takeOver: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := className("class-same-owner")
			owner := "restarted-" + name
			m1 := newMutex(t, l, name, mutex.WithOwner(owner))
			m2 := newMutex(t, l, name, mutex.WithOwner(owner))
			for range tc.m1Holds {
				if err := lockWithin(m1); err != nil {
					t.Fatal(err)
				}
			}
			released := false
			if !tc.takeOver {
				released = tc.end(t, m1)
			}
			if err := lockWithin(m2); err != nil {
				t.Fatal(err)
			}
			if m2.Token() <= m1.Token() {
				t.Fatalf("m2's token %d is not above m1's %d", m2.Token(), m1.Token())
			}
			err := m1.Unlock(ctx)
			if released {
				if err != nil || m1.Err() != nil {
					t.Errorf("m1's retried Unlock = %v (Err %v), want nil: its first try released", err, m1.Err())
				}
			} else {
				wantNotHeld(t, "m1's Unlock", m1, err)
			}
			wantHolder(t, m2, 1, "after m1's Unlock")
			// A nested Unlock of m1 left: it too must leave m2's hold.
			if m1.Holds() > 0 {
				wantNotHeld(t, "m1's second Unlock", m1, m1.Unlock(ctx))
				wantHolder(t, m2, 1, "after m1's second Unlock")
			}
			if err := m2.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			wantFree(t, m2, "after m2's Unlock")
		})
	}
}

// TestReleaseClassUnlockAfterRecordLost: m1's record goes (its lease ran
// out: the key is deleted here, as its expiry would) while m1 does not know
// (no renewal runs). Its Unlock is told it lost the lock, and changes
// nothing, whatever came after: no record at all; a new record whose
// tokens, from the server's clock, are below m1's (m1's came from a record
// ahead of the clock), freed again; a new record ahead of the clock as m1's
// was, so that another owner now holds m1's very token.
func TestReleaseClassUnlockAfterRecordLost(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	l := newLocker(t, client, mutex.Options{WatchdogLease: 5 * time.Minute})
	for _, after := range []string{"nothing", "lower-freed", "same-token-held"} {
		t.Run(after, func(t *testing.T) {
			name := className("class-record-lost")
			key := lockKey(name)
			seedAhead(t, client, name)
			m1, m2 := newMutex(t, l, name), newMutex(t, l, name)
			if err := m1.TryLock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := client.Do(ctx, client.B().Del().Key(key).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			switch after {
			case "lower-freed":
				if err := m2.TryLock(ctx); err != nil {
					t.Fatal(err)
				}
				if m2.Token() >= m1.Token() {
					t.Fatalf("m2's token %d from the clock, want below m1's %d", m2.Token(), m1.Token())
				}
				if err := m2.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			case "same-token-held":
				last := strconv.FormatInt(m1.Token()-1, 10)
				if err := client.Do(ctx, client.B().Set().Key(key).Value("L:"+last+":"+last+"|").Px(time.Minute).Build()).Error(); err != nil {
					t.Fatal(err)
				}
				if err := m2.TryLock(ctx); err != nil {
					t.Fatal(err)
				}
				if m2.Token() != m1.Token() {
					t.Fatalf("m2's token %d, want m1's %d", m2.Token(), m1.Token())
				}
			}
			before, _ := client.Do(ctx, client.B().Get().Key(key).Build()).ToString()
			wantNotHeld(t, "Unlock after the record was lost", m1, m1.Unlock(ctx))
			v, err := client.Do(ctx, client.B().Get().Key(key).Build()).ToString()
			if err != nil && !rueidis.IsRedisNil(err) {
				t.Fatal(err)
			}
			if v != before {
				t.Errorf("record after the lost hold's Unlock = %q, want it unchanged, %q", v, before)
			}
			if after == "same-token-held" {
				wantHolder(t, m2, 1, "after the lost hold's Unlock")
				if err := m2.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestReleaseClassNestedUnlockRetriedCountsOnce: a nested Unlock whose
// reply was lost and that is retried leaves one hold fewer, not two (the
// client sends the holds it has, the script leaves one fewer); the hold
// keeps its owner, attempt and lease, and the last Unlock releases.
func TestReleaseClassNestedUnlockRetriedCountsOnce(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	l, hc := hookedLocker(t, srv.Addr(), mutex.Options{})
	name := className("class-nested")
	m := newMutex(t, l, name, mutex.WithLease(time.Minute))
	for range 3 {
		if err := lockWithin(m); err != nil {
			t.Fatal(err)
		}
	}
	attempt := recordField(t, client, lockKey(name), "a")
	unlockLost(t, hc, m)
	if m.Holds() != 3 {
		t.Fatalf("Holds after a nested Unlock whose reply was lost = %d, want 3", m.Holds())
	}
	if err := m.Unlock(ctx); err != nil || m.Holds() != 2 {
		t.Fatalf("retried nested Unlock = %v (Holds %d), want nil with 2 holds", err, m.Holds())
	}
	wantHolder(t, m, 2, "after a retried nested Unlock")
	if a := recordField(t, client, lockKey(name), "a"); a != attempt {
		t.Errorf("the hold's attempt after nested Unlocks = %q, want %q", a, attempt)
	}
	// The hold is still this acquisition's: a Lock of another owner is
	// refused until the last Unlock.
	other := newMutex(t, l, name)
	if err := other.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("another owner's TryLock while nested holds remain = %v, want ErrNotObtained", err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wantHolder(t, m, 1, "after the second nested Unlock")
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wantFree(t, m, "after the last Unlock")
	if err := other.TryLock(ctx); err != nil {
		t.Fatalf("TryLock after the last Unlock = %v", err)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseClassHandOffTokenAndQueueKeys: a fair release hands the lock
// to the first live waiter with a token above the releasing hold's, even
// when the last token is ahead of the server's clock, and otherwise from
// the server's clock (at least its TIME before the release); the waiter's
// entry leaves both queue keys and the record keeps q. The waiter's own
// release finds the queue empty and clears q.
func TestReleaseClassHandOffTokenAndQueueKeys(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	opts := mutex.Options{Fair: true, WatchdogLease: 5 * time.Minute}
	l := newLocker(t, client, opts)
	for _, ahead := range []bool{false, true} {
		t.Run(map[bool]string{false: "clock", true: "ahead"}[ahead], func(t *testing.T) {
			name := className("class-handoff")
			if ahead {
				seedAhead(t, client, name)
			}
			a, b := newMutex(t, l, name), newMutex(t, l, name)
			if err := lockWithin(a); err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() { got <- lockWithin(b) }()
			waitQueued(t, client, name, 1)
			msgs := listenBoth(t, srv.Addr(), lockKey(name)+":w")
			before, at := serverMicros(t, client), a.Token()
			if err := a.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatal(err)
			}
			if b.Token() <= at {
				t.Errorf("handed-over token %d, want above the releasing hold's %d", b.Token(), at)
			}
			if !ahead && b.Token() < before {
				t.Errorf("handed-over token %d, want at least the server's clock before the release, %d", b.Token(), before)
			}
			if ahead && b.Token() != at+1 {
				t.Errorf("handed-over token %d with the clock behind, want %d", b.Token(), at+1)
			}
			wantHolder(t, b, 1, "after the hand-off")
			// The grant is told on the channel, "g <attempt> <token>"
			// (a queued waiter would otherwise learn of it only at its
			// entry's next refresh), and nothing else is published.
			want := "g " + recordField(t, client, lockKey(name), "a") + " " + strconv.FormatInt(b.Token(), 10)
			if plain, sharded := msgs(); len(plain) != 1 || plain[0] != want || len(sharded) != 0 {
				t.Errorf("messages of the hand-off = %q (sharded %q), want [%q]", plain, sharded, want)
			}
			for _, k := range []string{":q", ":e"} {
				if n, err := client.Do(ctx, client.B().Exists().Key(lockKey(name)+k).Build()).AsInt64(); err != nil || n != 0 {
					t.Errorf("EXISTS %s after the hand-off = %d, %v; want 0 (the entry left with the grant)", k, n, err)
				}
			}
			if k := recordField(t, client, lockKey(name), "k"); !strings.Contains(k, "q") {
				t.Errorf("record flags after a hand-off = %q, want q kept", k)
			}
			if err := b.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if k := recordField(t, client, lockKey(name), "k"); strings.Contains(k, "q") {
				t.Errorf("record flags after a release that found the queue empty = %q, want q cleared", k)
			}
			wantFree(t, a, "after b's Unlock")
		})
	}
}

// TestReleaseClassForceHandsOff: ForceUnlock of a fair lock with a live
// waiter reports that it released a hold, and hands the lock over; the
// holder's Unlock is told it lost it and leaves the new holder alone.
func TestReleaseClassForceHandsOff(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	l := newLocker(t, client, mutex.Options{Fair: true, WatchdogLease: 5 * time.Minute})
	name := className("class-force-handoff")
	a, b := newMutex(t, l, name), newMutex(t, l, name)
	if err := lockWithin(a); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- lockWithin(b) }()
	waitQueued(t, client, name, 1)
	if ok, err := b.ForceUnlock(ctx); err != nil || !ok {
		t.Fatalf("ForceUnlock of a held lock with a waiter = %v, %v; want true", ok, err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	wantNotHeld(t, "the forced holder's Unlock", a, a.Unlock(ctx))
	wantHolder(t, b, 1, "after the forced holder's Unlock")
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.ForceUnlock(ctx); err != nil || ok {
		t.Fatalf("ForceUnlock of a free lock = %v, %v; want false", ok, err)
	}
}

// TestReleaseClassWakeups: what each release publishes on the lock's
// channel (counted up to a probe published after it). A final Unlock
// publishes only if a Lock was refused while the record lived (w) or the
// queue was flagged (q): not for a record that flags only tombstones (x),
// and once for a record that flags the queue, whose dead entries it drops
// (clearing q). ForceUnlock of a held lock publishes whatever the flags; of
// a free lock it reports false and publishes nothing.
func TestReleaseClassWakeups(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	l := newLocker(t, client, mutex.Options{WatchdogLease: 5 * time.Minute})
	do := func(args ...string) {
		t.Helper()
		if err := client.Do(ctx, client.B().Arbitrary(args[0]).Args(args[1:]...).Build()).Error(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	for _, tc := range []struct {
		name  string
		setup func(key string) // before the first Lock makes the record
		// release ends m's hold, refused is a TryLock refused before it
		refused bool
		force   bool
		want    int
		flags   string // the record's q and x flags after the release
	}{
		{name: "unlock", want: 0},
		{name: "unlock-tombstones", setup: func(key string) {
			do("HSET", key+":x", "gone.1", "1")
			do("PEXPIRE", key+":x", "60000")
		}, want: 0, flags: "x"},
		{name: "unlock-after-refusal", refused: true, want: 1},
		{name: "unlock-dead-queue", setup: func(key string) {
			// An entry that ended a few seconds ago: dead, by the
			// server's clock in milliseconds.
			ended := strconv.FormatInt(serverMicros(t, client)/1000-5000, 10)
			do("ZADD", key+":q", "1", "dead.1")
			do("HSET", key+":e", "dead.1", ended+" someone")
			do("PEXPIRE", key+":q", "60000")
			do("PEXPIRE", key+":e", "60000")
		}, want: 1},
		{name: "force", force: true, want: 1},
		{name: "force-tombstones", setup: func(key string) {
			do("HSET", key+":x", "gone.1", "1")
			do("PEXPIRE", key+":x", "60000")
		}, force: true, want: 1, flags: "x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := className("class-wake")
			key := lockKey(name)
			if tc.setup != nil {
				tc.setup(key)
			}
			count := listen(t, []string{srv.Addr()}, key+":w")
			m := newMutex(t, l, name)
			if err := m.TryLock(ctx); err != nil {
				t.Fatal(err)
			}
			if tc.refused {
				if err := newMutex(t, l, name).TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
					t.Fatalf("TryLock of a held lock = %v", err)
				}
			}
			if tc.force {
				if ok, err := m.ForceUnlock(ctx); err != nil || !ok {
					t.Fatalf("ForceUnlock = %v, %v", ok, err)
				}
			} else if err := m.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if got := count()[key+":w"]; got != tc.want {
				t.Errorf("wake-ups published by the release = %d, want %d", got, tc.want)
			}
			if k := recordField(t, client, key, "k"); k != tc.flags {
				t.Errorf("record flags after the release = %q, want %q", k, tc.flags)
			}
			for _, k := range []string{":q", ":e"} {
				if n, err := client.Do(ctx, client.B().Exists().Key(key+k).Build()).AsInt64(); err != nil || n != 0 {
					t.Errorf("EXISTS %s after the release = %d, %v; want 0 (dead entries dropped)", k, n, err)
				}
			}
			wantFree(t, m, "after the release")
			if tc.force {
				if ok, err := m.ForceUnlock(ctx); err != nil || ok {
					t.Errorf("ForceUnlock of a free lock = %v, %v; want false", ok, err)
				}
				if got := count()[key+":w"]; got != tc.want {
					t.Errorf("wake-ups after a ForceUnlock of a free lock = %d, want %d (none more)", got, tc.want)
				}
			}
		})
	}
}

// TestScriptReleaseClassPublishKind (script level: the API picks the case
// from the server, so one server cannot show both): every mode publishes
// its wake-up with PUBLISH when sent in lower case and with SPUBLISH in
// upper case, never both, never the other.
func TestScriptReleaseClassPublishKind(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	for _, mode := range []string{"u", "a", "f", "U", "A", "F"} {
		t.Run(mode, func(t *testing.T) {
			r := newScriptRig(t, className("class-pubkind-"+strings.ToLower(mode)))
			ch := r.keys.release[1]
			count := listenBoth(t, srv.Addr(), ch)
			a := r.take("A", "a.1", "")
			var args []string
			switch strings.ToLower(mode) {
			case "u":
				// A refused Lock: the Unlock then publishes.
				if got := r.take("B", "b.1", ""); got[0] != 0 {
					t.Fatalf("B's Lock of a held lock = %v, want refused", got)
				}
				args = unlockArgs("A", 1, a[2])
			case "a":
				args = giveBackArgs("A", "a.1", "30000")
			case "f":
				args = forceArgs()
			}
			args[0] = mode
			n, err := r.release.Exec(ctx, r.keys.release, args).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int64{true: 0, false: 1}[strings.ToLower(mode) == "u"]; n != want {
				t.Fatalf("release %s = %d, want %d", mode, n, want)
			}
			if o := r.field("o"); o != "" {
				t.Fatalf("held by %q after release %s, want free", o, mode)
			}
			msgs, smsgs := count()
			plain, sharded := len(msgs), len(smsgs)
			wantPlain, wantSharded := 1, 0
			if mode < "a" {
				wantPlain, wantSharded = 0, 1
			}
			if plain != wantPlain || sharded != wantSharded {
				t.Errorf("release %s published %d with PUBLISH and %d with SPUBLISH, want %d and %d", mode, plain, sharded, wantPlain, wantSharded)
			}
			for _, m := range append(append([]string(nil), msgs...), smsgs...) {
				if m != "1" {
					t.Errorf("release %s published %q, want the wake-up \"1\"", mode, m)
				}
			}
		})
	}
}

// listenBoth subscribes to ch on a single server with SUBSCRIBE and with
// SSUBSCRIBE, and returns a func that lists the messages each got so far:
// it first publishes a probe both ways and waits for them (a subscriber
// gets a channel's messages in order).
func listenBoth(t *testing.T, addr, ch string) func() (plain, sharded []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var got [2][]string
	var probed [2]int
	pub := redistest.Client(t, addr)
	var wg sync.WaitGroup
	for kind := range 2 {
		c := redistest.Client(t, addr)
		sub := c.B().Subscribe().Channel(ch).Build()
		if kind == 1 {
			sub = c.B().Ssubscribe().Channel(ch).Build()
		}
		wg.Go(func() {
			_ = c.Receive(ctx, sub, func(m rueidis.PubSubMessage) {
				mu.Lock()
				defer mu.Unlock()
				if n, ok := strings.CutPrefix(m.Message, "probe-"); ok {
					probed[kind], _ = strconv.Atoi(n)
				} else {
					got[kind] = append(got[kind], m.Message)
				}
			})
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	n := 0
	probe := func(wait time.Duration) bool {
		n++
		msg := "probe-" + strconv.Itoa(n)
		for _, cmd := range []rueidis.Completed{pub.B().Publish().Channel(ch).Message(msg).Build(), pub.B().Spublish().Channel(ch).Message(msg).Build()} {
			if err := pub.Do(ctx, cmd).Error(); err != nil {
				t.Fatal(err)
			}
		}
		return redistest.WaitFor(ctx, wait, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return probed[0] >= n && probed[1] >= n
		})
	}
	if !redistest.WaitFor(ctx, signal, func() bool { return probe(200 * time.Millisecond) }) {
		t.Fatal("subscriptions not confirmed")
	}
	return func() ([]string, []string) {
		if !probe(signal) {
			t.Fatal("a probe message did not come back")
		}
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got[0]...), append([]string(nil), got[1]...)
	}
}

// TestScriptReleaseClassGiveBack (script level: the API sends a give-back
// only once its attempt can no longer run, and names its own attempts):
// a give-back with a malformed attempt id fails and changes nothing; one
// of an attempt that holds nothing leaves a tombstone for that attempt
// only, for its lifetime (never shortened by a shorter give-back, whatever
// the queue keys' expiry), flags the record (x), and leaves alone the hold
// a later attempt of the same owner made; one of a queued attempt takes
// its entry out of both queue keys and leaves the others'; one of the
// attempt that holds the lock releases it, hands it to the first live
// waiter, and lists its token, so its owner's Unlock is told it lost it.
func TestScriptReleaseClassGiveBack(t *testing.T) {
	ctx := context.Background()
	r := newReviewRig(t, className("class-giveback"))
	key := r.keys.lock[0]
	giveBack := func(owner, attempt, lifeMs string) (int64, error) {
		return r.release.Exec(ctx, r.keys.release, giveBackArgs(owner, attempt, lifeMs)).AsInt64()
	}
	// A lock of its own for the give-backs on no record and on a fresh
	// record.
	r0 := newReviewRig(t, className("class-giveback-fresh"))
	key0 := r0.keys.lock[0]
	giveBack0 := func(owner, attempt, lifeMs string) (int64, error) {
		return r0.release.Exec(ctx, r0.keys.release, giveBackArgs(owner, attempt, lifeMs)).AsInt64()
	}
	// No record: the tombstone alone, and no record made.
	if n, err := giveBack0("N", "n.1", "5000"); err != nil || n != 0 {
		t.Fatalf("give-back with no record = %d, %v; want 0", n, err)
	}
	if n := r0.int("EXISTS", key0); n != 0 {
		t.Errorf("a give-back with no record made one: EXISTS = %d", n)
	}
	if n := r0.int("HEXISTS", key0+":x", "n.1"); n != 1 {
		t.Errorf("tombstone of n.1 after a give-back with no record = %d, want 1", n)
	}
	r0.int("DEL", key0+":x")

	// A fresh record (no x): the give-back of the attempt that holds it
	// releases it and flags the record, so that the attempt, arriving
	// late, is refused, and no other is.
	g := r0.takeL("G", "g.1", "", "30000")
	if n, err := giveBack0("G", "g.1", "5000"); err != nil || n != 1 {
		t.Fatalf("give-back of the holding attempt on a fresh record = %d, %v; want 1", n, err)
	}
	if k := r0.field("k"); k != "x" {
		t.Errorf("flags after the give-back of a hold = %q, want x", k)
	}
	if got := r0.takeL("G", "g.1", "", "30000"); got[0] != 0 {
		t.Errorf("the given-back attempt arriving late = %v, want refused", got)
	}
	if n := r0.unlock("G", g[2]); n != -1 {
		t.Errorf("G's Unlock of its given-back hold = %d, want -1", n)
	}
	if got := r0.takeL("H", "h.1", "", "30000"); got[0] != 1 {
		t.Errorf("another attempt after the give-back = %v, want granted", got)
	}
	a1 := r.takeL("A", "a.1", "", "30000")
	if a1[0] != 1 {
		t.Fatalf("A's Lock = %v, want granted", a1)
	}
	if n := r.unlock("A", a1[2]); n != 0 {
		t.Fatalf("A's Unlock = %d", n)
	}
	a2 := r.takeL("A", "a.2", "", "30000")
	if a2[0] != 1 {
		t.Fatalf("A's second Lock = %v, want granted", a2)
	}
	// Two fair waiters with long leases: the queue keys outlive the
	// tombstones' lifetime.
	for _, w := range []string{"W", "V"} {
		if got := r.takeL(w, strings.ToLower(w)+".1", "f", "60000"); got[0] != 0 {
			t.Fatalf("%s's fair Lock = %v, want queued", w, got)
		}
	}
	holder := func(what string) {
		t.Helper()
		if o, a, n := r.field("o"), r.field("a"), r.field("n"); o != "A" || a != "a.2" || n != "1" {
			t.Fatalf("%s: hold %s/%s/%s, want A's a.2 with 1 hold", what, o, a, n)
		}
	}

	if _, err := giveBack("A", "a:2", "5000"); err == nil || !strings.Contains(err.Error(), "malformed attempt id") {
		t.Errorf("give-back of a malformed attempt id = %v, want refused", err)
	}
	if n := r.int("EXISTS", key+":x"); n != 0 {
		t.Errorf("tombstones after a refused give-back: EXISTS = %d, want 0", n)
	}
	holder("after a refused give-back")
	if k := r.field("k"); strings.Contains(k, "x") {
		t.Errorf("flags after a refused give-back = %q, want no x", k)
	}

	if n, err := giveBack("A", "a.1", "5000"); err != nil || n != 0 {
		t.Fatalf("give-back of A's earlier attempt = %d, %v; want 0", n, err)
	}
	holder("after the give-back of an earlier attempt")
	if k := r.field("k"); !strings.Contains(k, "x") || !strings.Contains(k, "q") {
		t.Errorf("flags after a give-back = %q, want q and x", k)
	}
	if n := r.int("HEXISTS", key+":x", "a.1"); n != 1 {
		t.Errorf("tombstone of a.1 = %d, want 1", n)
	}
	if n := r.int("HLEN", key+":x"); n != 1 {
		t.Errorf("tombstones = %d, want 1 (the given-back attempt only)", n)
	}
	if ttl := r.int("PTTL", key+":x"); ttl <= 0 || ttl > 5000 {
		t.Errorf("tombstones' PTTL = %d, want (0, 5000]: the give-back's lifetime", ttl)
	}
	if n, err := giveBack("Z", "z.1", "1000"); err != nil || n != 0 {
		t.Fatalf("give-back of a stranger's attempt = %d, %v; want 0", n, err)
	}
	if ttl := r.int("PTTL", key+":x"); ttl <= 1000 {
		t.Errorf("tombstones' PTTL after a shorter give-back = %d, want above 1000 (not cut short)", ttl)
	}
	holder("after a stranger's give-back")

	if n, err := giveBack("W", "w.1", "5000"); err != nil || n != 0 {
		t.Fatalf("give-back of W's queued attempt = %d, %v; want 0", n, err)
	}
	if n := r.int("ZCARD", key+":q") + r.int("HLEN", key+":e"); n != 2 {
		t.Errorf("queue keys after W's give-back hold %d members, want 2 (V's entry, in both)", n)
	}
	if n := r.int("ZCARD", key+":q"); n != 1 || r.int("HEXISTS", key+":e", "v.1") != 1 {
		t.Errorf("V's queue entry is gone after W's give-back")
	}
	if got := r.takeL("W", "w.1", "f", "60000"); got[0] != 0 {
		t.Errorf("W's given-back attempt arriving late = %v, want refused", got)
	}
	holder("after W's give-back")

	if n, err := giveBack("A", "a.2", "5000"); err != nil || n != 1 {
		t.Fatalf("give-back of the holding attempt = %d, %v; want 1", n, err)
	}
	if o, a := r.field("o"), r.field("a"); o != "V" || a != "v.1" {
		t.Fatalf("after the give-back the lock is held by %s/%s, want V's v.1 (the first live waiter)", o, a)
	}
	v := r.takeL("V", "v.1", "f", "60000")
	if v[0] != 2 || v[2] <= a2[2] {
		t.Errorf("V = %v, want handed the lock with a token above %d", v, a2[2])
	}
	if n := r.unlock("A", a2[2]); n != -1 {
		t.Errorf("A's Unlock of the given-back hold = %d, want -1", n)
	}
	if n := r.unlock("A", a1[2]); n != 0 {
		t.Errorf("A's retried Unlock of its first hold = %d, want 0 (it released)", n)
	}
	if o := r.field("o"); o != "V" {
		t.Errorf("held by %q after A's Unlocks, want V", o)
	}
	if n := r.unlock("V", v[2]); n != 0 {
		t.Errorf("V's Unlock = %d, want 0", n)
	}
	// ForceUnlock of a free lock: 0, and the record stays as it was.
	free, _ := r.do("GET", key).ToString()
	if n := r.force(); n != 0 {
		t.Errorf("force of a free lock = %d, want 0", n)
	}
	if v, _ := r.do("GET", key).ToString(); v != free || free == "" {
		t.Errorf("record after a force of a free lock = %q, want unchanged", v)
	}
}
