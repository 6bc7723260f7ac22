package mutex_test

// Tests of what rwmutex_rlock promises, as a class (issue 32): its header
// and body read line by line, each path asserted both ways, with the exact
// reply, every read entry, the readers' set's TTL and the state hash (which
// an RLock never writes). The script is driven directly
// (TestScriptRWRLockClass) on hand-written state: a write hold of the same
// owner under another token, a mark with a writer holding, released and
// expired entries beside the one a nested RLock names.
//
// The paths, each with rows that must and must not take it:
//   - a nested RLock answers {1, 0, 0} if its acquisition's lease runs,
//     whatever holds readers out, else {-1, 0, 0} (gone, expired, or
//     released), and writes nothing;
//   - a malformed attempt id is an error; an attempt with a tombstone is
//     refused with {0, 1, 0} and writes nothing;
//   - another owner's running write lease refuses it with the time the
//     lease has left, and so does the owner's own under another token (or
//     none named); the owner's own, named by its token, lets it through,
//     past a running mark too; a lease over lets anyone through;
//   - a running writer-waiting mark refuses it with the time it has left;
//   - a grant adds the entry with the lease from now, and the set lives
//     at least the lease (never shortened).

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

func TestScriptRWRLockClass(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc := newScripts(t, client)
	rlock, _ := sc.Script("rwmutex_rlock")
	itoa := func(n int64) string { return strconv.FormatInt(n, 10) }
	const lease = 30_000
	// released stands for a released member's mark, -(now + 5000).
	const released = -1 << 40

	type setup struct {
		hash  func(now int64) map[string]string
		reads map[string]int64 // member -> score relative to now, or released
		setMs int64            // the readers' set's PTTL (0: 60 s)
		tomb  string
	}
	writer := func(owner string, eRel int64, extra ...string) func(now int64) map[string]string {
		return func(now int64) map[string]string {
			h := map[string]string{"o": owner, "n": "1", "f": "500", "a": "w.1", "e": itoa(now + eRel)}
			for i := 0; i+1 < len(extra); i += 2 {
				h[extra[i]] = extra[i+1]
			}
			return h
		}
	}
	mark := func(qRel int64) func(now int64) map[string]string {
		return func(now int64) map[string]string { return map[string]string{"f": "500", "q": itoa(now + qRel)} }
	}
	const (
		grant   = iota // {1, 0, 0}, r.1 added with the lease
		joined         // {1, 0, 0}, nothing written
		gone           // {-1, 0, 0}, nothing written
		refused        // {0, wait, 0}, nothing written
		failed         // an error, nothing written
	)
	for _, tc := range []struct {
		name  string
		setup setup
		args  []string // owner, holds, attempt, write token (the lease is ARGV[2])
		want  int
		wait  int64 // refused: the wait, at most this and more than this less the call's time
	}{
		// Nested.
		{name: "nested, lease runs", setup: setup{reads: map[string]int64{"r.1": 10_000}}, args: []string{"R", "1", "r.1", ""}, want: joined},
		{name: "nested, a writer holds and a mark runs", setup: setup{reads: map[string]int64{"r.1": 10_000}, hash: writer("W", 30_000, "q", "q"), tomb: "r.1"}, args: []string{"R", "2", "r.1", ""}, want: joined},
		{name: "nested, lease over", setup: setup{reads: map[string]int64{"r.1": -1, "s.1": 10_000}}, args: []string{"R", "1", "r.1", ""}, want: gone},
		{name: "nested, released", setup: setup{reads: map[string]int64{"r.1": released, "s.1": 10_000}}, args: []string{"R", "1", "r.1", ""}, want: gone},
		{name: "nested, no entry", setup: setup{reads: map[string]int64{"s.1": 10_000}}, args: []string{"R", "1", "r.1", ""}, want: gone},

		// Attempt ids and tombstones.
		{name: "malformed attempt id", args: []string{"R", "0", "r1", ""}, want: failed},
		{name: "malformed attempt id, no sequence number", args: []string{"R", "0", "r.x", ""}, want: failed},
		{name: "malformed attempt id, empty sequence number", args: []string{"R", "0", "r.", ""}, want: failed},
		{name: "attempt id with dots in its nonce", args: []string{"R", "0", "a.b.12", ""}, want: grant},
		{name: "tombstone", setup: setup{tomb: "r.1", reads: map[string]int64{"s.1": 10_000}}, args: []string{"R", "0", "r.1", ""}, want: refused, wait: 1},
		{name: "tombstone of another attempt", setup: setup{tomb: "r.2"}, args: []string{"R", "0", "r.1", ""}, want: grant},

		// Writers.
		{name: "another owner's lease runs", setup: setup{hash: writer("W", 20_000)}, args: []string{"R", "0", "r.1", ""}, want: refused, wait: 20_000},
		{name: "another owner's lease runs, its token named", setup: setup{hash: writer("W", 20_000)}, args: []string{"R", "0", "r.1", "500"}, want: refused, wait: 20_000},
		{name: "own lease, no token named", setup: setup{hash: writer("R", 20_000)}, args: []string{"R", "0", "r.1", ""}, want: refused, wait: 20_000},
		{name: "own lease, another token named", setup: setup{hash: writer("R", 20_000)}, args: []string{"R", "0", "r.1", "499"}, want: refused, wait: 20_000},
		{name: "own lease, its token named", setup: setup{hash: writer("R", 20_000)}, args: []string{"R", "0", "r.1", "500"}, want: grant},
		{name: "own lease, its token named, a mark runs", setup: setup{hash: writer("R", 20_000, "q", "q")}, args: []string{"R", "0", "r.1", "500"}, want: grant},
		{name: "own lease over, its token named, a mark runs", setup: setup{hash: writer("R", -1000, "q", "q")}, args: []string{"R", "0", "r.1", "500"}, want: refused, wait: 25_000},
		{name: "another owner's lease over", setup: setup{hash: writer("W", -1000)}, args: []string{"R", "0", "r.1", ""}, want: grant},

		// Marks.
		{name: "a mark runs", setup: setup{hash: mark(15_000)}, args: []string{"R", "0", "r.1", ""}, want: refused, wait: 15_000},
		{name: "a mark is over", setup: setup{hash: mark(-1000)}, args: []string{"R", "0", "r.1", ""}, want: grant},
		{name: "a writer and a later mark: the writer's wait", setup: setup{hash: writer("W", 5000, "q", "q")}, args: []string{"R", "0", "r.1", ""}, want: refused, wait: 5000},

		// Grants and the set's life.
		{name: "grant, no set", args: []string{"R", "0", "r.1", ""}, want: grant},
		{name: "grant, live and released entries stay", setup: setup{reads: map[string]int64{"s.1": 10_000, "q.1": released}}, args: []string{"R", "0", "r.1", ""}, want: grant},
		{name: "grant, longer set kept", setup: setup{reads: map[string]int64{"s.1": 50_000}, setMs: 60_000}, args: []string{"R", "0", "r.1", ""}, want: grant},
		{name: "grant, shorter set lengthened", setup: setup{reads: map[string]int64{"s.1": 5000}, setMs: 5000}, args: []string{"R", "0", "r.1", ""}, want: grant},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := className("rw-rlock-class")
			keys := []string{rwKey(name, "h"), rwKey(name, "z"), rwKey(name, "t")}
			now := serverMicros(t, client) / 1000
			do := func(cmd ...string) {
				t.Helper()
				if err := client.Do(ctx, client.B().Arbitrary(cmd[0]).Keys(cmd[1]).Args(cmd[2:]...).Build()).Error(); err != nil {
					t.Fatalf("%v: %v", cmd, err)
				}
			}
			t.Cleanup(func() { client.Do(ctx, client.B().Del().Key(keys...).Build()) })
			var hash map[string]string
			if tc.setup.hash != nil {
				hash = tc.setup.hash(now)
				if hash["q"] == "q" { // a mark past the lease
					hash["q"] = itoa(now + 25_000)
				}
				cmd := []string{"HSET", keys[0]}
				for k, v := range hash {
					cmd = append(cmd, k, v)
				}
				do(cmd...)
				do("PEXPIRE", keys[0], "60000")
			}
			before := map[string]float64{}
			for m, rel := range tc.setup.reads {
				score := now + rel
				if rel == released {
					score = -(now + 5000)
				}
				before[m] = float64(score)
				do("ZADD", keys[1], itoa(score), m)
			}
			setMs := tc.setup.setMs
			if setMs == 0 {
				setMs = 60_000
			}
			if len(before) > 0 {
				do("PEXPIRE", keys[1], itoa(setMs))
			}
			if tc.setup.tomb != "" {
				do("HSET", keys[2], tc.setup.tomb, "1")
				do("PEXPIRE", keys[2], "60000")
			}
			owner, holds, attempt, token := tc.args[0], tc.args[1], tc.args[2], tc.args[3]
			reply, err := rlock.Exec(ctx, keys, []string{owner, itoa(lease), holds, attempt, token}).AsIntSlice()
			after := serverMicros(t, client) / 1000

			switch tc.want {
			case failed:
				if err == nil || !strings.Contains(err.Error(), "malformed attempt id") {
					t.Errorf("reply = %v, %v; want the malformed attempt id error", reply, err)
				}
			case refused:
				if err != nil || len(reply) != 3 || reply[0] != 0 || reply[2] != 0 || reply[1] > tc.wait || reply[1] < max(tc.wait-(after-now), 1) {
					t.Errorf("reply = %v, %v; want a refusal [0 ~%d 0]", reply, err, tc.wait)
				}
			case gone:
				if err != nil || !equalInts(reply, []int64{-1, 0, 0}) {
					t.Errorf("reply = %v, %v; want [-1 0 0]", reply, err)
				}
			default:
				if err != nil || !equalInts(reply, []int64{1, 0, 0}) {
					t.Errorf("reply = %v, %v; want [1 0 0]", reply, err)
				}
			}
			// The hash and the tombstones are never written.
			fields, err := client.Do(ctx, client.B().Hgetall().Key(keys[0]).Build()).AsStrMap()
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(fields, hash) && (len(fields) != 0 || len(hash) != 0) {
				t.Errorf("hash = %v, want %v as it was", fields, hash)
			}
			tombs, err := client.Do(ctx, client.B().Hgetall().Key(keys[2]).Build()).AsStrMap()
			if err != nil {
				t.Fatal(err)
			}
			if len(tombs) > 1 || (tc.setup.tomb == "") != (len(tombs) == 0) {
				t.Errorf("tombstones = %v, want %q alone", tombs, tc.setup.tomb)
			}
			got := zscores(t, client, keys[1])
			pttl, err := client.Do(ctx, client.B().Pttl().Key(keys[1]).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != grant {
				if !maps.Equal(got, before) && (len(got) != 0 || len(before) != 0) {
					t.Errorf("readers' set = %v, want %v as it was", got, before)
				}
				if len(before) > 0 && (pttl < setMs-10_000 || pttl > setMs) {
					t.Errorf("the readers' set's PTTL = %d, want its %d ms left alone", pttl, setMs)
				}
				return
			}
			s, ok := got[attempt]
			if !ok || int64(s) < now+lease || int64(s) > after+lease {
				t.Errorf("the entry's score = %v, %v; want the lease's end in [%d, %d]", s, ok, now+lease, after+lease)
			}
			want := maps.Clone(before)
			want[attempt] = s
			if !maps.Equal(got, want) {
				t.Errorf("readers' set = %v, want %v", got, want)
			}
			lo, hi := int64(lease-10_000), int64(lease)
			if setMs > lease && len(before) > 0 {
				lo, hi = setMs-10_000, setMs
			}
			if pttl < lo || pttl > hi {
				t.Errorf("the readers' set's PTTL = %d, want in [%d, %d]", pttl, lo, hi)
			}
		})
	}
}
