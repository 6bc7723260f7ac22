package mutex_test

// Tests of what rwmutex_force promises, as a class (issue 32): its header
// and body read line by line, each behaviour asserted both ways. The
// script is driven directly (TestScriptRWForceClass): RWMutex.ForceUnlock
// reports only whether anything was held, and the states that tell the
// paths apart (a writer whose lease ran out while its hash lives, a run
// of 16 or 17 listed holds, expired and released readers beside live
// ones, a mark far past the keep time) are written by hand first.
//
// The behaviours, one row each:
//   - the reply is {1 if a writer's lease is running, live readers}: an
//     expired writer counts 0, expired and released read entries count
//     nothing, a live writer and its own read hold count {1, 1};
//   - a write hold, live or expired, is ended: o, n, a and e go, f stays,
//     and c lists its token after what it listed (the run's start kept);
//     with 16 listed already, the oldest listed token goes and the run
//     starts one past it; a hash without o (a released lock) is left as
//     it was, TTL included;
//   - the hash is kept for the keep time (ARGV[2]) or until the writers'
//     mark (q) ends, whichever is later, and q stays;
//   - the readers' set is deleted, live entries or not;
//   - a writer or a live reader released wakes both sides once ("1" to
//     the writers, "1000000" to the readers), with SPUBLISH when ARGV[1]
//     is "s" and PUBLISH otherwise; nothing held, nothing published.

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

func TestScriptRWForceClass(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	const keep = 1000 // ms, the rig's ARGV[2]
	// run returns a run of holds: its start, then n listed tokens, all
	// below f.
	run := func(f int64, n int) []string {
		out := []string{strconv.FormatInt(f-1_000_000, 10)}
		for i := range n {
			out = append(out, strconv.FormatInt(f-100_000+int64(i)*1000, 10))
		}
		return out
	}
	writer := func(f int64, eMs int64, c []string) map[string]string {
		return map[string]string{"o": "W", "n": "2", "f": strconv.FormatInt(f, 10), "a": "w.1", "e": strconv.FormatInt(eMs, 10), "c": strings.Join(c, " ")}
	}
	type want struct {
		reply  []int64
		fields func(f int64, c []string, nowMs int64) map[string]string // nil: no hash
		pttl   [2]int64                                                 // (lo, hi]; 0, 0: not checked
		woken  bool
	}
	ended := func(f int64, c []string, _ int64) map[string]string {
		return map[string]string{"f": strconv.FormatInt(f, 10), "c": strings.Join(append(slices.Clone(c), strconv.FormatInt(f, 10)), " ")}
	}
	for _, tc := range []struct {
		name    string
		mode    string // ARGV[1]
		listed  int    // tokens listed in c after its start
		hash    func(f, nowMs int64, c []string) map[string]string
		readers []string // read entries: "live" (30 s left), "expired" (a second ago), "released" (kept for a retried RUnlock)
		want    want
	}{
		{name: "free", want: want{reply: []int64{0, 0}}},
		{
			name: "live writer", mode: "p",
			hash: func(f, now int64, c []string) map[string]string { return writer(f, now+30_000, c) },
			want: want{reply: []int64{1, 0}, fields: ended, pttl: [2]int64{0, keep}, woken: true},
		},
		{
			name: "live writer, sharded", mode: "s",
			hash: func(f, now int64, c []string) map[string]string { return writer(f, now+30_000, c) },
			want: want{reply: []int64{1, 0}, fields: ended, pttl: [2]int64{0, keep}, woken: true},
		},
		{
			// The lease ran out, the hash lives on: the hold still ends
			// and is listed, but nothing was held and nobody is woken.
			name: "expired writer", mode: "p",
			hash: func(f, now int64, c []string) map[string]string { return writer(f, now-1, c) },
			want: want{reply: []int64{0, 0}, fields: ended, pttl: [2]int64{0, keep}},
		},
		{
			name: "16 listed", mode: "p", listed: 15,
			hash: func(f, now int64, c []string) map[string]string { return writer(f, now+30_000, c) },
			want: want{reply: []int64{1, 0}, fields: ended, pttl: [2]int64{0, keep}, woken: true},
		},
		{
			// A 17th listed token pushes the oldest out; the run then
			// starts one past it.
			name: "17 listed", mode: "p", listed: 16,
			hash: func(f, now int64, c []string) map[string]string { return writer(f, now+30_000, c) },
			want: want{reply: []int64{1, 0}, woken: true, pttl: [2]int64{0, keep}, fields: func(f int64, c []string, _ int64) map[string]string {
				first, _ := strconv.ParseInt(c[1], 10, 64)
				next := append([]string{strconv.FormatInt(first+1, 10)}, c[2:]...)
				return map[string]string{"f": strconv.FormatInt(f, 10), "c": strings.Join(append(next, strconv.FormatInt(f, 10)), " ")}
			}},
		},
		{
			// A writer waits: its mark (q) outlives the keep time, and
			// the hash lives until the mark ends.
			name: "live writer, mark running", mode: "p",
			hash: func(f, now int64, c []string) map[string]string {
				h := writer(f, now+30_000, c)
				h["q"] = strconv.FormatInt(now+20_000, 10)
				return h
			},
			want: want{reply: []int64{1, 0}, woken: true, pttl: [2]int64{keep, 20_000}, fields: func(f int64, c []string, now int64) map[string]string {
				h := ended(f, c, now)
				h["q"] = strconv.FormatInt(now+20_000, 10)
				return h
			}},
		},
		{
			// A mark that ended: the keep time rules.
			name: "live writer, mark over", mode: "p",
			hash: func(f, now int64, c []string) map[string]string {
				h := writer(f, now+30_000, c)
				h["q"] = strconv.FormatInt(now-5_000, 10)
				return h
			},
			want: want{reply: []int64{1, 0}, woken: true, pttl: [2]int64{0, keep}, fields: func(f int64, c []string, now int64) map[string]string {
				h := ended(f, c, now)
				h["q"] = strconv.FormatInt(now-5_000, 10)
				return h
			}},
		},
		{
			// Released: no write hold to end. The hash is left as it is,
			// c unlisted and the TTL not cut to the keep time.
			name: "released writer", mode: "p",
			hash: func(f, now int64, c []string) map[string]string {
				return map[string]string{"f": strconv.FormatInt(f, 10), "c": strings.Join(c, " "), "r": "W " + strconv.FormatInt(f, 10)}
			},
			want: want{reply: []int64{0, 0}, pttl: [2]int64{30_000, 60_000}, fields: func(f int64, c []string, _ int64) map[string]string {
				return map[string]string{"f": strconv.FormatInt(f, 10), "c": strings.Join(c, " "), "r": "W " + strconv.FormatInt(f, 10)}
			}},
		},
		{
			// Two live readers, one expired, one released a moment ago:
			// two are released, and the set goes.
			name: "readers", mode: "p",
			readers: []string{"live", "live", "expired", "released"},
			want:    want{reply: []int64{0, 2}, woken: true},
		},
		{
			name: "only dead readers", mode: "p",
			readers: []string{"expired", "released"},
			want:    want{reply: []int64{0, 0}},
		},
		{
			// The writer's own read hold, beside its write hold.
			name: "writer and its read hold", mode: "p",
			hash:    func(f, now int64, c []string) map[string]string { return writer(f, now+30_000, c) },
			readers: []string{"live"},
			want:    want{reply: []int64{1, 1}, fields: ended, pttl: [2]int64{0, keep}, woken: true},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRWScriptRig(t, "rw-force-class:")
			hKey, zKey, rdCh, wrCh := r.forceKeys[0], r.forceKeys[1], r.forceKeys[2], r.forceKeys[3]
			readersHeard := listenBoth(t, srv.Addr(), rdCh)
			writersHeard := listenBoth(t, srv.Addr(), wrCh)
			f := serverMicros(t, client) + 1_000_000_000 // ahead of the clock: never a token of now
			now := serverMicros(t, client) / 1000
			c := run(f, tc.listed)
			if tc.hash != nil {
				var kv []string
				for k, v := range tc.hash(f, now, c) {
					kv = append(kv, k, v)
				}
				cmd := client.B().Hset().Key(hKey).FieldValue()
				for i := 0; i < len(kv); i += 2 {
					cmd = cmd.FieldValue(kv[i], kv[i+1])
				}
				if err := client.Do(ctx, cmd.Build()).Error(); err != nil {
					t.Fatal(err)
				}
				if err := client.Do(ctx, client.B().Pexpire().Key(hKey).Milliseconds(60_000).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			for i, kind := range tc.readers {
				score := map[string]int64{"live": now + 30_000, "expired": now - 1_000, "released": -(now + 5_000)}[kind]
				if err := client.Do(ctx, client.B().Zadd().Key(zKey).ScoreMember().ScoreMember(float64(score), "r."+strconv.Itoa(i)).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			mode := tc.mode
			if mode == "" {
				mode = "p"
			}
			got, err := r.force.Exec(ctx, r.forceKeys, []string{mode, strconv.Itoa(keep)}).AsIntSlice()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want.reply) {
				t.Errorf("reply = %v, want %v", got, tc.want.reply)
			}

			fields, err := client.Do(ctx, client.B().Hgetall().Key(hKey).Build()).AsStrMap()
			if err != nil {
				t.Fatal(err)
			}
			var wantFields map[string]string
			if tc.want.fields != nil {
				wantFields = tc.want.fields(f, c, now)
			}
			if len(fields) != len(wantFields) {
				t.Errorf("hash after = %v, want %v", fields, wantFields)
			} else {
				for k, v := range wantFields {
					if fields[k] != v {
						t.Errorf("hash after = %v, want %v", fields, wantFields)
						break
					}
				}
			}
			if tc.want.pttl != [2]int64{} {
				ttl, err := client.Do(ctx, client.B().Pttl().Key(hKey).Build()).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				if ttl <= tc.want.pttl[0] || ttl > tc.want.pttl[1] {
					t.Errorf("hash's PTTL after = %d ms, want in (%d, %d]", ttl, tc.want.pttl[0], tc.want.pttl[1])
				}
			}
			if n, err := client.Do(ctx, client.B().Exists().Key(zKey).Build()).AsInt64(); err != nil || n != 0 {
				t.Errorf("readers' set exists = %d, %v after ForceUnlock; want deleted", n, err)
			}

			wantPlain, wantSharded := []string(nil), []string(nil)
			wrPlain, wrSharded := writersHeard()
			rdPlain, rdSharded := readersHeard()
			if tc.want.woken {
				if mode == "s" {
					wantSharded = []string{"1"}
				} else {
					wantPlain = []string{"1"}
				}
			}
			if !slices.Equal(wrPlain, wantPlain) || !slices.Equal(wrSharded, wantSharded) {
				t.Errorf("writers' channel got %q by PUBLISH and %q by SPUBLISH, want %q and %q", wrPlain, wrSharded, wantPlain, wantSharded)
			}
			for i := range wantPlain {
				wantPlain[i] = "1000000"
			}
			for i := range wantSharded {
				wantSharded[i] = "1000000"
			}
			if !slices.Equal(rdPlain, wantPlain) || !slices.Equal(rdSharded, wantSharded) {
				t.Errorf("readers' channel got %q by PUBLISH and %q by SPUBLISH, want %q and %q", rdPlain, rdSharded, wantPlain, wantSharded)
			}
		})
	}
}
