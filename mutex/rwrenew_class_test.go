package mutex_test

// Tests of what rwmutex_renew_batch promises, as a class (issue 32): each
// acquisition of a call answered on its own, and each key's TTL stretched
// only when an acquisition kept in it was renewed. The script is driven
// directly (TestScriptRWRenewBatchClass) on three hand-written locks in
// one call: A and B with write and read holds (B's keys living longer
// than the lease), C's keys overwritten by strings.
//
// The rows assert, for every acquisition, the answer (1 renewed, 0 not
// held, -1 kept in a key of another type) and its end afterwards (the
// lease from now, or as it was), and for every key its TTL: a key in which
// a lease was renewed lives at least the lease, a longer TTL is kept, and
// a key in which nothing was renewed is left alone, however short. What
// is not held: another owner, another token, a lease over, a read entry
// expired, released or missing, an acquisition named on another lock.

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

func TestScriptRWRenewBatchClass(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc := newScripts(t, client)
	renew, _ := sc.Script("rwmutex_renew_batch")
	itoa := func(n int64) string { return strconv.FormatInt(n, 10) }
	const lease = 30_000
	// released stands for a released member's mark, -(now + 5000).
	const released = -1 << 40

	// item is one acquisition of the call: lock j (1 A, 2 B, 3 C), owner
	// ("" a read), token or read id; want its answer.
	type item struct {
		j     int
		owner string
		id    string
		want  int64
	}
	type lock struct {
		e      int64            // the write lease's end, relative to now (0: no hash)
		owner  string           // the writer (token: 500)
		hashMs int64            // the hash's PTTL
		reads  map[string]int64 // read id -> end relative to now, or released
		setMs  int64            // the set's PTTL
	}
	for _, tc := range []struct {
		name  string
		a, b  lock
		items []item
	}{
		{
			name: "every answer in one call",
			a:    lock{e: 5000, owner: "W", hashMs: 5000, reads: map[string]int64{"r.1": 5000, "r.2": -1, "r.3": released}, setMs: 5000},
			b:    lock{e: 5000, owner: "V", hashMs: 120_000, reads: map[string]int64{"s.1": 5000}, setMs: 120_000},
			items: []item{
				{1, "W", "500", 1}, {1, "W", "499", 0}, {1, "X", "500", 0},
				{1, "", "r.1", 1}, {1, "", "r.2", 0}, {1, "", "r.3", 0}, {1, "", "r.9", 0},
				{2, "V", "500", 1}, {2, "", "s.1", 1}, {2, "W", "500", 0}, {2, "", "r.1", 0},
				{3, "W", "500", -1}, {3, "", "r.1", -1},
			},
		},
		{
			name: "a lease over is not brought back, its keys left",
			a:    lock{e: -1, owner: "W", hashMs: 5000, reads: map[string]int64{"r.1": -1}, setMs: 5000},
			b:    lock{e: 5000, owner: "V", hashMs: 5000, reads: map[string]int64{"s.1": 5000}, setMs: 5000},
			items: []item{
				{1, "W", "500", 0}, {1, "", "r.1", 0}, {2, "V", "500", 1},
			},
		},
		{
			name: "a write renewed, the readers' set left",
			a:    lock{e: 5000, owner: "W", hashMs: 5000, reads: map[string]int64{"r.1": 5000}, setMs: 5000},
			items: []item{
				{1, "W", "500", 1},
			},
		},
		{
			name: "a read renewed, the hash left",
			a:    lock{e: 5000, owner: "W", hashMs: 5000, reads: map[string]int64{"r.1": 5000}, setMs: 5000},
			items: []item{
				{1, "", "r.1", 1},
			},
		},
		{
			name: "the second lock's acquisitions",
			a:    lock{e: 5000, owner: "W", hashMs: 5000, reads: map[string]int64{"r.1": 5000}, setMs: 5000},
			b:    lock{e: 5000, owner: "V", hashMs: 5000, reads: map[string]int64{"s.1": 5000}, setMs: 5000},
			items: []item{
				{2, "", "s.1", 1}, {2, "V", "500", 1},
			},
		},
		{
			name:  "no keys",
			items: []item{{1, "W", "500", 0}, {1, "", "r.1", 0}, {2, "V", "500", 0}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := className("rw-renew-class")
			keys := []string{}
			for _, l := range []string{"a", "b", "c"} {
				keys = append(keys, rwKey(name+l, "h"), rwKey(name+l, "z"))
			}
			// One slot for the three locks' keys is not needed on a
			// single server.
			t.Cleanup(func() { client.Do(ctx, client.B().Del().Key(keys...).Build()) })
			do := func(cmd ...string) {
				t.Helper()
				if err := client.Do(ctx, client.B().Arbitrary(cmd[0]).Keys(cmd[1]).Args(cmd[2:]...).Build()).Error(); err != nil {
					t.Fatalf("%v: %v", cmd, err)
				}
			}
			now := serverMicros(t, client) / 1000
			score := func(rel int64) int64 {
				if rel == released {
					return -(now + 5000)
				}
				return now + rel
			}
			for i, l := range []lock{tc.a, tc.b} {
				if l.e != 0 {
					do("HSET", keys[2*i], "o", l.owner, "n", "1", "f", "500", "a", "w.1", "e", itoa(now+l.e))
					do("PEXPIRE", keys[2*i], itoa(l.hashMs))
				}
				for id, rel := range l.reads {
					do("ZADD", keys[2*i+1], itoa(score(rel)), id)
				}
				if len(l.reads) > 0 {
					do("PEXPIRE", keys[2*i+1], itoa(l.setMs))
				}
			}
			do("SET", keys[4], "x", "PX", "60000")
			do("SET", keys[5], "x", "PX", "60000")
			args := []string{itoa(lease)}
			for _, it := range tc.items {
				args = append(args, strconv.Itoa(it.j), it.owner, it.id)
			}
			got, err := renew.Exec(ctx, keys, args).AsIntSlice()
			after := serverMicros(t, client) / 1000
			if err != nil || len(got) != len(tc.items) {
				t.Fatalf("reply = %v, %v; want %d answers", got, err, len(tc.items))
			}
			renewed := map[string]bool{}
			for i, it := range tc.items {
				if got[i] != it.want {
					t.Errorf("acquisition %d (lock %d, %q %s) = %d, want %d", i+1, it.j, it.owner, it.id, got[i], it.want)
				}
				if it.want == 1 {
					k := keys[2*(it.j-1)]
					if it.owner == "" {
						k = keys[2*(it.j-1)+1]
					}
					renewed[k] = true
				}
			}
			// Every lease's end: renewed ones from now, the others as set.
			for i, l := range []lock{tc.a, tc.b} {
				hKey, zKey := keys[2*i], keys[2*i+1]
				if l.e != 0 {
					e, err := client.Do(ctx, client.B().Hget().Key(hKey).Field("e").Build()).AsInt64()
					if err != nil {
						t.Fatal(err)
					}
					if renewed[hKey] {
						if e < now+lease || e > after+lease {
							t.Errorf("lock %d's write end = %d, want the lease from now, in [%d, %d]", i+1, e, now+lease, after+lease)
						}
					} else if e != now+l.e {
						t.Errorf("lock %d's write end = %d, want %d as it was", i+1, e, now+l.e)
					}
				}
				scores := zscores(t, client, zKey)
				if len(scores) != len(l.reads) {
					t.Errorf("lock %d's read entries = %v, want %d of them", i+1, scores, len(l.reads))
				}
				for id, rel := range l.reads {
					s := int64(scores[id])
					live := false
					for _, it := range tc.items {
						live = live || (it.j == i+1 && it.owner == "" && it.id == id && it.want == 1)
					}
					if live {
						if s < now+lease || s > after+lease {
							t.Errorf("lock %d's read %s ends at %d, want the lease from now, in [%d, %d]", i+1, id, s, now+lease, after+lease)
						}
					} else if s != score(rel) {
						t.Errorf("lock %d's read %s ends at %d, want %d as it was", i+1, id, s, score(rel))
					}
				}
				// TTLs: at least the lease where renewed, a longer one
				// kept; left alone where nothing was.
				for k, ms := range map[string]int64{hKey: l.hashMs, zKey: l.setMs} {
					if ms == 0 {
						continue
					}
					pttl, err := client.Do(ctx, client.B().Pttl().Key(k).Build()).AsInt64()
					if err != nil {
						t.Fatal(err)
					}
					lo, hi := max(ms-10_000, 1), ms
					if renewed[k] && ms < lease {
						lo, hi = lease-10_000, lease
					}
					if pttl < lo || pttl > hi {
						t.Errorf("%s's PTTL = %d (set to %d, renewed in it: %v), want in [%d, %d]", k, pttl, ms, renewed[k], lo, hi)
					}
				}
			}
			// C's strings are left as they were.
			for _, k := range keys[4:] {
				if v, err := client.Do(ctx, client.B().Get().Key(k).Build()).ToString(); err != nil || v != "x" {
					t.Errorf("%s = %q, %v; want the string left", k, v, err)
				}
			}
		})
	}
}
