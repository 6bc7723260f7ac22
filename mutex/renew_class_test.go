package mutex_test

// Class tests of the scripts that act on a hold named by owner and token
// (issue 32): mutex_renew (Extend), mutex_renew_batch (the watchdog) and
// mutex_nest (a nested Lock). Each is called directly on records written
// by hand on every side of its one test, "this owner holds this
// acquisition": the hold itself (with and without w, with flags and a run
// that lists tokens, an owner id holding ":" and "|"), the same owner under
// another token (one below, one above), another owner under the same
// token, a free record whose last token is the one sent, and no record.
// Only the hold itself is renewed or joined; for every other state the
// record, its TTL and the wake-up channel are asserted unchanged.

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// holdState is a record written before a call on a hold of owner holdOwner
// with token F: want tells whether the call must act on it.
type holdState struct {
	name   string
	record string // "" for none; F is the token sent, G and E one above and below
	want   bool
}

// holdOwner is the owner id the calls send: it holds the separators of
// the record, which only the last field may.
const holdOwner = "A:x|y"

func holdStates() []holdState {
	return []holdState{
		{name: "held", record: "L:F:F|1:a.1:" + holdOwner, want: true},
		{name: "held, flags and run", record: "Lqxw:F:E F|12:a.7:" + holdOwner, want: true},
		{name: "same owner, token below", record: "L:E:E|1:a.1:" + holdOwner},
		{name: "same owner, token above", record: "L:G:F G|1:a.2:" + holdOwner},
		{name: "other owner, same token", record: "L:F:F|1:b.1:B"},
		{name: "owner a prefix", record: "L:F:F|1:a.1:A:x"},
		{name: "free, same token", record: "L:F:F|"},
		{name: "free with w, same token", record: "Lw:F:F|"},
		{name: "none"},
	}
}

// brokenRecords are strings that start like a lock record but are not
// one: every call on a hold fails on them with WRONGTYPE and leaves them
// as they are (the renewal batch answers -1 for them).
var brokenRecords = []string{
	"L:1:1",           // no end of the run
	"L:1:1|1:a.1",     // a hold without its owner
	"L:1:1|1:a.1:",    // an empty owner
	"L:1:1|x:a.1:A",   // holds that are not a number
	"L:1:1|1::A",      // an empty attempt
	"L:1:1|:a.1:A",    // no holds
	"Lq1:1:1|1:a.1:A", // a flag that is not a letter
}

// wantBroken checks that a call on each of brokenRecords (under a key of
// its own) fails with WRONGTYPE and leaves the value.
func (h *holdRig) wantBroken(what string, call func(key, v string) error) {
	h.t.Helper()
	for _, v := range brokenRecords {
		key := lockKey(className("class-broken"))
		h.do("SET", key, v, "PX", "40000")
		if err := call(key, v); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			h.t.Errorf("%s on %q = %v, want WRONGTYPE", what, v, err)
		}
		h.check(what+" on "+v, key, v, 20000, 40000)
	}
}

// holdRig writes the states' records on locks of their own.
type holdRig struct {
	t      *testing.T
	ctx    context.Context
	client rueidis.Client
	f      int64
}

func newHoldRig(t *testing.T) *holdRig {
	t.Helper()
	client := redistest.Client(t, redistest.Single(t).Addr())
	return &holdRig{t: t, ctx: context.Background(), client: client, f: serverMicros(t, client) + 1_000_000_000_000}
}

// record returns s's record with its tokens filled in.
func (h *holdRig) record(s holdState) string {
	return strings.NewReplacer("F", strconv.FormatInt(h.f, 10), "G", strconv.FormatInt(h.f+1, 10), "E", strconv.FormatInt(h.f-1, 10)).Replace(s.record)
}

// write writes s's record under key with a TTL of 40 s and returns it.
func (h *holdRig) write(key string, s holdState) string {
	h.t.Helper()
	h.do("DEL", key)
	if s.record == "" {
		return ""
	}
	v := h.record(s)
	h.do("SET", key, v, "PX", "40000")
	return v
}

func (h *holdRig) do(args ...string) rueidis.RedisResult {
	h.t.Helper()
	r := h.client.Do(h.ctx, h.client.B().Arbitrary(args[0]).Args(args[1:]...).Build())
	if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
		h.t.Fatalf("%v: %v", args, err)
	}
	return r
}

// check checks key's record and PTTL after a call: the record is want, and
// its PTTL in (lo, hi] (-2 when there is none).
func (h *holdRig) check(what, key, want string, lo, hi int64) {
	h.t.Helper()
	v, _ := h.do("GET", key).ToString()
	if v != want {
		h.t.Errorf("%s: record = %q, want %q", what, v, want)
	}
	ttl, _ := h.do("PTTL", key).AsInt64()
	if want == "" {
		if ttl != -2 {
			h.t.Errorf("%s: PTTL = %d, want no key", what, ttl)
		}
		return
	}
	if ttl <= lo || ttl > hi {
		h.t.Errorf("%s: PTTL = %d, want in (%d, %d]", what, ttl, lo, hi)
	}
}

// TestScriptRenewClass: mutex_renew renews only the hold of the owner and
// token it is sent (1), setting the lease to exactly the new one, longer or
// shorter, and changing nothing else; every other state answers 0 and is
// left as it was. With w, a lease shorter than what is left of the old one
// publishes one wake-up ("1000000": a waiter's full wait) on the channel,
// with PUBLISH, or SPUBLISH when ARGV[4] is "s"; a longer one, or a hold
// without w, publishes nothing.
func TestScriptRenewClass(t *testing.T) {
	h := newHoldRig(t)
	sc := newScripts(t, h.client)
	renew, _ := sc.Script("mutex_renew")
	ch := "class-renew-ch:" + strconv.Itoa(int(h.f%1e9))
	count := listenBoth(t, redistest.Single(t).Addr(), ch)
	var plain, sharded int
	for _, s := range holdStates() {
		for _, c := range []struct {
			leaseMs  string
			lo, hi   int64
			pub      string
			shortens bool
		}{
			{leaseMs: "60000", lo: 40000, hi: 60000},
			{leaseMs: "10000", lo: 0, hi: 10000, shortens: true},
			{leaseMs: "10000", lo: 0, hi: 10000, pub: "s", shortens: true},
		} {
			what := s.name + ", lease " + c.leaseMs + ", " + c.pub
			key := lockKey(className("class-renew"))
			v := h.write(key, s)
			n, err := renew.Exec(h.ctx, []string{key, ch}, []string{holdOwner, strconv.FormatInt(h.f, 10), c.leaseMs, c.pub}).AsInt64()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			want := int64(0)
			if s.want {
				want = 1
			}
			if n != want {
				t.Errorf("%s: renew = %d, want %d", what, n, want)
			}
			if s.want {
				h.check(what, key, v, c.lo, c.hi)
			} else {
				h.check(what, key, v, 20000, 40000)
			}
			p, sh := count()
			wantP, wantS := 0, 0
			if s.want && c.shortens && strings.Contains(v[1:strings.Index(v, ":")], "w") {
				if c.pub == "s" {
					wantS = 1
				} else {
					wantP = 1
				}
			}
			if len(p)-plain != wantP || len(sh)-sharded != wantS {
				t.Errorf("%s: published %d with PUBLISH and %d with SPUBLISH, want %d and %d", what, len(p)-plain, len(sh)-sharded, wantP, wantS)
			}
			for _, m := range append(p[plain:], sh[sharded:]...) {
				if m != "1000000" {
					t.Errorf("%s: published %q, want \"1000000\"", what, m)
				}
			}
			plain, sharded = len(p), len(sh)
		}
	}
	h.wantBroken("renew", func(key, v string) error {
		return renew.Exec(h.ctx, []string{key, ch}, []string{"A", "1", "10000", ""}).Error()
	})
}

// TestScriptRenewBatchClass: mutex_renew_batch answers each lock of one
// call on its own, as mutex_renew would (1 renewed to the call's lease, 0
// left as it was), and -1 for a key whose value is not a lock record, in
// the order of the keys, with every state of holdStates side by side.
func TestScriptRenewBatchClass(t *testing.T) {
	h := newHoldRig(t)
	sc := newScripts(t, h.client)
	batch, _ := sc.Script("mutex_renew_batch")
	for _, leaseMs := range []string{"60000", "10000"} {
		t.Run(leaseMs, func(t *testing.T) {
			var keys, vals []string
			var want []int64
			args := []string{leaseMs}
			states := holdStates()
			for _, s := range states {
				key := lockKey(className("class-renewbatch"))
				keys, vals = append(keys, key), append(vals, h.write(key, s))
				args = append(args, holdOwner, strconv.FormatInt(h.f, 10))
				want = append(want, map[bool]int64{true: 1, false: 0}[s.want])
			}
			// Strings that are not records after them.
			for _, v := range brokenRecords {
				key := lockKey(className("class-renewbatch-not"))
				h.do("SET", key, v, "PX", "40000")
				keys, vals = append(keys, key), append(vals, v)
				args = append(args, "A", "1")
				want = append(want, -1)
			}
			got, err := batch.Exec(h.ctx, keys, args).AsIntSlice()
			if err != nil || !slices.Equal(got, want) {
				t.Fatalf("renew batch = %v, %v; want %v", got, err, want)
			}
			lease, _ := strconv.ParseInt(leaseMs, 10, 64)
			for i, key := range keys {
				what := key
				if i < len(states) {
					what = states[i].name
				}
				if want[i] == 1 {
					h.check(what, key, vals[i], max(0, lease-20000), lease)
				} else {
					h.check(what, key, vals[i], 20000, 40000)
				}
			}
		})
	}
}

// TestScriptNestClass: mutex_nest joins only the acquisition of the owner
// and token it is sent: the record's holds become the count sent plus one
// (the reply), and nothing else of the record changes, nor its TTL (the
// lease is the outer hold's). Every other state answers -1 and is left as
// it was.
func TestScriptNestClass(t *testing.T) {
	h := newHoldRig(t)
	sc := newScripts(t, h.client)
	nest, _ := sc.Script("mutex_nest")
	for _, s := range holdStates() {
		for _, holds := range []int64{1, 9} {
			what := s.name + ", holds " + strconv.FormatInt(holds, 10)
			key := lockKey(className("class-nest"))
			v := h.write(key, s)
			n, err := nest.Exec(h.ctx, []string{key}, []string{holdOwner, strconv.FormatInt(h.f, 10), strconv.FormatInt(holds, 10)}).AsInt64()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if !s.want {
				if n != -1 {
					t.Errorf("%s: nest = %d, want -1", what, n)
				}
				h.check(what, key, v, 20000, 40000)
				continue
			}
			if n != holds+1 {
				t.Errorf("%s: nest = %d, want %d", what, n, holds+1)
			}
			head, hold, _ := strings.Cut(v, "|")
			_, rest, _ := strings.Cut(hold, ":")
			wantV := head + "|" + strconv.FormatInt(holds+1, 10) + ":" + rest
			h.check(what, key, wantV, 20000, 40000)
		}
	}
	h.wantBroken("nest", func(key, v string) error {
		return nest.Exec(h.ctx, []string{key}, []string{"A", "1", "1"}).Error()
	})
}

// TestScriptQueueRefreshClass: mutex_queue_refresh answers each waiter of
// one call on its own, by its own keys and arguments: a waiter still
// queued has its entry rewritten to "now + its lease, its owner" and is
// answered 1 if the lock is held, 2 if it is free (a free record, or none:
// no release will come); a waiter no longer queued is answered 0 and no
// entry is written for it; a waiter whose record is a string that is not
// one is answered 0 (its entry refreshed). The queue keys are extended to
// the waiter's lease when they would end sooner, never shortened.
func TestScriptQueueRefreshClass(t *testing.T) {
	h := newHoldRig(t)
	sc := newScripts(t, h.client)
	refresh, _ := sc.Script("mutex_queue_refresh")
	now := serverMicros(t, h.client) / 1000
	old := strconv.FormatInt(now+1000, 10) + " old"
	type waiter struct {
		name    string
		record  string // the lock's record ("" none)
		queued  bool   // its attempt is in the queue
		queueMs int64  // the queue keys' TTL before
		leaseMs int64
		want    int64
	}
	ws := []waiter{
		{name: "held", record: "L:F:F|1:h.1:H", queued: true, queueMs: 5000, leaseMs: 30000, want: 1},
		{name: "held, long queue", record: "Lqw:F:F|1:h.1:H", queued: true, queueMs: 60000, leaseMs: 20000, want: 1},
		{name: "free", record: "Lq:F:F|", queued: true, queueMs: 5000, leaseMs: 25000, want: 2},
		{name: "no record", queued: true, queueMs: 5000, leaseMs: 35000, want: 2},
		{name: "not queued, held", record: "L:F:F|1:h.1:H", queueMs: 5000, leaseMs: 30000},
		{name: "not queued, free", record: "L:F:F|", queueMs: 5000, leaseMs: 30000},
		{name: "broken record", record: "L:F:F|1:h.1", queued: true, queueMs: 5000, leaseMs: 30000},
		{name: "not a record", record: "12345", queued: true, queueMs: 5000, leaseMs: 30000},
	}
	var keys, args []string
	var want []int64
	for i, w := range ws {
		key := lockKey(className("class-qrefresh"))
		if w.record != "" {
			h.do("SET", key, h.record(holdState{record: w.record}), "PX", "40000")
		}
		id := "w" + strconv.Itoa(i) + ".1"
		// Another waiter's entry keeps the queue keys there; the
		// waiter's own is old (it ends in a second).
		h.do("ZADD", key+":q", "1", "other.1")
		h.do("HSET", key+":e", "other.1", old)
		if w.queued {
			h.do("ZADD", key+":q", "2", id)
			h.do("HSET", key+":e", id, old)
		}
		h.do("PEXPIRE", key+":q", strconv.FormatInt(w.queueMs, 10))
		h.do("PEXPIRE", key+":e", strconv.FormatInt(w.queueMs, 10))
		keys = append(keys, key, key+":q", key+":e")
		args = append(args, id, "O"+strconv.Itoa(i), strconv.FormatInt(w.leaseMs, 10))
		want = append(want, w.want)
	}
	t1 := serverMicros(t, h.client) / 1000
	got, err := refresh.Exec(h.ctx, keys, args).AsIntSlice()
	t2 := serverMicros(t, h.client) / 1000
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("queue refresh = %v, %v; want %v", got, err, want)
	}
	for i, w := range ws {
		key, id := keys[3*i], args[3*i]
		entries, err := h.do("HGETALL", key+":e").AsStrMap()
		if err != nil {
			t.Fatal(err)
		}
		if entries["other.1"] != old {
			t.Errorf("%s: the other waiter's entry = %q, want it untouched", w.name, entries["other.1"])
		}
		e, ok := entries[id]
		if !w.queued {
			if ok || len(entries) != 1 {
				t.Errorf("%s: entries %v, want no entry written for a waiter not queued", w.name, entries)
			}
			for _, k := range []string{key + ":q", key + ":e"} {
				if ttl, _ := h.do("PTTL", k).AsInt64(); ttl <= 0 || ttl > w.queueMs {
					t.Errorf("%s: PTTL of %s = %d, want it left (at most %d)", w.name, k, ttl, w.queueMs)
				}
			}
			continue
		}
		exp, owner, _ := strings.Cut(e, " ")
		ms, _ := strconv.ParseInt(exp, 10, 64)
		if owner != "O"+strconv.Itoa(i) || ms < t1+w.leaseMs || ms > t2+w.leaseMs {
			t.Errorf("%s: entry %q, want \"expiry O%d\" with expiry in [%d, %d]", w.name, e, i, t1+w.leaseMs, t2+w.leaseMs)
		}
		lo, hi := w.leaseMs-10000, w.leaseMs
		if w.queueMs > w.leaseMs {
			lo, hi = w.leaseMs, w.queueMs
		}
		for _, k := range []string{key + ":q", key + ":e"} {
			if ttl, _ := h.do("PTTL", k).AsInt64(); ttl <= lo || ttl > hi {
				t.Errorf("%s: PTTL of %s = %d, want in (%d, %d]", w.name, k, ttl, lo, hi)
			}
		}
		if n, _ := h.do("ZCARD", key+":q").AsInt64(); n != 2 {
			t.Errorf("%s: queue holds %d, want 2 (nothing dropped or added)", w.name, n)
		}
	}
}

// TestScriptRenewSameLeaseWakesNobody: mutex_renew wakes the waiters of a
// hold marked w only for a lease shorter than what is left of the old
// one: a new lease equal to it leaves every waiter's sleep as long as it
// was. The record is written with a lease of L and renewed to L at once:
// the assertion (nothing published) holds in every iteration, and those
// whose renewal ran in the millisecond of the write (TIME before and
// after agree, so the remaining lease was exactly L) test the bound, where
// a mutant that published for "PTTL >= lease" woke them for nothing.
func TestScriptRenewSameLeaseWakesNobody(t *testing.T) {
	h := newHoldRig(t)
	sc := newScripts(t, h.client)
	renew, _ := sc.Script("mutex_renew")
	key := lockKey(className("class-renew-same"))
	ch := key + ":w"
	count := listenBoth(t, redistest.Single(t).Addr(), ch)
	v := h.record(holdState{record: "Lw:F:F|1:a.1:" + holdOwner})
	ms := func() int64 { return serverMicros(t, h.client) / 1000 }
	hits := 0
	for i := 0; i < 300 && hits < 3; i++ {
		t0 := ms()
		h.do("SET", key, v, "PX", "30000")
		n, err := renew.Exec(h.ctx, []string{key, ch}, []string{holdOwner, strconv.FormatInt(h.f, 10), "30000", ""}).AsInt64()
		if err != nil || n != 1 {
			t.Fatalf("renew = %d, %v; want 1", n, err)
		}
		if ms() == t0 {
			hits++
		}
	}
	if p, s := count(); len(p)+len(s) != 0 {
		t.Errorf("renewals to the same lease published %v and %v, want nothing", p, s)
	}
	if hits == 0 {
		t.Skip("no renewal ran in the millisecond of its write (a slow machine): the bound went untested")
	}
}
