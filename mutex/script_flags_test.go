package mutex_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// scriptRig calls mutex_lock and mutex_release directly, as package mutex
// would, so that tests can put the keys into states that need timing to
// reach through the API (a record that expired while the queue or the
// tombstones live on, an Unlock retried after others took the lock).
type scriptRig struct {
	t             *testing.T
	ctx           context.Context
	client        rueidis.Client
	lock, release *scriptcache.Script
	keys          lockScriptKeys
}

func newScriptRig(t *testing.T, name string) *scriptRig {
	t.Helper()
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc := newScripts(t, client)
	r := &scriptRig{t: t, ctx: ctx, client: client, keys: scriptKeys(name)}
	r.lock, _ = sc.Script("mutex_lock")
	r.release, _ = sc.Script("mutex_release")
	return r
}

// take runs an outermost Lock attempt (fair: "f", "t" or "") and returns
// {got, holds or wait, token} (see lockAnswer).
func (r *scriptRig) take(owner, attempt, fair string) []int64 {
	r.t.Helper()
	return r.takeLease(owner, attempt, fair, "30000")
}

// takeLease is take with a lease, with the keys package mutex sends: an
// unfair Lock leaves out the queue entries.
func (r *scriptRig) takeLease(owner, attempt, fair, leaseMs string) []int64 {
	r.t.Helper()
	keys := r.keys.lock
	if fair == "" || fair == "w" {
		keys = keys[:3]
	}
	vs, err := execLock(r.ctx, r.lock, keys, owner, leaseMs, attempt, fair)
	if err != nil || len(vs) != 3 {
		r.t.Fatalf("lock %s %s = %v, %v", owner, attempt, vs, err)
	}
	return vs
}

// unlock runs a final Unlock of owner's hold with token, as an unfair
// Mutex does: with the record and the channel, and with every key if the
// script asks for them (-2).
func (r *scriptRig) unlock(owner string, token int64) int64 {
	r.t.Helper()
	n, err := r.release.Exec(r.ctx, r.keys.release[:2], unlockArgs(owner, 1, token)).AsInt64()
	if err == nil && n == -2 {
		n, err = r.release.Exec(r.ctx, r.keys.release, unlockArgs(owner, 1, token)).AsInt64()
	}
	if err != nil {
		r.t.Fatalf("unlock %s %d: %v", owner, token, err)
	}
	return n
}

// giveBack runs the give-back of an abandoned attempt.
func (r *scriptRig) giveBack(owner, attempt string) int64 {
	r.t.Helper()
	n, err := r.release.Exec(r.ctx, r.keys.release, giveBackArgs(owner, attempt, "30000")).AsInt64()
	if err != nil {
		r.t.Fatalf("give-back %s %s: %v", owner, attempt, err)
	}
	return n
}

func (r *scriptRig) force() int64 {
	r.t.Helper()
	n, err := r.release.Exec(r.ctx, r.keys.release, forceArgs()).AsInt64()
	if err != nil {
		r.t.Fatal(err)
	}
	return n
}

// field reads a field of the lock record ("" if missing; see lockRecord).
func (r *scriptRig) field(f string) string {
	r.t.Helper()
	return recordField(r.t, r.client, r.keys.lock[0], f)
}

// dropHash deletes the lock record, as its expiry would, leaving the
// tombstones and the queue.
func (r *scriptRig) dropHash() {
	r.t.Helper()
	if err := r.client.Do(r.ctx, r.client.B().Del().Key(r.keys.lock[0]).Build()).Error(); err != nil {
		r.t.Fatal(err)
	}
}

// TestScriptTombstoneOutlivesHash: a give-back that finds no hash leaves
// only its tombstone. The grant that makes the record again must learn of it
// (the record's k flag), or the abandoned attempt, arriving after that hold
// ended, would be granted while its caller has gone.
func TestScriptTombstoneOutlivesHash(t *testing.T) {
	r := newScriptRig(t, "flags-tomb-cold")
	if n := r.giveBack("gone", "g.5"); n != 0 {
		t.Fatalf("give-back with nothing held = %d, want 0", n)
	}
	u := r.take("other", "o.1", "")
	if u[0] != 1 {
		t.Fatalf("other's lock = %v, want granted", u)
	}
	if n := r.unlock("other", u[2]); n != 0 {
		t.Fatalf("other's unlock = %d", n)
	}
	if got := r.take("gone", "g.5", ""); got[0] != 0 {
		t.Fatalf("abandoned attempt arriving after its give-back and another hold = %v, want refused", got)
	}
	// Another Lock of the same Mutex value, not abandoned (goroutines may
	// wait on one Mutex at once): the tombstone names g.5 alone.
	w := r.take("gone", "g.4", "")
	if w[0] != 1 {
		t.Fatalf("another, live attempt of that Mutex = %v, want granted", w)
	}
	if n := r.unlock("gone", w[2]); n != 0 {
		t.Fatalf("its unlock = %d", n)
	}
	if got := r.take("gone", "g.6", ""); got[0] != 1 {
		t.Fatalf("the next attempt of that Mutex = %v, want granted", got)
	}
}

// TestScriptTombstoneWhileHashLives: a give-back that finds the record (held
// by someone else, or released a moment ago) flags its tombstone there, so
// that Locks that trust the flag still see it.
func TestScriptTombstoneWhileHashLives(t *testing.T) {
	for _, end := range []string{"before", "after", "force"} {
		t.Run("released="+end, func(t *testing.T) {
			r := newScriptRig(t, "flags-tomb-warm-"+end)
			u := r.take("other", "o.1", "")
			if end == "before" {
				r.unlock("other", u[2])
			}
			if n := r.giveBack("gone", "g.5"); n != 0 {
				t.Fatalf("give-back of an attempt that holds nothing = %d, want 0", n)
			}
			switch end {
			case "after":
				r.unlock("other", u[2])
			case "force":
				r.force()
			}
			if got := r.take("gone", "g.5", ""); got[0] != 0 {
				t.Fatalf("abandoned attempt arriving after its give-back = %v, want refused", got)
			}
			if got := r.take("gone", "g.6", ""); got[0] != 1 {
				t.Fatalf("the next attempt of that Mutex = %v, want granted", got)
			}
		})
	}
}

// TestScriptQueueOutlivesHash: fair waiters queued while the record expired
// (the holder died) must still be handed the lock by the release of an
// unfair holder that took it meanwhile, as when the record had lived.
func TestScriptQueueOutlivesHash(t *testing.T) {
	for _, tomb := range []bool{false, true} {
		t.Run("tombstones="+strconv.FormatBool(tomb), func(t *testing.T) {
			r := newScriptRig(t, "flags-queue-cold-"+strconv.FormatBool(tomb))
			if a := r.take("A", "a.1", ""); a[0] != 1 {
				t.Fatalf("A's lock = %v", a)
			}
			if b := r.take("B", "b.1", "f"); b[0] != 0 {
				t.Fatalf("B's fair lock while A holds = %v, want queued", b)
			}
			if tomb {
				r.giveBack("gone", "g.1")
			}
			r.dropHash() // A's lease ran out
			c := r.take("C", "c.1", "")
			if c[0] != 1 {
				t.Fatalf("C's unfair lock of the free lock = %v, want granted", c)
			}
			if n := r.unlock("C", c[2]); n != 0 {
				t.Fatalf("C's unlock = %d", n)
			}
			if o := r.field("o"); o != "B" {
				t.Fatalf("after C's release the lock is held by %q, want the queued fair waiter B", o)
			}
			b := r.take("B", "b.1", "f")
			if b[0] != 2 || b[2] <= c[2] {
				t.Fatalf("B's lock after the hand-off = %v, want {2, 1, token above %d}", b, c[2])
			}
			if tomb {
				if got := r.take("gone", "g.1", ""); got[0] != 0 {
					t.Fatalf("abandoned attempt = %v, want refused", got)
				}
			}
		})
	}
}

// TestScriptFairWaiterOnFreeLockWithoutHash: a fair Lock that finds the lock
// free and no record, but a live waiter queued before it, queues behind it;
// the next holder's release hands the lock to the head, then to it.
func TestScriptFairWaiterOnFreeLockWithoutHash(t *testing.T) {
	r := newScriptRig(t, "flags-queue-free")
	a := r.take("A", "a.1", "")
	r.take("B", "b.1", "f")
	r.dropHash()
	if w := r.take("W", "w.1", "f"); w[0] != 0 || w[1] != -2 {
		t.Fatalf("W's fair lock of a free lock with B queued = %v, want {0, -2, 0}", w)
	}
	if got := r.take("W", "w.1", "t"); got[0] != 0 {
		t.Fatalf("W's fair TryLock = %v, want refused", got)
	}
	_ = a
	c := r.take("C", "c.1", "")
	if c[0] != 1 {
		t.Fatalf("C's unfair lock = %v", c)
	}
	r.unlock("C", c[2])
	b := r.take("B", "b.1", "f")
	if b[0] != 2 {
		t.Fatalf("B after C's release = %v, want handed the lock", b)
	}
	r.unlock("B", b[2])
	if w := r.take("W", "w.1", "f"); w[0] != 2 {
		t.Fatalf("W after B's release = %v, want handed the lock", w)
	}
}

// TestScriptQueueFlagCleared: a release that finds the queue empty clears
// the flag, so later releases skip the queue, and a later waiter sets it
// again.
func TestScriptQueueFlagCleared(t *testing.T) {
	r := newScriptRig(t, "flags-queue-clear")
	a := r.take("A", "a.1", "f")
	r.take("B", "b.1", "f")
	if k := r.field("k"); k != "q" {
		t.Fatalf("k = %q with a waiter queued, want q", k)
	}
	r.unlock("A", a[2])
	b := r.take("B", "b.1", "f")
	if b[0] != 2 {
		t.Fatalf("B = %v, want handed the lock", b)
	}
	r.unlock("B", b[2])
	if k := r.field("k"); k != "" {
		t.Fatalf("k = %q after a release found the queue empty, want none", k)
	}
	a = r.take("A", "a.2", "f")
	if a[0] != 1 {
		t.Fatalf("A = %v, want granted", a)
	}
	r.giveBack("gone", "g.1")
	r.take("B", "b.2", "f")
	if k := r.field("k"); k != "qx" {
		t.Fatalf("k = %q with a tombstone and a waiter, want qx", k)
	}
	r.unlock("A", a[2])
	b = r.take("B", "b.2", "f")
	r.unlock("B", b[2])
	if k := r.field("k"); k != "x" {
		t.Fatalf("k = %q after the queue emptied, want x (the tombstone stays)", k)
	}
}

// TestScriptUnlockRetry: a final Unlock retried after a lost reply is told
// it released the lock (0), also after others took the lock since; an
// Unlock of a hold that ForceUnlock or a give-back ended is told it does
// not hold it (-1).
func TestScriptUnlockRetry(t *testing.T) {
	r := newScriptRig(t, "flags-retry")
	a := r.take("A", "a.1", "")
	if n := r.unlock("A", a[2]); n != 0 {
		t.Fatalf("A's unlock = %d", n)
	}
	if n := r.unlock("A", a[2]); n != 0 {
		t.Fatalf("A's retried unlock = %d, want 0", n)
	}
	c := r.take("C", "c.1", "")
	if n := r.unlock("A", a[2]); n != 0 {
		t.Fatalf("A's retried unlock while C holds = %d, want 0", n)
	}
	// A token above every one issued (a token below the current one is
	// answered from the run of Unlocks, c: the client sends only tokens
	// it was given).
	if n := r.unlock("A", c[2]+1); n != -1 {
		t.Fatalf("A's unlock of a token never issued = %d, want -1", n)
	}
	r.unlock("C", c[2])
	if n := r.unlock("C", c[2]); n != 0 {
		t.Fatalf("C's retried unlock = %d, want 0", n)
	}

	// Hand-off: the releaser's retry is told it released.
	d := r.take("D", "d.1", "")
	r.take("E", "e.1", "f")
	r.unlock("D", d[2])
	if n := r.unlock("D", d[2]); n != 0 {
		t.Fatalf("D's retried unlock after a hand-off = %d, want 0", n)
	}
	e := r.take("E", "e.1", "f")
	if e[0] != 2 || e[2] <= d[2] {
		t.Fatalf("E = %v, want handed the lock with a token above %d", e, d[2])
	}

	// ForceUnlock: the holder is not told it released.
	if n := r.force(); n != 1 {
		t.Fatalf("force = %d, want 1", n)
	}
	if n := r.unlock("E", e[2]); n != -1 {
		t.Fatalf("E's unlock after ForceUnlock = %d, want -1", n)
	}
	if n := r.force(); n != 0 {
		t.Fatalf("force of a free lock = %d, want 0", n)
	}

	// Give-back of a hold: its token is not reported released by an Unlock.
	g := r.take("G", "g.1", "")
	if n := r.giveBack("G", "g.1"); n != 1 {
		t.Fatalf("give-back of G's hold = %d, want 1", n)
	}
	if n := r.unlock("G", g[2]); n != -1 {
		t.Fatalf("G's unlock after its hold was given back = %d, want -1", n)
	}
	if o := r.field("o"); o != "" {
		t.Fatalf("lock held by %q, want free", o)
	}
	h := r.take("H", "h.1", "")
	if h[0] != 1 || h[2] <= g[2] {
		t.Fatalf("H = %v, want granted with a token above %d", h, g[2])
	}
}
