package mutex_test

// Tests of what rwmutex_runlock promises, as a class (issue 32): each path
// of its body asserted both ways, with the reply, every entry of the
// readers' set, the set's TTL and the writers' wake-ups, plain or
// sharded. The script is driven directly (TestScriptRWRUnlockClass) on
// hand-written sets: a released entry kept for a retry, expired entries
// beside live ones, a set shorter than the keep time.
//
// The paths:
//   - no entry: -1, nothing written; a released entry (negative score):
//     0, nothing written (a retry whose first try released it);
//   - an entry whose lease is over: -1, and it goes (the others stay);
//   - a live entry: 0, its score becomes -(now + keep); the set lives at
//     least the keep time (never shortened while a live reader stays);
//     when no live reader is left, the set's life is cut to the keep time
//     and one waiting writer per process is woken ("1"), else nobody.

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

func TestScriptRWRUnlockClass(t *testing.T) {
	ctx := context.Background()
	addr := redistest.Single(t).Addr()
	client := redistest.Client(t, addr)
	sc := newScripts(t, client)
	runlock, _ := sc.Script("rwmutex_runlock")
	name := className("rw-runlock-class")
	zKey, wrKey := rwKey(name, "z"), rwKey(name, "wr")
	wrHeard := listenBoth(t, addr, wrKey)
	seen := [2]int{}
	heard := func() []string {
		p, s := wrHeard()
		var out []string
		for _, m := range p[seen[0]:] {
			out = append(out, "p:"+m)
		}
		for _, m := range s[seen[1]:] {
			out = append(out, "s:"+m)
		}
		seen = [2]int{len(p), len(s)}
		return out
	}
	const keep = 20_000
	// released stands for a member released a moment ago, kept 5 s
	// more: its score is -(now + 5000).
	const released = -1 << 40
	// zero stands for the score 0: below every lease's end, not a
	// released member's mark (those are below 0), so a lease over.
	const zero = -1 << 41
	for _, tc := range []struct {
		name    string
		entries map[string]int64 // member -> score relative to now, or released
		setMs   int64            // the set's PTTL (0: 60 s)
		mode    string
		reply   int64
		// The set after the call is as it was but for r.1:
		marked bool     // r.1 is marked released
		gone   bool     // r.1 is gone
		pttl   [2]int64 // [lo, hi]; 0, 0: as before (50-60 s, or setMs)
		woken  []string
	}{
		{name: "no entry", entries: map[string]int64{"s.1": 30_000}, mode: "p", reply: -1},
		{name: "no set", mode: "p", reply: -1, pttl: [2]int64{-2, -2}},
		{name: "released already", entries: map[string]int64{"r.1": released, "s.1": 30_000}, mode: "p", reply: 0},
		{name: "released already, the last", entries: map[string]int64{"r.1": released}, mode: "p", reply: 0},
		{name: "lease over", entries: map[string]int64{"r.1": -1000, "x.1": -2000, "s.1": 30_000}, mode: "p", reply: -1, gone: true},
		{name: "score 0", entries: map[string]int64{"r.1": zero, "s.1": 30_000}, mode: "p", reply: -1, gone: true},
		{name: "lease over, the last", entries: map[string]int64{"r.1": -1000}, mode: "p", reply: -1, gone: true, pttl: [2]int64{-2, -2}},
		{name: "another live reader stays", entries: map[string]int64{"r.1": 30_000, "s.1": 30_000}, mode: "p", reply: 0, marked: true},
		{name: "another live reader stays, short set lengthened", entries: map[string]int64{"r.1": 30_000, "s.1": 30_000}, setMs: 5000, mode: "p", reply: 0, marked: true, pttl: [2]int64{5001, keep}},
		{name: "the last live reader", entries: map[string]int64{"r.1": 30_000, "x.1": -1000, "q.1": released}, mode: "p", reply: 0, marked: true, pttl: [2]int64{1, keep}, woken: []string{"p:1"}},
		{name: "the last live reader, sharded", entries: map[string]int64{"r.1": 30_000}, mode: "s", reply: 0, marked: true, pttl: [2]int64{1, keep}, woken: []string{"s:1"}},
		{name: "the last live reader, short set", entries: map[string]int64{"r.1": 30_000}, setMs: 5000, mode: "p", reply: 0, marked: true, pttl: [2]int64{5001, keep}, woken: []string{"p:1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := serverMicros(t, client) / 1000
			if err := client.Do(ctx, client.B().Del().Key(zKey).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			before := map[string]float64{}
			for m, rel := range tc.entries {
				score := now + rel
				switch rel {
				case released:
					score = -(now + 5000)
				case zero:
					score = 0
				}
				before[m] = float64(score)
				if err := client.Do(ctx, client.B().Zadd().Key(zKey).ScoreMember().ScoreMember(float64(score), m).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			setMs := tc.setMs
			if setMs == 0 {
				setMs = 60_000
			}
			if len(tc.entries) > 0 {
				if err := client.Do(ctx, client.B().Pexpire().Key(zKey).Milliseconds(setMs).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			n, err := runlock.Exec(ctx, []string{zKey, wrKey}, []string{"r.1", tc.mode, strconv.Itoa(keep)}).AsInt64()
			after := serverMicros(t, client) / 1000
			if err != nil || n != tc.reply {
				t.Errorf("reply = %d, %v; want %d", n, err, tc.reply)
			}
			got := zscores(t, client, zKey)
			want := maps.Clone(before)
			switch {
			case tc.gone:
				delete(want, "r.1")
			case tc.marked:
				s, ok := got["r.1"]
				if !ok || int64(s) > -(now+keep) || int64(s) < -(after+keep) {
					t.Errorf("r.1's score = %v, %v; want the released mark in [%d, %d]", s, ok, -(after + keep), -(now + keep))
				}
				want["r.1"] = s
			}
			if !maps.Equal(got, want) && (len(got) != 0 || len(want) != 0) {
				t.Errorf("readers' set = %v, want %v", got, want)
			}
			pttl, err := client.Do(ctx, client.B().Pttl().Key(zKey).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			lo, hi := tc.pttl[0], tc.pttl[1]
			switch {
			case lo != 0 || hi != 0:
			case len(tc.entries) == 0:
				lo, hi = -2, -2
			case tc.setMs != 0:
				lo, hi = 1, tc.setMs
			default:
				lo, hi = 50_000, 60_000
			}
			if pttl < lo || pttl > hi {
				t.Errorf("the readers' set's PTTL = %d, want in [%d, %d]", pttl, lo, hi)
			}
			if w := heard(); !slices.Equal(w, tc.woken) && (len(w) != 0 || len(tc.woken) != 0) {
				t.Errorf("writers' wake-ups = %q, want %q", w, tc.woken)
			}
		})
	}
}
