package mutex_test

// Tests of what rwmutex_unlock promises, as a class (issue 32): its header
// and body read line by line, each path asserted both ways, with the reply,
// the whole state hash, its TTL and the wake-ups on both channels, plain
// or sharded. The script is driven directly (TestScriptRWUnlockClass) on
// hand-written hashes: the states that tell a retried Unlock's answers
// apart (r naming this release or another, c's run starting before, at or
// after the token, the token listed in it, a hash held again at the same
// token) are ones the API reaches only after lost replies.
//
// The paths, each with rows that must and must not take it:
//   - the owner, with the token of the hold and its lease running, gives
//     back one hold: with more than one, n is the holds less one and
//     nothing else changes; with one, o n a e go, r = "owner token", f c q
//     stay, the hash lives the keep time or until q, and each side is
//     woken once ("1" to the writers, "1000000" to the readers);
//   - another owner, another token, or a lease over: not held;
//   - a retry whose first try was the last write release (r names it,
//     owner and token) is told 0 at once, whatever c says;
//   - otherwise 0 only if the token is in the run c keeps (at or after its
//     start, not listed) and below f, or at f with nobody holding; else -1.
//   - nothing but a release writes or publishes anything.

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

func TestScriptRWUnlockClass(t *testing.T) {
	ctx := context.Background()
	addr := redistest.Single(t).Addr()
	client := redistest.Client(t, addr)
	sc := newScripts(t, client)
	unlock, _ := sc.Script("rwmutex_unlock")
	itoa := func(n int64) string { return strconv.FormatInt(n, 10) }
	_, keys, _ := rwScriptKeys(className("rw-unlock-class"))
	hKey := keys[0]
	rdHeard, wrHeard := listenBoth(t, addr, keys[1]), listenBoth(t, addr, keys[2])
	seen := map[*func() (plain, sharded []string)][2]int{}
	heard := func(f *func() (plain, sharded []string)) []string {
		p, s := (*f)()
		n := seen[f]
		seen[f] = [2]int{len(p), len(s)}
		var out []string
		for _, m := range p[n[0]:] {
			out = append(out, "p:"+m)
		}
		for _, m := range s[n[1]:] {
			out = append(out, "s:"+m)
		}
		return out
	}

	// held is W's hold with token 500, two holds, and extra fields.
	held := func(extra ...string) func(now int64) map[string]string {
		return func(now int64) map[string]string {
			h := map[string]string{"o": "W", "n": "2", "f": "500", "a": "w.1", "e": itoa(now + 30_000), "c": "100"}
			for i := 0; i+1 < len(extra); i += 2 {
				if extra[i+1] == "" {
					delete(h, extra[i])
				} else {
					h[extra[i]] = extra[i+1]
				}
			}
			return h
		}
	}
	// free is a released hash: f 500, and c and r as given ("" none).
	free := func(c, r string) func(now int64) map[string]string {
		return func(int64) map[string]string {
			h := map[string]string{"f": "500"}
			if c != "" {
				h["c"] = c
			}
			if r != "" {
				h["r"] = r
			}
			return h
		}
	}
	type want struct {
		reply  int64
		fields func(now int64) map[string]string // nil: as set up
		pttl   [2]int64                          // [lo, hi]; 0, 0: as set up (50-60 s)
		rd, wr []string
	}
	released := func(extra ...string) func(now int64) map[string]string {
		return func(now int64) map[string]string {
			h := held(extra...)(now)
			for _, f := range []string{"o", "n", "a", "e"} {
				delete(h, f)
			}
			h["r"] = "W 500"
			return h
		}
	}
	woken := func(mode string) ([]string, []string) {
		return []string{mode + ":1000000"}, []string{mode + ":1"}
	}
	rdP, wrP := woken("p")
	rdS, wrS := woken("s")
	for _, tc := range []struct {
		name  string
		hash  func(now int64) map[string]string
		args  []string // owner, holds, token, mode (the keep time, 20 s, follows)
		want  want
		qRel  int64 // q at now + qRel (0: none)
		hlife int64 // the hash's PTTL before (0: 60 s)
	}{
		// The holder.
		{name: "nested hold given back", hash: held("n", "3"), args: []string{"W", "3", "500", "p"},
			want: want{reply: 2, fields: held("n", "2")}},
		{name: "second of two holds given back", hash: held("n", "2"), args: []string{"W", "2", "500", "p"},
			want: want{reply: 1, fields: held("n", "1")}},
		{name: "last hold given back", hash: held(), args: []string{"W", "1", "500", "p"},
			want: want{reply: 0, fields: released(), pttl: [2]int64{1, 20_000}, rd: rdP, wr: wrP}},
		{name: "last hold given back, sharded", hash: held(), args: []string{"W", "1", "500", "s"},
			want: want{reply: 0, fields: released(), pttl: [2]int64{1, 20_000}, rd: rdS, wr: wrS}},
		{name: "last hold given back, a mark runs", hash: held(), qRel: 40_000, args: []string{"W", "1", "500", "p"},
			want: want{reply: 0, fields: released(), pttl: [2]int64{35_000, 40_000}, rd: rdP, wr: wrP}},
		{name: "last hold given back, a mark ends before the keep time", hash: held(), qRel: 5000, args: []string{"W", "1", "500", "p"},
			want: want{reply: 0, fields: released(), pttl: [2]int64{5001, 20_000}, rd: rdP, wr: wrP}},
		{name: "last hold given back, short hash lengthened", hash: held(), hlife: 5000, args: []string{"W", "1", "500", "p"},
			want: want{reply: 0, fields: released(), pttl: [2]int64{5001, 20_000}, rd: rdP, wr: wrP}},
		{name: "another owner", hash: held(), args: []string{"X", "1", "500", "p"}, want: want{reply: -1}},
		{name: "another token", hash: held(), args: []string{"W", "1", "501", "p"}, want: want{reply: -1}},
		// An earlier token of the run: released before, by its Unlock.
		{name: "an earlier token, held again", hash: held(), args: []string{"W", "1", "499", "p"}, want: want{reply: 0}},
		{name: "lease over", hash: held("e", "1"), args: []string{"W", "1", "500", "p"}, want: want{reply: -1}},
		{name: "no hash", args: []string{"W", "1", "500", "p"}, want: want{reply: -1}},

		// A retried final Unlock: r.
		{name: "retry, r names it", hash: free("", "W 500"), args: []string{"W", "1", "500", "p"}, want: want{reply: 0}},
		{name: "retry, r names it, c lists it", hash: free("100 500", "W 500"), args: []string{"W", "1", "500", "p"}, want: want{reply: 0}},
		{name: "retry, r names another owner", hash: free("", "X 500"), args: []string{"W", "1", "500", "p"}, want: want{reply: -1}},
		{name: "retry, r names another token", hash: free("", "W 499"), args: []string{"W", "1", "500", "p"}, want: want{reply: -1}},
		{name: "retry, r names it, held again", hash: held("r", "W 500", "o", "X"), args: []string{"W", "1", "500", "p"}, want: want{reply: 0}},

		// A retried final Unlock: c's run.
		{name: "run, token at its start", hash: free("100 300", "W 450"), args: []string{"W", "1", "100", "p"}, want: want{reply: 0}},
		{name: "run, token after its start", hash: free("100 300", "W 450"), args: []string{"W", "1", "200", "p"}, want: want{reply: 0}},
		{name: "run, token before its start", hash: free("100 300", "W 450"), args: []string{"W", "1", "99", "p"}, want: want{reply: -1}},
		{name: "run, token listed", hash: free("100 300", "W 450"), args: []string{"W", "1", "300", "p"}, want: want{reply: -1}},
		{name: "run, token after the listed one", hash: free("100 300", "W 450"), args: []string{"W", "1", "301", "p"}, want: want{reply: 0}},
		{name: "run, token listed second", hash: free("100 300 400", "W 450"), args: []string{"W", "1", "400", "p"}, want: want{reply: -1}},
		{name: "run, token at f, free", hash: free("100", ""), args: []string{"W", "1", "500", "p"}, want: want{reply: 0}},
		{name: "run, token at f, held", hash: held("o", "X"), args: []string{"W", "1", "500", "p"}, want: want{reply: -1}},
		{name: "run, token past f", hash: free("100", ""), args: []string{"W", "1", "501", "p"}, want: want{reply: -1}},
		{name: "run, token below f, held by another", hash: held("o", "X"), args: []string{"W", "1", "200", "p"}, want: want{reply: 0}},
		{name: "run, no c", hash: free("", ""), args: []string{"W", "1", "200", "p"}, want: want{reply: -1}},
		{name: "run, no f", hash: func(int64) map[string]string { return map[string]string{"c": "100"} }, args: []string{"W", "1", "200", "p"}, want: want{reply: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := serverMicros(t, client) / 1000
			do := func(cmd ...string) {
				t.Helper()
				if err := client.Do(ctx, client.B().Arbitrary(cmd[0]).Keys(cmd[1]).Args(cmd[2:]...).Build()).Error(); err != nil {
					t.Fatalf("%v: %v", cmd, err)
				}
			}
			do("DEL", hKey)
			var before map[string]string
			if tc.hash != nil {
				before = tc.hash(now)
				if tc.qRel != 0 {
					before["q"] = itoa(now + tc.qRel)
				}
				cmd := []string{"HSET", hKey}
				for k, v := range before {
					cmd = append(cmd, k, v)
				}
				do(cmd...)
				life := tc.hlife
				if life == 0 {
					life = 60_000
				}
				do("PEXPIRE", hKey, itoa(life))
			}
			n, err := unlock.Exec(ctx, keys, append(slices.Clone(tc.args), "20000")).AsInt64()
			if err != nil || n != tc.want.reply {
				t.Errorf("reply = %d, %v; want %d", n, err, tc.want.reply)
			}
			fields, err := client.Do(ctx, client.B().Hgetall().Key(hKey).Build()).AsStrMap()
			if err != nil {
				t.Fatal(err)
			}
			wantFields := before
			if tc.want.fields != nil {
				wantFields = tc.want.fields(now)
				if tc.qRel != 0 {
					wantFields["q"] = itoa(now + tc.qRel)
				}
			}
			if !maps.Equal(fields, wantFields) && (len(fields) != 0 || len(wantFields) != 0) {
				t.Errorf("hash = %v, want %v", fields, wantFields)
			}
			pttl, err := client.Do(ctx, client.B().Pttl().Key(hKey).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			lo, hi := tc.want.pttl[0], tc.want.pttl[1]
			switch {
			case hi != 0:
			case tc.hash == nil:
				lo, hi = -2, -2
			case tc.hlife != 0:
				lo, hi = 1, tc.hlife
			default:
				lo, hi = 50_000, 60_000
			}
			if pttl < lo || pttl > hi {
				t.Errorf("the hash's PTTL = %d, want in [%d, %d]", pttl, lo, hi)
			}
			rd, wr := heard(&rdHeard), heard(&wrHeard)
			if !slices.Equal(rd, tc.want.rd) && (len(rd) != 0 || len(tc.want.rd) != 0) {
				t.Errorf("readers' wake-ups = %q, want %q", rd, tc.want.rd)
			}
			if !slices.Equal(wr, tc.want.wr) && (len(wr) != 0 || len(tc.want.wr) != 0) {
				t.Errorf("writers' wake-ups = %q, want %q", wr, tc.want.wr)
			}
		})
	}
}
