package mutex_test

// Class tests of mutex_lock's paths past the common one (issue 32): the
// flags a new record takes from the keys, the fair queue (whose turn it
// is, dead entries, the caller's own entry), a given-back attempt's
// refusal, and an outermost Lock that finds its own owner (the same
// attempt, an older one, a newer one, and the run c it extends up to its
// 17 entries). Each state is written by hand, exactly on the branch or
// bound, and the whole result is asserted: the raw reply (an integer or a
// table, as the header promises), the record byte for byte, its TTL, and
// the queue keys and tombstones, both what must change and what must not.
// The records are written with a last token far ahead of the server's
// clock, so that every token granted is known in advance (f + 1).

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/scriptcache"
)

// lockClassRig calls mutex_lock directly on the keys of one fresh lock.
type lockClassRig struct {
	*reviewRig
	t *testing.T
	// ahead is a token far ahead of the server's clock (about 11 days).
	ahead int64
}

func newLockClassRig(t *testing.T, prefix string) *lockClassRig {
	t.Helper()
	r := &lockClassRig{reviewRig: newReviewRig(t, className(prefix)), t: t}
	r.ahead = serverMicros(t, r.client) + 1_000_000_000_000
	// Some keys are written here without a TTL: a failing test must not
	// leave them behind.
	t.Cleanup(func() {
		r.client.Do(context.Background(), r.client.B().Del().Key(r.keys.lock...).Build())
	})
	return r
}

// rawLock runs mutex_lock with keys (the first n of the lock's) and
// args, and returns its reply as it came: isInt tells an integer from a
// table of three.
func (r *lockClassRig) rawLock(n int, args ...string) (vs []int64, isInt bool) {
	r.t.Helper()
	rep := r.lock.Exec(r.ctx, r.keys.lock[:n], args)
	return rawReply(r.t, rep)
}

func rawReply(t *testing.T, rep scriptcache.Reply) ([]int64, bool) {
	t.Helper()
	if err := rep.Error(); err != nil {
		t.Fatalf("mutex_lock: %v", err)
	}
	if v, err := rep.AsInt64(); err == nil {
		return []int64{v}, true
	}
	vs, err := rep.AsIntSlice()
	if err != nil || len(vs) != 3 {
		t.Fatalf("mutex_lock's reply = %v, %v; want an integer or a table of three", vs, err)
	}
	return vs, false
}

// set writes the lock record v with a TTL of pxMs (none if 0).
func (r *lockClassRig) set(v string, pxMs int64) {
	r.t.Helper()
	args := []string{"SET", r.keys.lock[0], v}
	if pxMs > 0 {
		args = append(args, "PX", strconv.FormatInt(pxMs, 10))
	}
	if err := r.do(args...).Error(); err != nil {
		r.t.Fatal(err)
	}
}

// get returns the record ("" if none).
func (r *lockClassRig) get() string {
	r.t.Helper()
	v, err := r.do("GET", r.keys.lock[0]).ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		r.t.Fatal(err)
	}
	return v
}

// pttl returns the PTTL of the i-th key of the lock.
func (r *lockClassRig) pttl(i int) int64 {
	r.t.Helper()
	return r.int("PTTL", r.keys.lock[i])
}

// nowMs is the server's clock in ms.
func (r *lockClassRig) nowMs() int64 { return serverMicros(r.t, r.client) / 1000 }

// queue writes the queue: each id with its score (1, 2, ...) and, where
// expiry is not "", its entry "expiry owner" (expiry in ms, absolute).
// The keys live a minute.
func (r *lockClassRig) queue(entries ...[3]string) {
	r.t.Helper()
	for i, e := range entries {
		r.int("ZADD", r.keys.lock[2], strconv.Itoa(i+1), e[0])
		if e[1] != "" {
			r.int("HSET", r.keys.lock[3], e[0], e[1]+" "+e[2])
		}
	}
	r.int("PEXPIRE", r.keys.lock[2], "60000")
	if len(entries) > 0 && r.int("EXISTS", r.keys.lock[3]) == 1 {
		r.int("PEXPIRE", r.keys.lock[3], "60000")
	}
}

// queued returns the queue as "id:score" and the entries as "id=entry",
// both sorted.
func (r *lockClassRig) queued() (q, e []string) {
	r.t.Helper()
	zs, err := r.do("ZRANGE", r.keys.lock[2], "0", "-1", "WITHSCORES").AsZScores()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, z := range zs {
		q = append(q, z.Member+":"+strconv.FormatFloat(z.Score, 'f', -1, 64))
	}
	m, err := r.do("HGETALL", r.keys.lock[3]).AsStrMap()
	if err != nil {
		r.t.Fatal(err)
	}
	for k, v := range m {
		e = append(e, k+"="+v)
	}
	slices.Sort(e)
	return q, e
}

// tombs returns the tombstones' fields, sorted.
func (r *lockClassRig) tombs() []string {
	r.t.Helper()
	ks, err := r.do("HKEYS", r.keys.lock[1]).AsStrSlice()
	if err != nil {
		r.t.Fatal(err)
	}
	slices.Sort(ks)
	return ks
}

// wantTTL checks that the i-th key's PTTL is in (lo, hi].
func (r *lockClassRig) wantTTL(what string, i int, lo, hi int64) {
	r.t.Helper()
	if ttl := r.pttl(i); ttl <= lo || ttl > hi {
		r.t.Errorf("%s: PTTL of %s = %d, want in (%d, %d]", what, r.keys.lock[i], ttl, lo, hi)
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// TestScriptLockClassNewRecordFlags: with no record, the grant makes one
// whose flags say what the other keys hold then (EXISTS): q if the queue
// has entries, x if tombstones exist, both, or neither; never a flag for a
// key that is empty (a needless flag costs every later call a look) and
// never a missing one (a missing flag means an empty key: the tombstone
// would be missed, or the queue not handed to). An unfair Lock that waited
// ("w") adds w. A new record starts its run at its token, taken from the
// server's clock (there is no last token), and the other keys are left as
// they were (an unfair Lock ignores the queue).
func TestScriptLockClassNewRecordFlags(t *testing.T) {
	for _, c := range []struct{ tombs, queue bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		for _, mode := range []string{"", "w"} {
			t.Run(fmt.Sprintf("tombs=%v,queue=%v,mode=%q", c.tombs, c.queue, mode), func(t *testing.T) {
				r := newLockClassRig(t, "class-newrec")
				now := r.nowMs()
				if c.tombs {
					r.int("HSET", r.keys.lock[1], "gone.1", "1")
					r.int("PEXPIRE", r.keys.lock[1], "60000")
				}
				if c.queue {
					r.queue([3]string{"v.1", itoa(now + 60000), "V"})
				}
				q0, e0 := r.queued()
				before := serverMicros(t, r.client)
				args := lockArgs("A", "30000", "a.1", mode)
				got, isInt := r.rawLock(3, args...)
				after := serverMicros(t, r.client)
				if !isInt || got[0] < before || got[0] > after {
					t.Fatalf("Lock on no record = %v (integer %v), want a token from the clock in [%d, %d]", got, isInt, before, after)
				}
				k := ""
				if c.queue {
					k += "q"
				}
				if c.tombs {
					k += "x"
				}
				if mode == "w" {
					k += "w"
				}
				tok := itoa(got[0])
				if v, want := r.get(), "L"+k+":"+tok+":"+tok+"|1:a.1:A"; v != want {
					t.Errorf("record = %q, want %q", v, want)
				}
				r.wantTTL("record", 0, 0, 30000)
				if q, e := r.queued(); !slices.Equal(q, q0) || !slices.Equal(e, e0) {
					t.Errorf("queue %v entries %v after an unfair grant, want them unchanged (%v, %v)", q, e, q0, e0)
				}
				var wantTombs []string
				if c.tombs {
					wantTombs = []string{"gone.1"}
				}
				if ts := r.tombs(); !slices.Equal(ts, wantTombs) {
					t.Errorf("tombstones = %v after the grant, want them unchanged", ts)
				}
			})
		}
	}
}

// TestScriptLockClassFairTurn: a fair call on a free lock whose record
// flags the queue takes it only if no live waiter is queued before it. The
// states: the caller's own entry at the head (it takes the lock, and its
// entry leaves both queue keys; a waiter behind it stays); a live waiter
// at the head (refused with the table {0, -2, 0}; a fair Lock queues at
// the tail, one past the last score (with two waiters queued, not one
// past the second-last, which would tie with the last), with an entry "expiry owner" a lease
// from now and the queue keys living at least a lease; a fair TryLock
// ("t") does not queue; both mark the record w and keep everything else);
// dead heads before a live waiter (dropped from both keys, then as the
// live head), a head without an entry (dead), and dead heads only (all
// dropped, the lock taken with the next token and the flags kept). With no
// record, a refused fair Lock queues but writes no record.
func TestScriptLockClassFairTurn(t *testing.T) {
	type step struct {
		name   string
		record bool        // a free record "Lq:F:F|" (else none)
		q      [][3]string // the queue, in order: id, expiry ("" none, "+" live, "-" dead), owner
		mode   string
		// Wanted: granted; else refused with -2, and queued (mode f).
		grant bool
		// The queue and entries left of the ones written (ids), the
		// caller's own not counted.
		left []string
	}
	for _, c := range []step{
		{name: "own entry at head", record: true, q: [][3]string{{"b.1", "+", "B"}, {"v.1", "+", "V"}}, mode: "f", grant: true, left: []string{"v.1"}},
		{name: "own entry alone", record: true, q: [][3]string{{"b.1", "+", "B"}}, mode: "f", grant: true},
		{name: "own entry alone, no record", q: [][3]string{{"b.1", "+", "B"}}, mode: "f", grant: true},
		{name: "live head", record: true, q: [][3]string{{"v.1", "+", "V"}}, mode: "f", left: []string{"v.1"}},
		{name: "live head, try", record: true, q: [][3]string{{"v.1", "+", "V"}}, mode: "t", left: []string{"v.1"}},
		{name: "live head, no record", q: [][3]string{{"v.1", "+", "V"}}, mode: "f", left: []string{"v.1"}},
		{name: "two live waiters", record: true, q: [][3]string{{"v.1", "+", "V"}, {"u.1", "+", "U"}}, mode: "f", left: []string{"v.1", "u.1"}},
		{name: "dead heads then live", record: true, q: [][3]string{{"d.1", "-", "D"}, {"n.1", "", "N"}, {"v.1", "+", "V"}}, mode: "f", left: []string{"v.1"}},
		{name: "dead heads then own", record: true, q: [][3]string{{"d.1", "-", "D"}, {"n.1", "", "N"}, {"b.1", "+", "B"}, {"v.1", "+", "V"}}, mode: "f", grant: true, left: []string{"v.1"}},
		{name: "dead heads only", record: true, q: [][3]string{{"d.1", "-", "D"}, {"n.1", "", "N"}}, mode: "f", grant: true},
		{name: "dead heads only, try", record: true, q: [][3]string{{"d.1", "-", "D"}, {"n.1", "", "N"}}, mode: "t", grant: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newLockClassRig(t, "class-fairturn")
			now := r.nowMs()
			var q [][3]string
			for _, e := range c.q {
				switch e[1] {
				case "+":
					e[1] = itoa(now + 60000)
				case "-":
					e[1] = itoa(now - 60000)
				}
				q = append(q, e)
			}
			r.queue(q...)
			f := itoa(r.ahead)
			rec := "Lq:" + f + ":" + f + "|"
			if c.record {
				r.set(rec, 50000)
			}
			// What must stay of the queue: the entries named in left,
			// as written.
			var wantQ, wantE []string
			last := 0
			for i, e := range q {
				if slices.Contains(c.left, e[0]) {
					wantQ = append(wantQ, e[0]+":"+strconv.Itoa(i+1))
					if e[1] != "" {
						wantE = append(wantE, e[0]+"="+e[1]+" "+e[2])
					}
				}
				last = i + 1
			}
			t1 := r.nowMs()
			got, isInt := r.rawLock(4, "30000", "B", "b.1", c.mode)
			t2 := r.nowMs()
			if c.grant {
				want := r.ahead + 1
				if !c.record {
					if !isInt || got[0] < t1*1000 || got[0] > (t2+1)*1000 {
						t.Fatalf("fair Lock = %v (integer %v), want a token from the clock", got, isInt)
					}
					want = got[0]
				}
				if !isInt || got[0] != want {
					t.Fatalf("fair Lock = %v (integer %v), want the token %d", got, isInt, want)
				}
				tok := itoa(want)
				wantRec := "Lq:" + tok + ":" + f + "|1:b.1:B" // the run carried over
				if !c.record {
					wantRec = "Lq:" + tok + ":" + tok + "|1:b.1:B"
				}
				if v := r.get(); v != wantRec {
					t.Errorf("record = %q, want %q", v, wantRec)
				}
				r.wantTTL("record", 0, 0, 30000)
			} else {
				if isInt || !slices.Equal(got, []int64{0, -2, 0}) {
					t.Fatalf("fair call behind a live waiter = %v (integer %v), want the table {0 -2 0}", got, isInt)
				}
				wantRec := ""
				if c.record {
					wantRec = "Lqw:" + f + ":" + f + "|"
				}
				if v := r.get(); v != wantRec {
					t.Errorf("record = %q, want %q (marked w, nothing else)", v, wantRec)
				}
				if c.record {
					r.wantTTL("record", 0, 0, 50000)
					if ttl := r.pttl(0); ttl <= 30000 {
						t.Errorf("record's PTTL = %d after a refusal, want its own (up to 50000) kept", ttl)
					}
				}
				if c.mode == "f" {
					wantQ = append(wantQ, "b.1:"+strconv.Itoa(last+1))
					entry := ""
					for _, e := range r.mustQueued() {
						if strings.HasPrefix(e, "b.1=") {
							entry = e
						}
					}
					exp, owner, _ := strings.Cut(strings.TrimPrefix(entry, "b.1="), " ")
					ms, err := strconv.ParseInt(exp, 10, 64)
					if err != nil || owner != "B" || ms < t1+30000 || ms > t2+30000 {
						t.Errorf("B's entry = %q, want \"expiry B\" with expiry in [%d, %d] (a lease from now)", entry, t1+30000, t2+30000)
					}
					wantE = append(wantE, entry)
					slices.Sort(wantE)
				}
			}
			gotQ, gotE := r.queued()
			if !slices.Equal(gotQ, wantQ) || !slices.Equal(gotE, wantE) {
				t.Errorf("queue %v, entries %v; want %v, %v", gotQ, gotE, wantQ, wantE)
			}
			if len(wantQ) > 0 {
				// The queue keys were written to live a minute: a
				// shorter lease does not cut them.
				r.wantTTL("queue", 2, 30000, 60000)
				r.wantTTL("entries", 3, 30000, 60000)
			} else if n := r.int("EXISTS", r.keys.lock[2], r.keys.lock[3]); n != 0 {
				t.Errorf("the emptied queue keys exist (%d), want both gone", n)
			}
		})
	}
}

// mustQueued returns the entries (see queued).
func (r *lockClassRig) mustQueued() []string {
	_, e := r.queued()
	return e
}

// TestScriptLockClassFairQueueKeysLiveALease: a fair Lock refused by a
// holder queues, and the queue keys live at least its lease: a key with a
// shorter TTL (or a new one) is extended to the lease, a longer one is left
// alone, each key by its own TTL (the queue and its entries may end at
// different times: a waiter's entry and the queue are refreshed one by
// one). A refusal by a holder is -1 - W, an integer, W the holder's
// remaining lease.
func TestScriptLockClassFairQueueKeysLiveALease(t *testing.T) {
	// A key's PTTL after the call, by its TTL before (0: no key).
	after := func(beforeMs int64) (lo, hi int64) {
		if beforeMs > 30000 {
			return 30000, beforeMs
		}
		return 20000, 30000
	}
	for _, c := range []struct {
		name     string
		qMs, eMs int64 // the queue keys' TTLs before (0: no keys)
	}{
		{name: "no queue"},
		{name: "shorter queue", qMs: 5000, eMs: 5000},
		{name: "longer queue", qMs: 60000, eMs: 60000},
		{name: "queue shorter than its entries", qMs: 5000, eMs: 60000},
		{name: "entries shorter than the queue", qMs: 60000, eMs: 5000},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newLockClassRig(t, "class-fairttl")
			f := itoa(r.ahead)
			k := ""
			if c.qMs > 0 {
				k = "q"
				r.queue([3]string{"v.1", itoa(r.nowMs() + 60000), "V"})
				r.int("PEXPIRE", r.keys.lock[2], itoa(c.qMs))
				r.int("PEXPIRE", r.keys.lock[3], itoa(c.eMs))
			}
			r.set("L"+k+":"+f+":"+f+"|3:h.1:H", 40000)
			got, isInt := r.rawLock(4, "30000", "B", "b.1", "f")
			if !isInt || got[0] > -1-20000 || got[0] < -1-40000 {
				t.Fatalf("fair Lock while H holds = %v (integer %v), want -1 - W, W H's remaining lease (up to 40000)", got, isInt)
			}
			if v, want := r.get(), "Lqw:"+f+":"+f+"|3:h.1:H"; v != want {
				t.Errorf("record = %q, want %q", v, want)
			}
			r.wantTTL("record", 0, 20000, 40000)
			lo, hi := after(c.qMs)
			r.wantTTL("queue", 2, lo, hi)
			lo, hi = after(c.eMs)
			r.wantTTL("entries", 3, lo, hi)
			q, _ := r.queued()
			want := []string{"b.1:1"}
			if c.qMs > 0 {
				want = []string{"v.1:1", "b.1:2"}
			}
			if !slices.Equal(q, want) {
				t.Errorf("queue = %v, want %v", q, want)
			}
			// Again, while queued: the entry is refreshed, not queued
			// twice, and the record is not written again.
			got, _ = r.rawLock(4, "30000", "B", "b.1", "f")
			if got[0] >= 0 {
				t.Fatalf("fair Lock again = %v, want refused", got)
			}
			if q2, _ := r.queued(); !slices.Equal(q2, want) {
				t.Errorf("queue after the second call = %v, want %v", q2, want)
			}
			if v, want := r.get(), "Lqw:"+f+":"+f+"|3:h.1:H"; v != want {
				t.Errorf("record = %q after the second call, want %q", v, want)
			}
		})
	}
}

// TestScriptLockClassTombstone: an attempt whose give-back left a
// tombstone is refused whatever the lock's state, with an integer -1 - W
// (W = 0 when the lock is free, the holder's remaining lease when held),
// or the table {0, -1, 0} when the holder's key has no expiry; it takes
// nothing, queues nothing (not even a fair Lock) and writes nothing. Other
// attempts are not refused for it. With no record the tombstones are found
// by EXISTS (the record's x flag is gone with it).
func TestScriptLockClassTombstone(t *testing.T) {
	for _, c := range []struct {
		name   string
		record string // "" none; else the record, F for the token
		pxMs   int64
		want   func(v int64) bool
		isInt  bool
	}{
		{name: "no record", want: func(v int64) bool { return v == -1 }, isInt: true},
		{name: "free", record: "Lx:F:F|", pxMs: 5000, want: func(v int64) bool { return v == -1 }, isInt: true},
		{name: "held", record: "Lx:F:F|1:h.1:H", pxMs: 40000, want: func(v int64) bool { return v <= -1-20000 && v >= -1-40000 }, isInt: true},
		{name: "held, no expiry", record: "Lx:F:F|1:h.1:H", want: func(v int64) bool { return v == -1 }},
	} {
		for _, mode := range []string{"", "f", "t"} {
			t.Run(c.name+",mode="+mode, func(t *testing.T) {
				r := newLockClassRig(t, "class-tomb")
				f := itoa(r.ahead)
				r.int("HSET", r.keys.lock[1], "b.1", "1")
				r.int("PEXPIRE", r.keys.lock[1], "60000")
				rec := strings.ReplaceAll(c.record, "F", f)
				if rec != "" {
					r.set(rec, c.pxMs)
				}
				n := 4
				if mode == "" {
					n = 3
				}
				got, isInt := r.rawLock(n, lockArgs("B", "30000", "b.1", mode)...)
				if isInt != c.isInt || (isInt && !c.want(got[0])) || (!isInt && (got[0] != 0 || !c.want(got[1]) || got[2] != 0)) {
					t.Fatalf("the given-back attempt = %v (integer %v), want %s's refusal", got, isInt, c.name)
				}
				if v := r.get(); v != rec {
					t.Errorf("record = %q, want it unchanged (%q)", v, rec)
				}
				if n := r.int("EXISTS", r.keys.lock[2], r.keys.lock[3]); n != 0 {
					t.Errorf("the refused attempt queued (%d queue keys)", n)
				}
				if ts := r.tombs(); !slices.Equal(ts, []string{"b.1"}) {
					t.Errorf("tombstones = %v, want [b.1]", ts)
				}
				if c.name != "no record" && c.name != "free" {
					return
				}
				// Another attempt of the same owner is granted.
				got, isInt = r.rawLock(n, lockArgs("B", "30000", "b.2", mode)...)
				if !isInt || got[0] <= 0 {
					t.Fatalf("another attempt beside the tombstone = %v, want granted", got)
				}
				if v := r.get(); !strings.HasPrefix(v, "Lx") || !strings.HasSuffix(v, "|1:b.2:B") {
					t.Errorf("record after the other attempt = %q, want x kept and b.2's hold", v)
				}
			})
		}
	}
}

// TestScriptLockClassSameOwner: an outermost Lock that finds its own owner
// holding. The same attempt is told {2, holds, token} with the record's
// holds and token, and only the lease changes. An older attempt of the
// same Mutex value (same nonce, lower seq) is refused with -1 - W and
// marks w, queuing nothing even when fair; the same seq of another nonce,
// a newer one, or the same seq written otherwise ("m.05" after "m.5":
// seqs compare as numbers, and it is not older) starts a new acquisition with the next token, and the
// run c lists the superseded token. The run keeps its start and at most 16
// listed tokens: a 17th pushes the oldest out, and the run then starts
// one past it.
func TestScriptLockClassSameOwner(t *testing.T) {
	r := newLockClassRig(t, "class-sameowner")
	f := r.ahead
	fs := itoa(f)
	start := itoa(f - 100)

	r.set("L:"+fs+":"+start+"|3:m.5:A", 5000)
	got, isInt := r.rawLock(3, "30000", "A", "m.5")
	if isInt || !slices.Equal(got, []int64{2, 3, f}) {
		t.Fatalf("the holding attempt again = %v, want {2 3 %d}", got, f)
	}
	if v, want := r.get(), "L:"+fs+":"+start+"|3:m.5:A"; v != want {
		t.Errorf("record = %q, want it unchanged %q", v, want)
	}
	r.wantTTL("record after the same attempt", 0, 5000, 30000)

	for _, mode := range []string{"", "f"} {
		r.set("L:"+fs+":"+start+"|3:m.5:A", 40000)
		n := 3
		if mode == "f" {
			n = 4
		}
		got, isInt = r.rawLock(n, lockArgs("A", "30000", "m.4", mode)...)
		if !isInt || got[0] > -1-20000 || got[0] < -1-40000 {
			t.Fatalf("an older attempt (mode %q) = %v (integer %v), want -1 - W, W the remaining lease", mode, got, isInt)
		}
		if v, want := r.get(), "Lw:"+fs+":"+start+"|3:m.5:A"; v != want {
			t.Errorf("record after an older attempt (mode %q) = %q, want %q (w only)", mode, v, want)
		}
		r.wantTTL("record after an older attempt", 0, 20000, 40000)
		if n := r.int("EXISTS", r.keys.lock[2], r.keys.lock[3]); n != 0 {
			t.Errorf("an older attempt queued (mode %q)", mode)
		}
	}

	for _, c := range []struct {
		name, attempt string
		c, wantC      string
	}{
		{name: "same seq, other nonce", attempt: "n.5", c: start, wantC: start + " " + fs},
		{name: "newer attempt", attempt: "m.6", c: start, wantC: start + " " + fs},
		// Not older: the same seq, written otherwise (numbers compare).
		{name: "same seq, other text", attempt: "m.05", c: start, wantC: start + " " + fs},
		{name: "15 listed", attempt: "m.6", c: run(f, 15), wantC: run(f, 15) + " " + fs},
		{name: "16 listed", attempt: "m.6", c: run(f, 16), wantC: itoa(f-100+2) + " " + strings.SplitN(run(f, 16), " ", 3)[2] + " " + fs},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.set("L:"+fs+":"+c.c+"|1:m.5:A", 40000)
			got, isInt := r.rawLock(3, "30000", "A", c.attempt)
			if !isInt || got[0] != f+1 {
				t.Fatalf("%s = %v (integer %v), want the next token %d", c.name, got, isInt, f+1)
			}
			if v, want := r.get(), "L:"+itoa(f+1)+":"+c.wantC+"|1:"+c.attempt+":A"; v != want {
				t.Errorf("record = %q, want %q", v, want)
			}
			r.wantTTL("record after a new acquisition", 0, 0, 30000)
		})
	}
}

// run returns a run that starts 100 before f and lists n tokens after its
// start (f-100+1, ..., f-100+n), for n <= 16.
func run(f int64, n int) string {
	l := []string{itoa(f - 100)}
	for i := 1; i <= n; i++ {
		l = append(l, itoa(f-100+int64(i)))
	}
	return strings.Join(l, " ")
}

// TestScriptFairLockEntryEndingThisMillisecond: a queue entry whose expiry
// is the call's own millisecond is dead (its waiter's lease is over), so a
// fair Lock behind it drops it and takes the free lock, as mutex_release
// skips such an entry (TestReleaseSkipsEntryEndingThisMillisecond). The
// assertion holds in every iteration; only those whose call ran in the
// millisecond the entry ends (TIME before and after agree) test the
// bound, where a mutant that took such an entry as live ("expiry >= now")
// refused with -2 and queued behind a waiter that is gone.
func TestScriptFairLockEntryEndingThisMillisecond(t *testing.T) {
	r := newLockClassRig(t, "class-entry-ends-now")
	f := itoa(r.ahead)
	hits := 0
	for i := 0; i < 300 && hits < 3; i++ {
		r.int(append([]string{"DEL"}, r.keys.lock...)...)
		r.set("Lq:"+f+":"+f+"|", 30000)
		t0 := r.nowMs()
		r.queue([3]string{"d.1", itoa(t0), "D"}) // D's entry ends now
		got, isInt := r.rawLock(4, "30000", "B", "b."+strconv.Itoa(i), "f")
		if r.nowMs() == t0 {
			hits++
		}
		if !isInt || got[0] != r.ahead+1 {
			t.Fatalf("fair Lock behind an entry ending in its millisecond = %v (integer %v), want the lock (token %d)", got, isInt, r.ahead+1)
		}
		if n := r.int("EXISTS", r.keys.lock[2], r.keys.lock[3]); n != 0 {
			t.Fatalf("the queue keys after the grant: %d exist, want the dead entry dropped", n)
		}
	}
	if hits == 0 {
		t.Skip("no call ran in the millisecond its dead entry ended (a slow machine): the bound went untested")
	}
}
