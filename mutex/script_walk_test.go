package mutex_test

// An adversarial review of the lock record's flags (k), the field that
// answers a retried Unlock (c; p and r before issue 22), and the queue
// keys (issue 12's scripts). The interleavings are driven by calling the
// scripts directly, with the keys edited by hand where time would do it (a
// record, queue or tombstones that expire, a waiter that dies).

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// reviewRig extends scriptRig with a lease per call, the queue refresh and
// raw commands.
type reviewRig struct {
	*scriptRig
	refresh *scriptcache.Script
	name    string
}

func newReviewRig(t *testing.T, name string) *reviewRig {
	t.Helper()
	r := &reviewRig{scriptRig: newScriptRig(t, name), name: name}
	sc, err := scriptcache.New(r.ctx, r.client)
	if err != nil {
		t.Fatal(err)
	}
	r.refresh, err = sc.Script("mutex_queue_refresh")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *reviewRig) do(args ...string) rueidis.RedisResult {
	return r.client.Do(r.ctx, r.client.B().Arbitrary(args[0]).Args(args[1:]...).Build())
}

func (r *reviewRig) int(args ...string) int64 {
	r.t.Helper()
	n, err := r.do(args...).AsInt64()
	if err != nil {
		r.t.Fatalf("%v: %v", args, err)
	}
	return n
}

// takeL is scriptRig.take with a lease.
func (r *reviewRig) takeL(owner, attempt, fair, leaseMs string) []int64 {
	r.t.Helper()
	return r.takeLease(owner, attempt, fair, leaseMs)
}

// giveBackL is scriptRig.giveBack with the give-backing Mutex's lease.
func (r *reviewRig) giveBackL(owner, attempt, leaseMs string) int64 {
	r.t.Helper()
	n, err := r.release.Exec(r.ctx, r.keys.release, giveBackArgs(owner, attempt, leaseMs)).AsInt64()
	if err != nil {
		r.t.Fatalf("give-back %s %s: %v", owner, attempt, err)
	}
	return n
}

// refreshOne runs mutex_queue_refresh for one waiter.
func (r *reviewRig) refreshOne(owner, attempt, leaseMs string) int64 {
	r.t.Helper()
	k := r.keys.lock
	vs, err := r.refresh.Exec(r.ctx, []string{k[0], k[2], k[3]}, []string{attempt, owner, leaseMs}).AsIntSlice()
	if err != nil || len(vs) != 1 {
		r.t.Fatalf("refresh %s: %v, %v", attempt, vs, err)
	}
	return vs[0]
}

// checkFlags checks the flag invariant (while the record lives, a key its k
// does not flag is empty) and that every key has a TTL.
func (r *reviewRig) checkFlags(step string) {
	r.t.Helper()
	hash, tomb, queue, entries := r.keys.lock[0], r.keys.lock[1], r.keys.lock[2], r.keys.lock[3]
	for _, key := range []string{hash, tomb, queue, entries} {
		if pttl := r.int("PTTL", key); pttl == -1 {
			r.t.Fatalf("%s: key %s has no TTL", step, key)
		}
	}
	if r.int("EXISTS", hash) == 0 {
		return
	}
	if v, _ := r.do("GET", hash).ToString(); !validRecord(v) {
		r.t.Fatalf("%s: the record %q is not one", step, v)
	}
	k := r.field("k")
	if r.int("ZCARD", queue) > 0 && k != "q" && k != "qx" {
		r.t.Fatalf("%s: the queue has %d members but k = %q", step, r.int("ZCARD", queue), k)
	}
	if r.int("EXISTS", tomb) > 0 && k != "x" && k != "qx" {
		r.t.Fatalf("%s: tombstones exist but k = %q", step, k)
	}
}

// TestScriptRandomWalk drives the lock, release and queue refresh
// scripts through seeded random sequences of fair and unfair Locks,
// TryLocks, Unlocks (and retries of earlier ones), give-backs before and
// after their attempts, ForceUnlock, waiters that die, and keys that expire
// (the record, the queue, the tombstones, all of them: a Redis restart),
// and checks after every step:
//   - the flag invariant and that every key has a TTL;
//   - tokens increase with every acquisition (taken or handed over);
//   - a given-back attempt is never granted while its tombstone lives, and
//     the hold it was granted is released by the give-back;
//   - a retried Unlock is told it released (0) only for a hold its owner's
//     Unlock did end (it may be told -1 once the kept record expired or more
//     than 16 later holds ended otherwise: that is not checked), and an
//     Unlock of a live hold always releases it;
//   - an abandoned attempt arriving after its give-back is neither granted
//     nor queued while its tombstone lives;
//   - a fair Lock never takes a free lock while a live waiter queued before
//     it is still queued, and a release hands the lock only to an attempt
//     that is waiting in the queue and was not given back;
//   - a live waiter's entry is never dropped.
func TestScriptRandomWalk(t *testing.T) {
	seeds := 40
	steps := 300
	for seed := 1; seed <= seeds; seed++ {
		t.Run(strconv.Itoa(seed), func(t *testing.T) {
			walk(t, int64(seed), steps)
		})
	}
}

type walkOwner struct {
	name    string
	seq     int
	holding bool   // holds per the scripts' replies
	attempt string // attempt that made the hold
	token   int64
	queued  string // attempt id queued (fair Lock waiting), or ""
}

func walk(t *testing.T, seed int64, steps int) {
	rng := rand.New(rand.NewSource(seed))
	r := newReviewRig(t, "review-walk-"+strconv.FormatInt(seed, 10))
	owners := []*walkOwner{{name: "A"}, {name: "B"}, {name: "C"}, {name: "D"}}
	const lease = "30000"

	var lastToken int64
	stats := map[string]int{}
	// ended[owner token] = true when that hold ended by its owner's
	// Unlock; false when it ended otherwise (force, give-back, expiry,
	// flush).
	ended := map[string]bool{}
	issued := map[string]*walkOwner{} // attempt id -> owner
	var attempts []string
	givenBack := map[string]bool{} // attempt ids given back while their tombstones live
	var log []string
	fail := func(format string, args ...any) {
		t.Helper()
		tail := log
		if len(tail) > 40 {
			tail = tail[len(tail)-40:]
		}
		t.Fatalf("seed %d: %s\nlast steps:\n  %s", seed, fmt.Sprintf(format, args...), strings.Join(tail, "\n  "))
	}
	holderOf := func() *walkOwner {
		for _, o := range owners {
			if o.holding {
				return o
			}
		}
		return nil
	}
	endHold := func(o *walkOwner, byUnlock bool) {
		ended[o.name+" "+strconv.FormatInt(o.token, 10)] = byUnlock
		o.holding = false
	}
	// sync reads the record after a release to learn of a hand-off.
	sync := func(step string) {
		o := r.field("o")
		a := r.field("a")
		for _, w := range owners {
			if w.holding && (w.name != o || w.attempt != a) {
				// The scripts ended it without this model knowing: only
				// expected where the step says so (the caller ends it).
				fail("%s: %s's hold %s (%d) is gone: record o=%q a=%q", step, w.name, w.attempt, w.token, o, a)
			}
		}
		if o == "" {
			return
		}
		w := issued[a]
		if w == nil || w.name != o {
			fail("%s: record held by %q under attempt %q nobody issued", step, o, a)
		}
		if !w.holding {
			// A hand-off.
			f, _ := strconv.ParseInt(r.field("f"), 10, 64)
			if w.queued != a {
				fail("%s: lock handed to %s's attempt %s, which is not waiting (queued %q)", step, w.name, a, w.queued)
			}
			if givenBack[a] {
				fail("%s: lock handed to given-back attempt %s", step, a)
			}
			if f <= lastToken {
				fail("%s: hand-off token %d not above %d", step, f, lastToken)
			}
			lastToken = f
			stats["handoff"]++
			w.holding, w.attempt, w.token, w.queued = true, a, f, ""
			// The waiter's next call (its message) confirms.
			got := r.takeL(w.name, a, "f", lease)
			if got[0] != 2 || got[2] != f {
				fail("%s: handed waiter's call = %v, want {2, 1, %d}", step, got, f)
			}
		}
	}
	// firstLiveWaiter is the first queued attempt with a live entry.
	queueOrder := func() []string {
		ids, err := r.do("ZRANGE", r.keys.lock[2], "0", "-1").AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	inQueue := func(id string) bool {
		return r.do("ZSCORE", r.keys.lock[2], id).Error() == nil
	}
	liveEntry := func(id string) bool {
		e, err := r.do("HGET", r.keys.lock[3], id).ToString()
		if err != nil {
			return false
		}
		return !strings.HasPrefix(e, "1 ")
	}

	defer func() { t.Logf("seed %d: %v", seed, stats) }()
	for step := 0; step < steps; step++ {
		o := owners[rng.Intn(len(owners))]
		var desc string
		switch op := rng.Intn(100); {
		case op < 30: // Lock / TryLock (new attempt, or the waiting one again)
			if o.holding {
				continue
			}
			mode := []string{"", "f", "t"}[rng.Intn(3)]
			id := o.queued
			if id != "" {
				mode = "f" // a waiting Lock tries again
			} else {
				o.seq++
				id = o.name + "." + strconv.Itoa(o.seq)
				issued[id] = o
				attempts = append(attempts, id)
			}
			// A fair Lock must not take a free lock while a live waiter
			// queued before it.
			var ahead string
			if mode != "" {
				for _, q := range queueOrder() {
					if q == id {
						break
					}
					if liveEntry(q) {
						ahead = q
						break
					}
				}
			}
			got := r.takeL(o.name, id, mode, lease)
			desc = fmt.Sprintf("lock %s %s mode=%q -> %v", o.name, id, mode, got)
			log = append(log, desc)
			stats[fmt.Sprintf("lock%q=%d/%d", mode, got[0], min(got[1], 0))]++
			if got[0] >= 1 {
				if got[0] == 2 && !o.holding {
					fail("%s: told it held the lock already", desc)
				}
				if givenBack[id] {
					fail("%s: a given-back attempt was granted", desc)
				}
				if h := holderOf(); h != nil && h != o {
					fail("%s: granted while %s holds", desc, h.name)
				}
				if ahead != "" && got[0] == 1 {
					fail("%s: fair Lock took the lock with live waiter %s ahead", desc, ahead)
				}
				if got[0] == 1 {
					if got[2] <= lastToken {
						fail("%s: token %d not above %d", desc, got[2], lastToken)
					}
					lastToken = got[2]
				}
				o.holding, o.attempt, o.token, o.queued = true, id, got[2], ""
			} else if mode == "f" && inQueue(id) {
				o.queued = id
			}
		case op < 45: // final Unlock of the current hold
			if !o.holding {
				continue
			}
			n := r.unlock(o.name, o.token)
			desc = fmt.Sprintf("unlock %s %d -> %d", o.name, o.token, n)
			log = append(log, desc)
			if n != 0 {
				fail("%s: Unlock of a live hold refused", desc)
			}
			endHold(o, true)
			sync(desc)
		case op < 52: // Unlock retried: of an ended hold of o, if any
			var tokens []string
			for k := range ended {
				if strings.HasPrefix(k, o.name+" ") {
					tokens = append(tokens, k)
				}
			}
			if len(tokens) == 0 || o.holding {
				continue
			}
			// deterministic pick
			pick := tokens[0]
			for _, k := range tokens {
				if k > pick {
					pick = k
				}
			}
			tok, _ := strconv.ParseInt(strings.Fields(pick)[1], 10, 64)
			n := r.unlock(o.name, tok)
			desc = fmt.Sprintf("retried unlock %s %d (ended by unlock: %v) -> %d", o.name, tok, ended[pick], n)
			log = append(log, desc)
			stats[fmt.Sprintf("retry(%v)=%d", ended[pick], n)]++
			if n == 0 && !ended[pick] {
				fail("%s: told it released a hold that its Unlock did not end", desc)
			}
			if n > 0 {
				fail("%s: holds left for an ended hold", desc)
			}
			sync(desc)
		case op < 62: // give-back of some attempt of o (late or early)
			var mine []string
			for _, a := range attempts {
				if issued[a] == o {
					mine = append(mine, a)
				}
			}
			if len(mine) == 0 {
				continue
			}
			a := mine[rng.Intn(len(mine))]
			held := o.holding && o.attempt == a
			n := r.giveBackL(o.name, a, lease)
			desc = fmt.Sprintf("give-back %s %s (holds with it: %v) -> %d", o.name, a, held, n)
			log = append(log, desc)
			if held != (n == 1) {
				fail("%s: give-back result %d, want %v", desc, n, held)
			}
			stats[fmt.Sprintf("giveback=%d", n)]++
			givenBack[a] = true
			if held {
				endHold(o, false)
			}
			if o.queued == a {
				o.queued = ""
			}
			sync(desc)
		case op < 64: // an abandoned attempt arrives after its give-back
			var late []string
			for _, a := range attempts {
				if givenBack[a] && issued[a] == o {
					late = append(late, a)
				}
			}
			if len(late) == 0 {
				continue
			}
			a := late[rng.Intn(len(late))]
			mode := []string{"", "f", "t"}[rng.Intn(3)]
			got := r.takeL(o.name, a, mode, lease)
			desc = fmt.Sprintf("late attempt %s mode=%q -> %v", a, mode, got)
			log = append(log, desc)
			stats["late"]++
			if got[0] != 0 {
				fail("%s: an attempt given back was granted", desc)
			}
			if inQueue(a) {
				fail("%s: an attempt given back was queued", desc)
			}
		case op < 66: // ForceUnlock
			h := holderOf()
			n := r.force()
			desc = fmt.Sprintf("force (holder %v) -> %d", h != nil, n)
			log = append(log, desc)
			if (h != nil) != (n == 1) {
				fail("%s: force result %d", desc, n)
			}
			if h != nil {
				endHold(h, false)
			}
			sync(desc)
		case op < 72: // the record expires (a hold's lease, or the kept record)
			if h := holderOf(); h != nil {
				endHold(h, false)
			}
			r.dropHash()
			log = append(log, "record expired")
		case op < 75: // the queue keys expire
			r.do("DEL", r.keys.lock[2], r.keys.lock[3])
			for _, w := range owners {
				w.queued = ""
			}
			log = append(log, "queue expired")
		case op < 78: // the tombstones expire
			r.do("DEL", r.keys.lock[1])
			givenBack = map[string]bool{}
			log = append(log, "tombstones expired")
		case op < 80: // Redis restarts without persistence
			r.do("DEL", r.keys.lock[0], r.keys.lock[1], r.keys.lock[2], r.keys.lock[3])
			if h := holderOf(); h != nil {
				endHold(h, false)
			}
			for _, w := range owners {
				w.queued = ""
			}
			givenBack = map[string]bool{}
			log = append(log, "restart")
		case op < 86: // a waiter dies: its entry is left to expire
			if o.queued == "" {
				continue
			}
			r.do("HSET", r.keys.lock[3], o.queued, "1 "+o.name)
			log = append(log, "waiter died: "+o.queued)
			o.queued = ""
		default: // the queue refresh of a waiting fair Lock
			if o.queued == "" {
				continue
			}
			n := r.refreshOne(o.name, o.queued, lease)
			desc = fmt.Sprintf("refresh %s %s -> %d", o.name, o.queued, n)
			log = append(log, desc)
			switch n {
			case 0:
				fail("%s: a live waiter's entry is gone", desc)
			case 2:
				if r.field("o") != "" {
					fail("%s: refresh said free, record held by %q", desc, r.field("o"))
				}
			}
		}
		stats["k="+r.field("k")]++
		r.checkFlags(fmt.Sprintf("seed %d step %d (%s)", seed, step, desc))
	}
}

// TestQueueKeysOutliveLiveEntries (a bug found in review, fixed: the queue
// keys' TTL is now only ever extended): Mutexes of one lock name may have
// different leases (WithLease is per Mutex), and a fair waiter's entry
// lives a lease of its own Mutex after its last refresh, refreshed every
// min(lease/3, 1 s). A waiter with a short lease that queues (or is
// refreshed) sets the TTL of the whole queue, and of every other waiter's
// entry, to its own lease: when it leaves, the keys expire before the
// long-lease waiter's next refresh, and that waiter, whose entry was live,
// loses its place to one that arrived after it. FIFO (documented: "waiting
// Locks queue in Redis in arrival order", "an entry not refreshed for a
// lease is dead") breaks.
func TestQueueKeysOutliveLiveEntries(t *testing.T) {
	r := newReviewRig(t, "review-queue-ttl")
	h := r.takeL("H", "h.1", "", "30000")
	if h[0] != 1 {
		t.Fatalf("H = %v", h)
	}
	// W1: lease 30 s, so its Locker refreshes its entry every second.
	if w := r.takeL("W1", "w1.1", "f", "30000"); w[0] != 0 {
		t.Fatalf("W1 = %v, want queued", w)
	}
	// W2: lease 300 ms, queues behind W1 and gives up.
	if w := r.takeL("W2", "w2.1", "f", "300"); w[0] != 0 {
		t.Fatalf("W2 = %v, want queued", w)
	}
	r.giveBackL("W2", "w2.1", "300")

	entry, err := r.do("HGET", r.keys.lock[3], "w1.1").ToString()
	if err != nil {
		t.Fatal(err)
	}
	expiry, _ := strconv.ParseInt(strings.Fields(entry)[0], 10, 64)
	tm, err := r.do("TIME").AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	sec, _ := strconv.ParseInt(tm[0], 10, 64)
	usec, _ := strconv.ParseInt(tm[1], 10, 64)
	left := expiry - (sec*1000 + usec/1000)
	qttl, ettl := r.int("PTTL", r.keys.lock[2]), r.int("PTTL", r.keys.lock[3])
	t.Logf("W1's entry lives %d ms more; queue PTTL %d ms, entries PTTL %d ms", left, qttl, ettl)
	// W1 is refreshed at most a second from now: the keys must live that
	// long at least (strictly, as long as W1's live entry).
	if qttl < 1000 || ettl < 1000 {
		// What the expiry does: W3 arrives after W1, yet is served first.
		r.do("DEL", r.keys.lock[2], r.keys.lock[3]) // the keys' TTLs run out
		if w := r.takeL("W3", "w3.1", "f", "30000"); w[0] != 0 {
			t.Fatalf("W3 = %v, want queued", w)
		}
		refreshed := r.refreshOne("W1", "w1.1", "30000") // W1's next refresh: not queued
		if refreshed == 0 {
			r.takeL("W1", "w1.1", "f", "30000") // W1 looks for itself: queues again, at the tail
		}
		r.unlock("H", h[0+2])
		t.Fatalf("the queue keys expire in %d/%d ms while W1's entry, refreshed every second, lives %d ms more: "+
			"W1's refresh then found it not queued (%d), and H's release handed the lock to %q (attempt %q), who queued after W1",
			qttl, ettl, left, refreshed, r.field("o"), r.field("a"))
	}
}

// TestManyDeadBeforeLiveWaiter: more dead entries than a release
// drops sit before a live waiter. The release leaves the lock free with q
// still flagged; the waiter's refresh reports the lock free, and its own
// attempts drop the rest and take it: the queue stalls no longer than a few
// calls.
func TestManyDeadBeforeLiveWaiter(t *testing.T) {
	r := newReviewRig(t, "review-dead-head")
	h := r.takeL("H", "h.1", "", "30000")
	for i := 1; i <= 20; i++ {
		id := "d" + strconv.Itoa(i) + ".1"
		if got := r.takeL("D"+strconv.Itoa(i), id, "f", "30000"); got[0] != 0 {
			t.Fatalf("dead-to-be waiter %s = %v", id, got)
		}
		r.do("HSET", r.keys.lock[3], id, "1 D"+strconv.Itoa(i)) // it dies
	}
	if got := r.takeL("W", "w.1", "f", "30000"); got[0] != 0 {
		t.Fatalf("W = %v, want queued", got)
	}
	r.dropHash() // H's lease runs out while they wait: the record is made again below
	c := r.takeL("C", "c.1", "", "30000")
	if c[0] != 1 || c[2] <= h[2] {
		t.Fatalf("C = %v", c)
	}
	if k := r.field("k"); k != "q" {
		t.Fatalf("k = %q after a grant that made the record with a queue, want q", k)
	}
	r.checkFlags("C holds")
	if n := r.unlock("C", c[2]); n != 0 {
		t.Fatalf("C's unlock = %d", n)
	}
	r.checkFlags("C released")
	if o := r.field("o"); o != "" {
		t.Fatalf("held by %q; 16 dead entries were to be dropped, not the live waiter reached", o)
	}
	if n := r.refreshOne("W", "w.1", "30000"); n != 2 {
		t.Fatalf("W's refresh = %d, want 2 (queued, lock free)", n)
	}
	if got := r.takeL("X", "x.1", "t", "30000"); got[0] != 0 {
		t.Fatalf("a fair TryLock while W waits = %v, want refused", got)
	}
	var got []int64
	for i := 0; i < 3; i++ {
		if got = r.takeL("W", "w.1", "f", "30000"); got[0] != 0 {
			break
		}
	}
	if got[0] != 1 || got[2] <= c[2] {
		t.Fatalf("W = %v, want the lock with a token above %d within 3 calls", got, c[2])
	}
	r.checkFlags("W holds")
	if n := r.unlock("W", got[2]); n != 0 {
		t.Fatalf("W's unlock = %d", n)
	}
	if k := r.field("k"); k != "" {
		t.Fatalf("k = %q after the queue emptied, want none", k)
	}
	r.checkFlags("W released")
}

// TestTombstoneSparesOtherAttempts (a bug found in review, fixed: a
// tombstone now names the abandoned attempt id alone). A tombstone was
// "nonce -> highest abandoned seq", and mutex_lock refused every attempt of that
// Mutex value with a seq up to it. But one Mutex value may have several
// Locks waiting at once (two goroutines; package mutex handles a Lock that
// finds another goroutine of its Mutex holding the lock, and a grant handed
// to one while another holds), each with its own attempt id, in the order
// they started. When the later Lock gives up (a fair waiter whose ctx ends
// leaves the queue with a give-back; any Lock whose ctx ends mid-request
// gives its attempt back), its tombstone also refuses the earlier Lock,
// which is still waiting and was never abandoned:
//   - unfair: the lock is free, nobody else wants it, and the earlier Lock's
//     every attempt is refused for as long as the tombstone lives (a lease,
//     extended by every later give-back of that Mutex);
//   - fair, the lock free under the queue (the holder expired): the
//     earlier waiter is the live head and is refused, so every waiter
//     behind it is told "not your turn": the queue stalls beyond the
//     documented bound (taken at the next refresh);
//   - fair, a release hands the lock to the earlier waiter and it confirms
//     with its own attempt (its message was lost, or ReplicaAcks, where the
//     attempt always confirms): refused, so the grant is one nobody knows
//     of, and the waiter, no longer queued, never gets the lock.
func TestTombstoneSparesOtherAttempts(t *testing.T) {
	t.Run("unfair", func(t *testing.T) {
		r := newReviewRig(t, "review-poison-unfair")
		h := r.takeL("H", "h.1", "", "30000")
		if got := r.takeL("W", "w.1", "", "30000"); got[0] != 0 {
			t.Fatalf("W's first Lock = %v, want refused while H holds", got)
		}
		if got := r.takeL("W", "w.2", "", "30000"); got[0] != 0 {
			t.Fatalf("W's second Lock = %v, want refused while H holds", got)
		}
		r.giveBackL("W", "w.2", "30000") // the second Lock's ctx ended mid-request
		r.unlock("H", h[2])
		got := r.takeL("W", "w.1", "", "30000") // the first Lock, woken by H's release
		if got[0] != 1 {
			t.Fatalf("W's first Lock, never abandoned, on a free lock nobody else wants = %v, want granted "+
				"(refused by the tombstone of W's later attempt w.2)", got)
		}
	})
	t.Run("fair-free-under-queue", func(t *testing.T) {
		r := newReviewRig(t, "review-poison-fair-free")
		r.takeL("H", "h.1", "", "30000")
		if got := r.takeL("W", "w.1", "f", "30000"); got[0] != 0 {
			t.Fatalf("W's first Lock = %v, want queued", got)
		}
		if got := r.takeL("W", "w.2", "f", "30000"); got[0] != 0 {
			t.Fatalf("W's second Lock = %v, want queued", got)
		}
		if got := r.takeL("V", "v.1", "f", "30000"); got[0] != 0 {
			t.Fatalf("V = %v, want queued", got)
		}
		r.giveBackL("W", "w.2", "30000") // the second Lock gives up: it leaves the queue
		r.dropHash()                     // H's lease runs out
		if n := r.refreshOne("W", "w.1", "30000"); n != 2 {
			t.Fatalf("W's refresh = %d, want 2 (lock free)", n)
		}
		w := r.takeL("W", "w.1", "f", "30000")
		v := r.takeL("V", "v.1", "f", "30000")
		if w[0] != 1 {
			t.Fatalf("the live head W (w.1), told by its refresh that the lock is free, = %v, want granted; "+
				"V behind it = %v (not its turn): the queue stalls while W's tombstone lives", w, v)
		}
	})
	t.Run("fair-handoff-confirmed-by-attempt", func(t *testing.T) {
		r := newReviewRig(t, "review-poison-fair-handoff")
		h := r.takeL("H", "h.1", "", "30000")
		r.takeL("W", "w.1", "f", "30000")
		r.takeL("W", "w.2", "f", "30000")
		r.giveBackL("W", "w.2", "30000")
		r.unlock("H", h[2]) // hands the lock to w.1
		if o, a := r.field("o"), r.field("a"); o != "W" || a != "w.1" {
			t.Fatalf("after H's release the record names %q %q, want W w.1", o, a)
		}
		got := r.takeL("W", "w.1", "f", "30000") // W's next attempt (message lost, or ReplicaAcks)
		if got[0] != 2 {
			t.Fatalf("W's attempt w.1, which the record names as the holder, = %v, want {2, 1, token}: "+
				"the hand-off is a grant nobody knows of, and W, no longer queued, is refused until the tombstone ends", got)
		}
	})
}

// TestGiveUpSparesOtherLocksOfTheMutex is the fair case above through the
// API: one Mutex, two goroutines Locking; the second gives up (its ctx
// ends) while queued, and its give-back's tombstone refused the first, the
// live head of the queue, once the holder's lease had run out: the first
// Lock did not get the free lock at its next refresh (a second), nor in
// five. Now it does.
func TestGiveUpSparesOtherLocksOfTheMutex(t *testing.T) {
	// secondGivesUp false is the control: the first Lock gets the lock.
	for _, secondGivesUp := range []bool{false, true} {
		t.Run("secondGivesUp="+strconv.FormatBool(secondGivesUp), func(t *testing.T) {
			poisonAPI(t, secondGivesUp)
		})
	}
}

func poisonAPI(t *testing.T, secondGivesUp bool) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l := newLocker(t, client, mutex.Options{Fair: true})
	name := "review-poison-api-" + strconv.FormatBool(secondGivesUp)
	h := newMutex(t, l, name)
	if err := h.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	w := newMutex(t, l, name)

	first := make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		first <- w.Lock(lctx)
	}()
	waitQueued(t, client, name, 1)
	if secondGivesUp {
		sctx, cancel := context.WithCancel(ctx)
		second := make(chan error, 1)
		go func() { second <- w.Lock(sctx) }()
		waitQueued(t, client, name, 2)
		cancel()
		if err := <-second; !errors.Is(err, mutex.ErrNotObtained) {
			t.Fatalf("second Lock = %v, want ErrNotObtained", err)
		}
		waitQueued(t, client, name, 1) // its give-back took it out of the queue
	}

	// The holder's lease runs out (its record expires).
	if err := client.Do(ctx, client.B().Del().Key(lockKey(name)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first Lock, the live head of the queue of a free lock, = %v, want the lock within its 5 s "+
			"(the Locker refreshes its entry every second and wakes it when the lock is free)", err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
