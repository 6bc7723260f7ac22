package mutex_test

// Bounds the lock scripts promise in their headers, each asserted both
// ways (what must happen at the bound and what must not happen short of
// it), on keys written by hand or by the scripts themselves against a real
// server: the states are ones the API reaches only by chance or after
// minutes (seventeen dead fair waiters, a read give-back beside a released
// read, three writers waiting at once). Issue 32, seed 13: no test looked
// at these bounds.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestScriptFairLockDropsSixteenDeadEntriesPerCall: mutex_lock's header
// says a fair call drops up to 16 dead entries at the head of the queue
// and, if it dropped that many without reaching a live one, does not take
// the lock and answers -3 (try again at once): a live waiter may still be
// queued behind them, and one call's work stays bounded. With 16 dead
// entries ahead the call drops them all and takes the free lock; with 17
// it drops 16, leaves the 17th and the lock, and the next call drops it
// and takes the lock. A mutant that stopped at 17 instead of 16 took the
// lock past 17 dead entries in one call, and no test queued more than a
// few.
func TestScriptFairLockDropsSixteenDeadEntriesPerCall(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc, err := scriptcache.New(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	lock, _ := sc.Script("mutex_lock")
	for _, dead := range []int{16, 17} {
		t.Run(strconv.Itoa(dead), func(t *testing.T) {
			keys := scriptKeys("reap16:" + strconv.Itoa(dead) + ":" + strconv.Itoa(rand.IntN(1e9))).lock
			// The queue keys written here have no TTL (a failure leaves them).
			t.Cleanup(func() { client.Do(context.Background(), client.B().Del().Key(keys...).Build()) })
			for i := range dead {
				id := fmt.Sprintf("gone%d.1", i)
				if err := client.Do(ctx, client.B().Zadd().Key(keys[2]).ScoreMember().ScoreMember(float64(i+1), id).Build()).Error(); err != nil {
					t.Fatal(err)
				}
				// A waiter that stopped refreshing its entry: its expiry
				// passed long ago.
				if err := client.Do(ctx, client.B().Hset().Key(keys[3]).FieldValue().FieldValue(id, "1000 gone").Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			left := func() (int64, int64) {
				t.Helper()
				q, err := client.Do(ctx, client.B().Zcard().Key(keys[2]).Build()).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				e, err := client.Do(ctx, client.B().Hlen().Key(keys[3]).Build()).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				return q, e
			}
			got, err := execLock(ctx, lock, keys, "me", "30000", "mine.1", "f")
			if err != nil {
				t.Fatal(err)
			}
			q, e := left()
			if dead == 16 {
				if got[0] != 1 {
					t.Fatalf("fair Lock behind 16 dead entries = %v, want the lock (all 16 dropped in this call)", got)
				}
				if q != 0 || e != 0 {
					t.Errorf("after the grant the queue holds %d and the entries %d, want none", q, e)
				}
				return
			}
			if got[0] != 0 || got[1] != -3 {
				t.Fatalf("fair Lock behind 17 dead entries = %v, want {0 -3 0} (16 dropped, try again: not taken)", got)
			}
			if q != 1 || e != 1 {
				t.Fatalf("after the -3 the queue holds %d and the entries %d, want 1 and 1 (only 16 dropped per call)", q, e)
			}
			if n, err := client.Do(ctx, client.B().Exists().Key(keys[0]).Build()).AsInt64(); err != nil || n != 0 {
				t.Fatalf("the -3 left a record (EXISTS %d, %v): the call took or marked the lock", n, err)
			}
			got, err = execLock(ctx, lock, keys, "me", "30000", "mine.2", "f")
			if err != nil {
				t.Fatal(err)
			}
			if got[0] != 1 {
				t.Fatalf("the call again after -3 = %v, want the lock (the 17th dropped)", got)
			}
			if q, e := left(); q != 0 || e != 0 {
				t.Errorf("after the grant the queue holds %d and the entries %d, want none", q, e)
			}
		})
	}
}

// TestScriptRWReadGiveBackShortensReadersSet: when the give-back of a read
// acquisition leaves no live reader, rwmutex_abandon cuts the readers'
// set's life to the keep time (ARGV[5]), as rwmutex_runlock does: what is
// left in it are released readers' marks, which need no more; a reader's
// lease would keep the key (and its marks) around for nothing. It never
// lengthens it (a keep longer than the set's remaining life leaves it),
// and while a live reader remains, its lease keeps the set. A mutant that
// negated the comparison kept the set a whole lease after the last reader
// gave back, and lengthened a set it should have left; no test read the
// set's expiry after a read give-back.
func TestScriptRWReadGiveBackShortensReadersSet(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	for _, c := range []struct {
		name       string
		keep       string // the give-back's ARGV[5]
		other      bool   // another live reader stays
		wantAtMost int64  // the set's PTTL after the give-back, at most
		wantOver   int64  // and more than this (-3: gone, -2, allowed)
	}{
		{name: "last reader, lease longer than keep", keep: "1000", wantAtMost: 1000, wantOver: -3},
		{name: "last reader, keep longer than the set", keep: "60000", wantAtMost: 30000, wantOver: 1000},
		{name: "another reader stays", keep: "1000", other: true, wantAtMost: 30000, wantOver: 1000},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRWScriptRig(t, "rw-gb-ttl:")
			set := r.abandonKeys[1]
			if g := r.rtake("R", "r.1"); g[0] != 1 {
				t.Fatalf("rlock r.1 = %v, want granted", g)
			}
			if c.other {
				if g := r.rtake("S", "s.1"); g[0] != 1 {
					t.Fatalf("rlock s.1 = %v, want granted", g)
				}
			}
			// A reader released a moment ago: its mark (a negative
			// score, see rwmutex_runlock) keeps the set from emptying.
			now := serverMicros(t, client) / 1000
			if err := client.Do(ctx, client.B().Zadd().Key(set).ScoreMember().ScoreMember(float64(-(now+5000)), "q.1").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			before, err := client.Do(ctx, client.B().Pttl().Key(set).Build()).AsInt64()
			if err != nil || before <= 1000 || before > 30000 {
				t.Fatalf("the readers' set's PTTL after the read = %d, %v; want a reader's lease (30 s)", before, err)
			}
			n, err := r.abandon.Exec(ctx, r.abandonKeys, []string{"R", "r.1", "r", "p", c.keep, "30000", ""}).AsInt64()
			if err != nil || n != 1 {
				t.Fatalf("give-back of read r.1 = %d, %v; want 1 (released)", n, err)
			}
			after, err := client.Do(ctx, client.B().Pttl().Key(set).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			// PTTL only falls as time passes: the bounds hold however
			// slowly the calls ran, but for "gone" (-2) once a short keep
			// ran out, which the first case allows.
			if after == -1 || after > c.wantAtMost || after <= c.wantOver {
				t.Errorf("the readers' set's PTTL after the give-back = %d ms, want at most %d and above %d", after, c.wantAtMost, c.wantOver)
			}
		})
	}
}

// TestScriptRWGrantKeepsLatestOfOtherMarks: when a writer that waited is
// granted the lock, its own mark goes and q comes back to the latest end
// of the marks still running (rwmutex_lock's header: q is the latest end
// of the waiting writers' own marks), not to an earlier one: readers stay
// out until the last waiting writer's mark ends. X (20 s) and Y (25 s)
// wait behind W (30 s); W's grant must leave q at Y's end. A mutant that
// read the range -2 -1 of the marks' set took the second-latest end (X's)
// when two or more marks remain; TestScriptRWGrantKeepsOtherWritersMark
// left only one, where both ranges agree.
func TestScriptRWGrantKeepsLatestOfOtherMarks(t *testing.T) {
	r := newRWScriptRig(t, "rw-grant-marks:")
	client := redistest.Client(t, redistest.Single(t).Addr())
	q := func() int64 {
		t.Helper()
		v, err := client.Do(r.ctx, client.B().Hget().Key(r.lockKeys[0]).Field("q").Build()).AsInt64()
		if err != nil {
			t.Fatalf("HGET q: %v", err)
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
	if y := r.take("Y", "y.1", "25000", "my.1"); y[0] != 0 {
		t.Fatalf("Y's lock while H holds = %v, want refused", y)
	}
	qy := q()
	if qy <= qx {
		t.Fatalf("q = %d after Y's longer mark, want past X's end %d", qy, qx)
	}
	if w := r.take("W", "w.1", "30000", "mw.1"); w[0] != 0 {
		t.Fatalf("W's lock while H holds = %v, want refused", w)
	}
	if v := q(); v <= qy {
		t.Fatalf("q = %d after W's longer mark, want past Y's end %d", v, qy)
	}
	if n := r.release("H", h[2]); n != 0 {
		t.Fatalf("H's unlock = %d", n)
	}
	w := r.take("W", "w.2", "30000", "mw.1")
	if w[0] != 1 {
		t.Fatalf("W's lock after H's release = %v, want granted", w)
	}
	switch v := q(); v {
	case qy:
	case qx:
		t.Errorf("q = X's end %d after W's grant, want Y's %d, the latest still running (Y waits longer)", v, qy)
	default:
		t.Errorf("q = %d after W's grant, want Y's end %d (X's is %d)", v, qy, qx)
	}
	if n := r.release("W", w[2]); n != 0 {
		t.Fatalf("W's unlock = %d", n)
	}
	if rd := r.rtake("R", "r.1"); rd[0] != 0 {
		t.Errorf("a reader after W's Unlock while X's and Y's marks run = %v, want refused", rd)
	}
}

// TestScriptRWAcquireDropsGarbageReaders: rwmutex_lock's header says the
// readers' set's entries with a score in [-now, now] (readers whose lease
// ran out, released readers' marks past their keep time) are garbage,
// which rwmutex_rlock and rwmutex_lock remove, at most 16 per call;
// everything else stays: live readers (score after now) and marks still
// kept (score before -now), which a retried RUnlock reads. One garbage
// entry goes as surely as sixteen; of seventeen, one is left. A mutant of
// rwmutex_rlock that removed garbage only when there were two or more
// entries of it left a single one for good (the set's life is renewed by
// every read); the tests made none or many.
func TestScriptRWAcquireDropsGarbageReaders(t *testing.T) {
	for _, script := range []string{"rlock", "lock"} {
		for _, garbage := range []int{1, 17} {
			t.Run(script+"/"+strconv.Itoa(garbage), func(t *testing.T) {
				r := newRWScriptRig(t, "rw-garbage:")
				client := redistest.Client(t, redistest.Single(t).Addr())
				set := r.lockKeys[1]
				// The set written here has no TTL until a script sets one
				// (a refused TryLock sets none).
				t.Cleanup(func() { client.Do(context.Background(), client.B().Del().Key(set).Build()) })
				now := serverMicros(t, client) / 1000
				add := func(score int64, member string) {
					t.Helper()
					if err := client.Do(r.ctx, client.B().Zadd().Key(set).ScoreMember().ScoreMember(float64(score), member).Build()).Error(); err != nil {
						t.Fatal(err)
					}
				}
				add(now+60_000, "live.1")      // a reader whose lease runs
				add(-(now + 60_000), "kept.1") // a mark still kept
				for i := range garbage {
					if i%2 == 0 {
						add(now-1000-int64(i), "expired."+strconv.Itoa(i)) // lease over
					} else {
						add(-(now - 1000 - int64(i)), "released."+strconv.Itoa(i)) // keep over
					}
				}
				want := []string{"kept.1", "live.1"}
				if script == "rlock" {
					if g := r.rtake("R", "r.1"); g[0] != 1 {
						t.Fatalf("RLock = %v, want granted", g)
					}
					want = append(want, "r.1")
				} else if g := r.take("W", "w.1", "0", ""); g[0] != 0 {
					t.Fatalf("TryLock while live.1 reads = %v, want refused", g)
				}
				members, err := client.Do(r.ctx, client.B().Zrange().Key(set).Min("0").Max("-1").Build()).AsStrSlice()
				if err != nil {
					t.Fatal(err)
				}
				kept, left := 0, 0
				for _, m := range members {
					switch {
					case slices.Contains(want, m):
						kept++
					case strings.HasPrefix(m, "expired.") || strings.HasPrefix(m, "released."):
						left++
					default:
						t.Errorf("the readers' set holds %q, which nobody wrote", m)
					}
				}
				if kept != len(want) {
					t.Errorf("the readers' set after the %s holds %v; want all of %v kept", script, members, want)
				}
				if wantLeft := max(garbage-16, 0); left != wantLeft {
					t.Errorf("%d of %d garbage entries left after the %s (%v), want %d: at most 16 go per call, and all of fewer", left, garbage, script, members, wantLeft)
				}
			})
		}
	}
}
