package mutex_test

// Regression tests of issue 31: a retried final Unlock is answered from
// what its first try did, whatever ended the holds that followed (see c in
// lua/mutex_lock.lua and lua/rwmutex_lock.lua).

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// isQueueRefresh reports whether a script call is mutex_queue_refresh.
func isQueueRefresh(keys, args []string) bool {
	return len(keys) > 0 && len(keys)%3 == 0 && len(args) == len(keys) && strings.HasSuffix(keys[1], ":q")
}

// isRWUnlockOf reports whether a script call is rwmutex_unlock sent by
// owner.
func isRWUnlockOf(owner string, keys, args []string) bool {
	return len(keys) == 3 && len(args) == 5 && strings.HasSuffix(keys[1], ":rw.rd") && args[0] == owner
}

// loseFirst returns a before hook for spyClient that loses the reply of
// the first call for which is reports true, and passes every other call.
func loseFirst(is func(keys, args []string) bool) func(keys, args []string) spyAction {
	lost := false
	return func(keys, args []string) spyAction {
		if is(keys, args) && !lost {
			lost = true
			return spyLose
		}
		return spyPass
	}
}

// TestFairUnlockRetryAfterGiveBackHandOff (issue 31 item 3): A holds a fair
// lock, W and then X queue. A's Unlock hands the lock to W and its reply is
// lost; W gives up before it hears of the grant, and its give-back hands
// the lock to X. The give-back moved the start of the run of Unlocks (c)
// past W's hold and with it past A's, so A's retried Unlock was told -1:
// ErrNotHeld, Lost closed, Err wrapping ErrLost, for a release that
// succeeded. Now a hold that ends otherwise is listed in c instead.
func TestFairUnlockRetryAfterGiveBackHandOff(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			ctx := context.Background()
			addrs := tg.addrs(t)
			client := redistest.Client(t, addrs...)
			name := "retry-giveback:" + t.Name()
			// A long watchdog lease: no renewal runs during the test.
			opts := mutex.Options{Fair: true, WatchdogLease: 5 * time.Minute}
			la, aspy := spiedLocker(t, addrs, opts)
			lw, wspy := spiedLocker(t, addrs, opts)
			a, w := newMutex(t, la, name), newMutex(t, lw, name)
			x := newMutex(t, newLocker(t, client, opts), name)
			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			wctx, wcancel := context.WithCancel(ctx)
			defer wcancel()
			wGot := result(func() error { return w.Lock(wctx) })
			waitQueued(t, client, name, 1)
			xctx, xcancel := context.WithTimeout(ctx, signal)
			defer xcancel()
			xGot := result(func() error { return x.Lock(xctx) })
			waitQueued(t, client, name, 2)

			// W hears of nothing from now on: neither the grant's message
			// nor a refresh of its queue entry (which would find the entry
			// gone and have it look).
			wspy.setMute(true)
			wspy.set(func(keys, args []string) spyAction {
				if isQueueRefresh(keys, args) {
					return spyCut
				}
				return spyPass
			}, nil)
			aspy.set(loseFirst(func(keys, args []string) bool { return isUnlockOf(a.Owner(), keys, args) }), nil)
			if err := a.Unlock(ctx); !errors.Is(err, errCutOff) {
				t.Fatalf("Unlock whose reply is lost = %v, want the connection error", err)
			}
			wcancel()
			if err := within(t, wGot, signal, "W's Lock"); !errors.Is(err, mutex.ErrNotObtained) {
				t.Fatalf("W's Lock = %v, want ErrNotObtained", err)
			}
			if err := within(t, xGot, signal, "X's Lock"); err != nil {
				t.Fatalf("X's Lock = %v; W's give-back must hand the lock on", err)
			}
			if err := a.Unlock(ctx); err != nil || a.Err() != nil || a.Holds() != 0 {
				t.Errorf("retried Unlock = %v (Err %v, Holds %d), want nil: its first try released the lock", err, a.Err(), a.Holds())
			}
			if err := x.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestScriptUnlockRetryPastOtherEndings (issue 31 item 3 and its
// siblings): a final Unlock retried after a lost reply is told it released
// the lock (0) whatever ended the holds that followed (a give-back that
// handed the lock on, a ForceUnlock, a takeover by the same owner id), as
// long as at most 16 of them ended otherwise; and the holds that ended
// otherwise are told -1.
func TestScriptUnlockRetryPastOtherEndings(t *testing.T) {
	r := newScriptRig(t, "retry-past-endings:"+strconv.Itoa(rand.IntN(1e9)))
	a := r.take("A", "a.1", "")
	r.take("W", "w.1", "f")
	r.take("X", "x.1", "f")
	if n := r.unlock("A", a[2]); n != 0 { // hands the lock to W
		t.Fatalf("A's unlock = %d", n)
	}
	wt, _ := strconv.ParseInt(r.field("f"), 10, 64)
	if n := r.giveBack("W", "w.1"); n != 1 { // hands it on to X
		t.Fatalf("W's give-back = %d, want 1", n)
	}
	x := r.take("X", "x.1", "f")
	if x[0] != 2 {
		t.Fatalf("X = %v, want handed the lock", x)
	}
	if n := r.unlock("A", a[2]); n != 0 {
		t.Fatalf("A's retried unlock after a give-back's hand-off = %d, want 0", n)
	}
	if n := r.force(); n != 1 {
		t.Fatalf("force = %d, want 1", n)
	}
	o := r.take("O", "o.1", "")
	p := r.take("O", "p.1", "") // the same owner id, another Mutex value: a takeover
	if p[0] != 1 || p[2] <= o[2] {
		t.Fatalf("takeover = %v, want a new hold", p)
	}
	if n := r.unlock("A", a[2]); n != 0 {
		t.Fatalf("A's retried unlock after a force and a takeover = %d, want 0", n)
	}
	for _, h := range []struct {
		who   string
		token int64
	}{{"W", wt}, {"X", x[2]}, {"O", o[2]}} {
		if n := r.unlock(h.who, h.token); n != -1 {
			t.Errorf("%s's unlock of a hold that ended otherwise = %d, want -1", h.who, n)
		}
	}
	if n := r.unlock("O", p[2]); n != 0 {
		t.Fatalf("O's unlock of its live hold = %d", n)
	}
	// Three holds ended otherwise so far; 13 more are remembered, the
	// 17th pushes A's hold out of what the record knows.
	for i := range 14 {
		id := "g" + strconv.Itoa(i) + ".1"
		r.take("G", id, "")
		if n := r.giveBack("G", id); n != 1 {
			t.Fatalf("give-back %s = %d", id, n)
		}
		want := int64(0)
		if i == 13 {
			want = -1
		}
		if n := r.unlock("A", a[2]); n != want {
			t.Fatalf("A's retried unlock after %d holds ended otherwise = %d, want %d", 4+i, n, want)
		}
	}
	if n := r.unlock("O", p[2]); n != 0 {
		t.Fatalf("O's retried unlock = %d, want 0 (its hold is after those forgotten)", n)
	}
}

// TestRWUnlockRetryAfterOtherWriter (issue 31, a sibling of item 3): a
// writer's final Unlock ran but its reply was lost; before the retry,
// another writer locked and unlocked (and a third was forced out). The hash
// remembered only the last write release (r), so the retry was told -1 and
// Unlock reported a loss that never happened. Now the record keeps the run
// of write holds as a Mutex's does (c).
func TestRWUnlockRetryAfterOtherWriter(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			ctx := context.Background()
			addrs := tg.addrs(t)
			name := "rw-retry:" + t.Name()
			w1, spy := spiedRW(t, addrs, name)
			direct := newLocker(t, redistest.Client(t, addrs...), mutex.Options{})
			w2, w3 := newRW(t, direct, name), newRW(t, direct, name)
			if err := w1.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			spy.set(loseFirst(func(keys, args []string) bool { return isRWUnlockOf(w1.Owner(), keys, args) }), nil)
			if err := w1.Unlock(ctx); !errors.Is(err, errCutOff) {
				t.Fatalf("Unlock whose reply is lost = %v, want the connection error", err)
			}
			if err := w2.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := w2.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := w3.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if ok, err := w3.ForceUnlock(ctx); err != nil || !ok {
				t.Fatalf("ForceUnlock = %v, %v", ok, err)
			}
			if err := w1.Unlock(ctx); err != nil || w1.Err() != nil {
				t.Errorf("retried Unlock = %v (Err %v), want nil: its first try released the lock", err, w1.Err())
			}
			if err := w3.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) || !errors.Is(w3.Err(), mutex.ErrLost) {
				t.Errorf("Unlock of a forced hold = %v (Err %v), want ErrNotHeld and the loss", err, w3.Err())
			}
		})
	}
}

// TestScriptRWUnlockRetryAfterExpiry (issue 31, with
// TestRWUnlockRetryAfterOtherWriter): a write hold whose lease ran out is
// listed in c by the grant that replaces it, so an Unlock of it is told -1
// whatever came after, while an Unlock retried for a hold that its Unlock
// ended is told 0 after later write holds.
func TestScriptRWUnlockRetryAfterExpiry(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc := newScripts(t, client)
	lock, _ := sc.Script("rwmutex_lock")
	unlock, _ := sc.Script("rwmutex_unlock")
	name := "rw-retry-expiry:" + strconv.Itoa(rand.IntN(1e9))
	lockKeys := []string{rwKey(name, "h"), rwKey(name, "z"), rwKey(name, "t"), rwKey(name, "m")}
	unlockKeys := []string{rwKey(name, "h"), rwKey(name, "rd"), rwKey(name, "wr")}
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
		n, err := unlock.Exec(ctx, unlockKeys, []string{owner, "1", strconv.FormatInt(token, 10), "p", "1000"}).AsInt64()
		if err != nil {
			t.Fatalf("unlock %s %d: %v", owner, token, err)
		}
		return n
	}
	w1 := take("W1", "w1.1", "50")
	var w2 []int64
	waitRedis(t, "W1's lease to run out", func() bool {
		w2 = take("W2", "w2.1", "30000")
		return w2[0] == 1
	})
	if n := release("W1", w1[2]); n != -1 {
		t.Fatalf("unlock of a hold whose lease ran out = %d, want -1", n)
	}
	if n := release("W2", w2[2]); n != 0 {
		t.Fatalf("W2's unlock = %d", n)
	}
	w3 := take("W3", "w3.1", "30000")
	if n := release("W3", w3[2]); n != 0 {
		t.Fatalf("W3's unlock = %d", n)
	}
	if n := release("W2", w2[2]); n != 0 {
		t.Fatalf("W2's retried unlock after W3's = %d, want 0", n)
	}
	if n := release("W1", w1[2]); n != -1 {
		t.Fatalf("W1's unlock after later holds = %d, want -1", n)
	}
}
