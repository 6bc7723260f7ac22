package mutex_test

// Every lease, mark and keep time the read-write lock scripts compare with
// the server's clock ends at a millisecond, and the scripts agree on what
// that millisecond means: a lease, a writer-waiting mark or a read entry
// that ends at now has ended (rwmutex_lock's header: live is "score after
// now", garbage is [-now, now]); one that ends at now + 1 still runs. The
// class (issue 32): each comparison of rwmutex_rlock, rwmutex_runlock,
// rwmutex_unlock, rwmutex_abandon and rwmutex_renew_batch with now, driven
// with the value at now - 1, now and now + 1, and the full outcome
// (reply, the entry or field it decides on, the key's TTL) asserted both
// ways. Mutants that took ">" for ">=" (or "<=" for "<") live on exactly
// that millisecond, and no test placed a value there.
//
// How a row meets the millisecond: the server's TIME (T) is read, then the
// set-up written with values relative to T, the script called and TIME
// read again, in one pipeline. When the second TIME is still T the script
// ran in T (a hit) and every offset is decisive. Otherwise it ran later;
// a value at T or before has ended all the more, so the rows at -1 and 0
// are still checked, and a row at +1 is checked on hits only. Each row
// tries until it has three hits (a few tries on an idle machine); with
// none in 300 tries (a machine too slow for the pipeline to stay in one
// millisecond) it is skipped, saying the bound went untested.

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// edgeRun is what one try of a TestScriptRWEndsAtNowClass row found.
type edgeRun struct {
	hit    bool // the script ran in the millisecond it was set up in
	reply  rueidis.RedisResult
	client rueidis.Client
	ctx    context.Context
}

func (r *edgeRun) ints(tb testing.TB) []int64 {
	tb.Helper()
	vs, err := r.reply.AsIntSlice()
	if err != nil {
		tb.Fatalf("reply: %v", err)
	}
	return vs
}

func (r *edgeRun) int(tb testing.TB) int64 {
	tb.Helper()
	n, err := r.reply.AsInt64()
	if err != nil {
		tb.Fatalf("reply: %v", err)
	}
	return n
}

// score returns member's score in key, or ok false.
func (r *edgeRun) score(tb testing.TB, key, member string) (float64, bool) {
	tb.Helper()
	s, err := r.client.Do(r.ctx, r.client.B().Zscore().Key(key).Member(member).Build()).AsFloat64()
	if rueidis.IsRedisNil(err) {
		return 0, false
	}
	if err != nil {
		tb.Fatal(err)
	}
	return s, true
}

func (r *edgeRun) field(tb testing.TB, key, field string) string {
	tb.Helper()
	v, err := r.client.Do(r.ctx, r.client.B().Hget().Key(key).Field(field).Build()).ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		tb.Fatal(err)
	}
	return v
}

func (r *edgeRun) pttl(tb testing.TB, key string) int64 {
	tb.Helper()
	n, err := r.client.Do(r.ctx, r.client.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

func TestScriptRWEndsAtNowClass(t *testing.T) {
	ctx := context.Background()
	addr := redistest.Single(t).Addr()
	client := redistest.Client(t, addr)
	sc := newScripts(t, client)
	script := func(name string) *scriptcache.Script {
		s, err := sc.Script(name)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	rlock, runlock, unlock := script("rwmutex_rlock"), script("rwmutex_runlock"), script("rwmutex_unlock")
	abandon, renew := script("rwmutex_abandon"), script("rwmutex_renew_batch")
	itoa := func(n int64) string { return strconv.FormatInt(n, 10) }
	// keys of one try's lock: h state hash, z readers, t tombstones, rd
	// and wr the wake-up channels, m the writers' marks.
	type keys struct{ h, z, t, rd, wr, m string }

	type row struct {
		name   string
		offset int64 // the value under test is T + offset
		s      *scriptcache.Script
		// setup returns the commands that write the state, given T and
		// the value under test v = T + offset.
		setup func(k keys, T, v int64) []rueidis.Completed
		call  func(k keys, T, v int64) (ks, args []string)
		check func(t *testing.T, r *edgeRun, k keys, T, v int64)
		// before, if set, runs before each try reads T.
		before func()
	}
	b := client.B()
	// The readers' wake-ups of the withdrawal rows go to one channel of
	// their own (a try's keys have their own names): woken returns the
	// messages published on it since the last call.
	rdChan := rwKey(className("rw-edge-wake"), "rd")
	rdHeard := listenBoth(t, addr, rdChan)
	rdSeen := 0
	woken := func() []string {
		p, _ := rdHeard()
		out := p[rdSeen:]
		rdSeen = len(p)
		return out
	}
	zadd := func(key string, score int64, member string) rueidis.Completed {
		return b.Zadd().Key(key).ScoreMember().ScoreMember(float64(score), member).Build()
	}
	hset := func(key string, fv ...string) rueidis.Completed {
		c := b.Hset().Key(key).FieldValue()
		for i := 0; i+1 < len(fv); i += 2 {
			c = c.FieldValue(fv[i], fv[i+1])
		}
		return c.Build()
	}
	pexpire := func(key string, ms int64) rueidis.Completed {
		return b.Pexpire().Key(key).Milliseconds(ms).Build()
	}
	// live reports whether a value at T + offset still runs when the
	// script runs: on a hit, exactly when offset > 0 (a try that missed
	// T is checked only for offset <= 0, where the answer is the same).
	live := func(offset int64) bool { return offset > 0 }

	var rows []row
	for _, off := range []int64{-1, 0, 1} {
		o := "at now" + map[int64]string{-1: " - 1", 0: "", 1: " + 1"}[off]
		rows = append(rows,
			// rwmutex_rlock: a nested RLock joins only an acquisition
			// whose lease runs; one that ends now is gone ({-1}).
			row{
				name: "rlock nested, lease ends " + o, offset: off, s: rlock,
				setup: func(k keys, T, v int64) []rueidis.Completed {
					return []rueidis.Completed{zadd(k.z, v, "r.1"), pexpire(k.z, 60_000)}
				},
				call: func(k keys, T, v int64) ([]string, []string) {
					return []string{k.h, k.z, k.t}, []string{"R", "30000", "1", "r.1", ""}
				},
				check: func(t *testing.T, r *edgeRun, k keys, T, v int64) {
					want := []int64{-1, 0, 0}
					if live(off) {
						want = []int64{1, 0, 0}
					}
					if got := r.ints(t); !equalInts(got, want) {
						t.Errorf("nested RLock of an acquisition ending at %d (ran at %d) = %v, want %v", v, T, got, want)
					}
					// A nested RLock writes nothing: the entry is as it was.
					if s, ok := r.score(t, k.z, "r.1"); !ok || int64(s) != v {
						t.Errorf("the acquisition's score = %v, %v after a nested RLock, want %d unchanged", s, ok, v)
					}
				},
			},
			// rwmutex_rlock: another owner's write lease that ends now
			// no longer holds readers out.
			row{
				name: "rlock, write lease ends " + o, offset: off, s: rlock,
				setup: func(k keys, T, v int64) []rueidis.Completed {
					return []rueidis.Completed{hset(k.h, "o", "W", "n", "1", "f", "5", "a", "w.1", "e", itoa(v)), pexpire(k.h, 60_000)}
				},
				call: func(k keys, T, v int64) ([]string, []string) {
					return []string{k.h, k.z, k.t}, []string{"R", "30000", "0", "r.1", ""}
				},
				check: func(t *testing.T, r *edgeRun, k keys, T, v int64) {
					got := r.ints(t)
					_, in := r.score(t, k.z, "r.1")
					if live(off) {
						if !equalInts(got, []int64{0, 1, 0}) || in {
							t.Errorf("RLock while a write lease runs 1 ms more = %v (read entry %v), want [0 1 0] and no entry", got, in)
						}
						return
					}
					if !equalInts(got, []int64{1, 0, 0}) || !in {
						t.Errorf("RLock after the write lease ended at %d (ran at %d) = %v (read entry %v), want granted", v, T, got, in)
					}
				},
			},
			// rwmutex_rlock: a writer-waiting mark that ends now no
			// longer holds readers out.
			row{
				name: "rlock, mark ends " + o, offset: off, s: rlock,
				setup: func(k keys, T, v int64) []rueidis.Completed {
					return []rueidis.Completed{hset(k.h, "f", "5", "q", itoa(v)), pexpire(k.h, 60_000)}
				},
				call: func(k keys, T, v int64) ([]string, []string) {
					return []string{k.h, k.z, k.t}, []string{"R", "30000", "0", "r.1", ""}
				},
				check: func(t *testing.T, r *edgeRun, k keys, T, v int64) {
					got := r.ints(t)
					_, in := r.score(t, k.z, "r.1")
					if live(off) {
						if !equalInts(got, []int64{0, 1, 0}) || in {
							t.Errorf("RLock while a mark runs 1 ms more = %v (read entry %v), want [0 1 0] and no entry", got, in)
						}
						return
					}
					if !equalInts(got, []int64{1, 0, 0}) || !in {
						t.Errorf("RLock after the mark ended at %d (ran at %d) = %v (read entry %v), want granted", v, T, got, in)
					}
				},
			},
			// rwmutex_rlock: garbage is [-now, now]; a reader whose
			// lease ends now goes, and so does a released member whose
			// keep ends now; one more millisecond keeps either.
			row{
				name: "rlock garbage, entries end " + o, offset: off, s: rlock,
				setup: func(k keys, T, v int64) []rueidis.Completed {
					return []rueidis.Completed{zadd(k.z, v, "expired.1"), zadd(k.z, -v, "released.1"), pexpire(k.z, 60_000)}
				},
				call: func(k keys, T, v int64) ([]string, []string) {
					return []string{k.h, k.z, k.t}, []string{"R", "30000", "0", "r.1", ""}
				},
				check: func(t *testing.T, r *edgeRun, k keys, T, v int64) {
					if got := r.ints(t); !equalInts(got, []int64{1, 0, 0}) {
						t.Errorf("RLock = %v, want granted", got)
					}
					for _, m := range []string{"expired.1", "released.1"} {
						if _, in := r.score(t, k.z, m); in != live(off) {
							t.Errorf("%s (ends at %d, RLock ran at %d) still in the set: %v, want %v", m, v, T, in, live(off))
						}
					}
				},
			},
			// rwmutex_runlock: an acquisition whose lease ends now is
			// not held (-1, and its entry goes); one more millisecond
			// and it is released (0, the entry marked released).
			row{
				name: "runlock, lease ends " + o, offset: off, s: runlock,
				setup: func(k keys, T, v int64) []rueidis.Completed {
					return []rueidis.Completed{zadd(k.z, v, "r.1"), pexpire(k.z, 60_000)}
				},
				call: func(k keys, T, v int64) ([]string, []string) {
					return []string{k.z, k.wr}, []string{"r.1", "p", "1000"}
				},
				check: func(t *testing.T, r *edgeRun, k keys, T, v int64) {
					got := r.int(t)
					s, in := r.score(t, k.z, "r.1")
					if live(off) {
						if got != 0 || !in || int64(s) != -(T+1000) {
							t.Errorf("RUnlock 1 ms before the lease's end = %d (entry %v, %v), want 0 and the entry at %d", got, s, in, -(T + 1000))
						}
						return
					}
					if got != -1 || in {
						t.Errorf("RUnlock of a lease that ended at %d (ran at %d) = %d (entry %v, %v), want -1 and the entry gone", v, T, got, s, in)
					}
				},
			},
			// rwmutex_runlock: the last live reader gone cuts the set's
			// life to the keep time; a reader whose lease ends now is
			// not live, one with one more millisecond is.
			row{
				name: "runlock, other reader ends " + o, offset: off, s: runlock,
				setup: func(k keys, T, v int64) []rueidis.Completed {
					return []rueidis.Completed{zadd(k.z, T+30_000, "r.1"), zadd(k.z, v, "other.1"), pexpire(k.z, 60_000)}
				},
				call: func(k keys, T, v int64) ([]string, []string) {
					return []string{k.z, k.wr}, []string{"r.1", "p", "1000"}
				},
				check: func(t *testing.T, r *edgeRun, k keys, T, v int64) {
					if got := r.int(t); got != 0 {
						t.Errorf("RUnlock = %d, want 0", got)
					}
					p := r.pttl(t, k.z)
					if live(off) {
						if p <= 1000 {
							t.Errorf("the readers' set's PTTL = %d after an RUnlock beside a reader with 1 ms left, want its 60 s kept", p)
						}
						return
					}
					if p > 1000 {
						t.Errorf("the readers' set's PTTL = %d after the last live reader left (the other ended at %d, ran at %d), want at most the keep time 1000", p, v, T)
					}
				},
			},
			// rwmutex_unlock: a write lease that ends now cannot be
			// unlocked (-1, the hash as it was); one more millisecond and
			// it is released.
			row{
				name: "unlock, lease ends " + o, offset: off, s: unlock,
				setup: func(k keys, T, v int64) []rueidis.Completed {
					return []rueidis.Completed{hset(k.h, "o", "W", "n", "1", "f", "5", "a", "w.1", "e", itoa(v), "c", "5"), pexpire(k.h, 60_000)}
				},
				call: func(k keys, T, v int64) ([]string, []string) {
					return []string{k.h, k.rd, k.wr}, []string{"W", "1", "5", "p", "1000"}
				},
				check: func(t *testing.T, r *edgeRun, k keys, T, v int64) {
					got := r.int(t)
					o := r.field(t, k.h, "o")
					if live(off) {
						if got != 0 || o != "" || r.field(t, k.h, "r") != "W 5" {
							t.Errorf("Unlock 1 ms before the lease's end = %d (o %q), want 0 and released", got, o)
						}
						return
					}
					if got != -1 || o != "W" || r.field(t, k.h, "e") != itoa(v) || r.field(t, k.h, "r") != "" {
						t.Errorf("Unlock of a lease that ended at %d (ran at %d) = %d (o %q), want -1 and the hash as it was", v, T, got, o)
					}
				},
			},
			// rwmutex_abandon: a read give-back releases an acquisition
			// whose lease runs; one that ends now is not held.
			row{
				name: "abandon read, lease ends " + o, offset: off, s: abandon,
				setup: func(k keys, T, v int64) []rueidis.Completed {
					return []rueidis.Completed{zadd(k.z, v, "r.1"), pexpire(k.z, 60_000)}
				},
				call: func(k keys, T, v int64) ([]string, []string) {
					return []string{k.h, k.z, k.t, k.rd, k.wr, k.m}, []string{"R", "r.1", "r", "p", "1000", "30000", ""}
				},
				check: func(t *testing.T, r *edgeRun, k keys, T, v int64) {
					got := r.int(t)
					s, in := r.score(t, k.z, "r.1")
					if live(off) {
						if got != 1 || in {
							t.Errorf("read give-back 1 ms before the lease's end = %d (entry %v), want 1 and the entry gone", got, in)
						}
						return
					}
					if got != 0 || !in || int64(s) != v {
						t.Errorf("read give-back of a lease that ended at %d (ran at %d) = %d (entry %v, %v), want 0 and the entry left", v, T, got, s, in)
					}
				},
			},
			// rwmutex_abandon: a read give-back that leaves no live
			// reader cuts the set's life to the keep time; a reader whose
			// lease ends now is not live.
			row{
				name: "abandon read, other reader ends " + o, offset: off, s: abandon,
				setup: func(k keys, T, v int64) []rueidis.Completed {
					return []rueidis.Completed{zadd(k.z, T+30_000, "r.1"), zadd(k.z, v, "other.1"), pexpire(k.z, 60_000)}
				},
				call: func(k keys, T, v int64) ([]string, []string) {
					return []string{k.h, k.z, k.t, k.rd, k.wr, k.m}, []string{"R", "r.1", "r", "p", "1000", "30000", ""}
				},
				check: func(t *testing.T, r *edgeRun, k keys, T, v int64) {
					if got := r.int(t); got != 1 {
						t.Errorf("read give-back = %d, want 1", got)
					}
					p := r.pttl(t, k.z)
					if live(off) {
						if p <= 1000 {
							t.Errorf("the readers' set's PTTL = %d after a give-back beside a reader with 1 ms left, want its 60 s kept", p)
						}
						return
					}
					if p > 1000 {
						t.Errorf("the readers' set's PTTL = %d after the last live reader left (the other ended at %d, ran at %d), want at most 1000", p, v, T)
					}
				},
			},
			// rwmutex_abandon: a withdrawal brings q back to the latest
			// mark still running; a mark that ends now has ended, even
			// when it is left in the set (it is the 17th dead one: 16 go
			// per call), so q goes.
			// rwmutex_abandon: the withdrawal of the last mark wakes the
			// readers only if q still ran (they may go in sooner); a q
			// that ends now has ended, and nobody is woken.
			row{
				name: "abandon withdrawal of the last mark, q ends " + o, offset: off, s: abandon,
				before: func() { woken() },
				setup: func(k keys, T, v int64) []rueidis.Completed {
					return []rueidis.Completed{hset(k.h, "f", "5", "q", itoa(v)), pexpire(k.h, 60_000), zadd(k.m, T+20_000, "mw.1"), pexpire(k.m, 60_000)}
				},
				call: func(k keys, T, v int64) ([]string, []string) {
					return []string{k.h, k.z, k.t, rdChan, k.wr, k.m}, []string{"W", "mw.1", "m", "p", "20000", "30000", "mw.1"}
				},
				check: func(t *testing.T, r *edgeRun, k keys, T, v int64) {
					if got := r.int(t); got != 1 {
						t.Errorf("withdrawal = %d, want 1", got)
					}
					if q := r.field(t, k.h, "q"); q != "" {
						t.Errorf("q = %q after the last mark was withdrawn, want none", q)
					}
					var want []string
					if live(off) {
						want = []string{"1000000"}
					}
					if got := woken(); len(got) != len(want) || (len(got) > 0 && got[0] != want[0]) {
						t.Errorf("readers' wake-ups = %q after the withdrawal of the last mark, q ending at %d (ran at %d), want %q", got, v, T, want)
					}
				},
			},
			row{
				name: "abandon withdrawal, other mark ends " + o, offset: off, s: abandon,
				setup: func(k keys, T, v int64) []rueidis.Completed {
					cmds := []rueidis.Completed{hset(k.h, "f", "5", "q", itoa(T+20_000)), pexpire(k.h, 60_000), zadd(k.m, T+20_000, "mw.1"), zadd(k.m, v, "edge")}
					for i := range int64(16) {
						cmds = append(cmds, zadd(k.m, T-1000-i, "dead."+itoa(i)))
					}
					return append(cmds, pexpire(k.m, 60_000))
				},
				call: func(k keys, T, v int64) ([]string, []string) {
					return []string{k.h, k.z, k.t, k.rd, k.wr, k.m}, []string{"W", "mw.1", "m", "p", "1000", "30000", "mw.1"}
				},
				check: func(t *testing.T, r *edgeRun, k keys, T, v int64) {
					if got := r.int(t); got != 1 {
						t.Errorf("withdrawal = %d, want 1", got)
					}
					if _, in := r.score(t, k.m, "edge"); !in {
						t.Errorf("the 17th mark (ends at %d) left the set, want it kept: 16 go per call", v)
					}
					q := r.field(t, k.h, "q")
					if live(off) {
						if q != itoa(v) {
							t.Errorf("q = %q after the withdrawal beside a mark with 1 ms left, want its end %d", q, v)
						}
						return
					}
					if q != "" {
						t.Errorf("q = %q after the withdrawal, the other mark ending at %d (ran at %d), want none", q, v, T)
					}
				},
			},
			// rwmutex_renew_batch: a write lease or a read lease that
			// ends now is not renewed (0, its end left); one more
			// millisecond and it is (1, the lease again from now).
			row{
				name: "renew batch, leases end " + o, offset: off, s: renew,
				setup: func(k keys, T, v int64) []rueidis.Completed {
					return []rueidis.Completed{
						hset(k.h, "o", "W", "n", "1", "f", "5", "a", "w.1", "e", itoa(v)), pexpire(k.h, 60_000),
						zadd(k.z, v, "r.1"), pexpire(k.z, 60_000),
					}
				},
				call: func(k keys, T, v int64) ([]string, []string) {
					return []string{k.h, k.z}, []string{"30000", "1", "W", "5", "1", "", "r.1"}
				},
				check: func(t *testing.T, r *edgeRun, k keys, T, v int64) {
					got := r.ints(t)
					e := r.field(t, k.h, "e")
					s, _ := r.score(t, k.z, "r.1")
					if live(off) {
						if !equalInts(got, []int64{1, 1}) || e != itoa(T+30_000) || int64(s) != T+30_000 {
							t.Errorf("renewal 1 ms before the leases' end = %v (e %s, read %v), want [1 1] and both at %d", got, e, s, T+30_000)
						}
						return
					}
					if !equalInts(got, []int64{0, 0}) || e != itoa(v) || int64(s) != v {
						t.Errorf("renewal of leases that ended at %d (ran at %d) = %v (e %s, read %v), want [0 0] and both left", v, T, got, e, s)
					}
				},
			},
		)
	}

	for _, rw := range rows {
		t.Run(rw.name, func(t *testing.T) {
			// The pipeline sends EVALSHA alone: Exec the script once
			// first, on keys of its own, so the server has it (and a
			// mutation test binary's trace lists it as run here).
			load := "rw-edge-load:" + strconv.Itoa(int(serverMicros(t, client)%1e9))
			lk := keys{h: rwKey(load, "h"), z: rwKey(load, "z"), t: rwKey(load, "t"), rd: rwKey(load, "rd"), wr: rwKey(load, "wr"), m: rwKey(load, "m")}
			lks, largs := rw.call(lk, 0, 0)
			if err := rw.s.Exec(ctx, lks, largs).Error(); err != nil {
				t.Fatalf("%s on empty keys: %v", rw.s.Name(), err)
			}
			defer client.Do(ctx, b.Del().Key(lk.h, lk.z, lk.t, lk.m).Build())
			hits := 0
			for try := 0; try < 300 && hits < 3; try++ {
				name := "rw-edge:" + strconv.Itoa(int(serverMicros(t, client)%1e9)) + "." + strconv.Itoa(try)
				k := keys{h: rwKey(name, "h"), z: rwKey(name, "z"), t: rwKey(name, "t"), rd: rwKey(name, "rd"), wr: rwKey(name, "wr"), m: rwKey(name, "m")}
				if rw.before != nil {
					rw.before()
				}
				T := serverMicros(t, client) / 1000
				v := T + rw.offset
				ks, args := rw.call(k, T, v)
				cmds := rw.setup(k, T, v)
				cmds = append(cmds, b.Evalsha().Sha1(rw.s.SHA1()).Numkeys(int64(len(ks))).Key(ks...).Arg(args...).Build(), b.Time().Build())
				res := client.DoMulti(ctx, cmds...)
				for i, c := range res[:len(res)-2] {
					if err := c.Error(); err != nil {
						t.Fatalf("set-up command %d: %v", i, err)
					}
				}
				r := &edgeRun{reply: res[len(res)-2], client: client, ctx: ctx}
				if err := r.reply.Error(); err != nil {
					if strings.HasPrefix(err.Error(), "NOSCRIPT") {
						rw.s.Exec(ctx, lks, largs) // loads it again
						continue
					}
					t.Fatalf("%s: %v", rw.s.Name(), err)
				}
				tm, err := res[len(res)-1].AsIntSlice()
				if err != nil || len(tm) != 2 {
					t.Fatalf("TIME: %v, %v", tm, err)
				}
				r.hit = tm[0]*1000+tm[1]/1000 == T
				if r.hit {
					hits++
				}
				if r.hit || rw.offset <= 0 {
					rw.check(t, r, k, T, v)
				}
				client.Do(ctx, b.Del().Key(k.h, k.z, k.t, k.m).Build())
				if t.Failed() {
					return
				}
			}
			if hits == 0 {
				t.Skip("no try ran in the millisecond it was set up in (a slow machine): the bound went untested")
			}
		})
	}
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
