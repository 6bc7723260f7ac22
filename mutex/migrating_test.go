package mutex_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// The lock scripts, run by hand while their slot migrates, on states where
// the call empties a key (the last dead queue entry, the last expired
// reader, the last writer's mark): the call must succeed, whatever it does
// after.
//
// While a slot migrates, a script may touch only the keys its node holds;
// a key it emptied itself counts as not held, and a command on it fails
// the call ("Script attempted to access a non local key") after its
// earlier writes were made (Redis does not roll a script back). A write
// hold granted before such a failure is one nobody knows of: its caller
// got an error and gives nothing back. Every key of a state is written
// before the migration starts, as the call runs on the owner only when it
// holds every key it is sent (else TRYAGAIN).

// migratingCall is one state of some lock keys, a script call on it, and
// what must hold after.
type migratingCall struct {
	name   string
	script string
	// state: commands, "$k" in an argument stands for the key k
	// ("rec", "x", "q", "e" for a mutex; "h", "z", "t", "m" for a
	// read-write lock).
	state [][]string
	args  []string // ARGV, "$k" as above
	want  []int64  // the reply (a token in it: -1 matches any above 0)
	// after: a command whose reply (as a list of strings) must be after.
	after     []string
	afterWant []string
}

func TestLockScriptsInMigratingSlot(t *testing.T) {
	const live = "99999999999999" // a time in ms far ahead
	for _, tt := range []migratingCall{
		{
			name:   "fair Lock on a free lock, its queue only dead entries",
			script: "mutex_lock",
			state: [][]string{
				{"SET", "$rec", "Lqx:100:100|", "PX", "60000"},
				{"HSET", "$x", "old.1", "1"},
				{"ZADD", "$q", "1", "dead.1", "2", "dead.2"},
				{"HSET", "$e", "dead.1", "1 gone", "dead.2", "2 gone"},
			},
			args:      []string{"60000", "me", "me.1", "f"},
			want:      []int64{1, 1, -1},
			after:     []string{"EXISTS", "$q", "$e"},
			afterWant: []string{"0"},
		},
		{
			name:   "fair Lock queued behind dead entries only",
			script: "mutex_lock",
			state: [][]string{
				{"SET", "$rec", "Lqx:100:100|", "PX", "60000"},
				{"HSET", "$x", "old.1", "1"},
				{"ZADD", "$q", "1", "dead.1", "2", "me.1"},
				{"HSET", "$e", "dead.1", "1 gone", "me.1", live + " me"},
			},
			args:      []string{"60000", "me", "me.1", "f"},
			want:      []int64{1, 1, -1},
			after:     []string{"EXISTS", "$q", "$e"},
			afterWant: []string{"0"},
		},
		{
			name:   "fair Lock behind a dead entry and a live one: queued, the dead one gone",
			script: "mutex_lock",
			state: [][]string{
				{"SET", "$rec", "Lqx:100:100|", "PX", "60000"},
				{"HSET", "$x", "old.1", "1"},
				{"ZADD", "$q", "1", "dead.1", "2", "live.1"},
				{"HSET", "$e", "dead.1", "1 gone", "live.1", live + " other"},
			},
			args:      []string{"60000", "me", "me.1", "f"},
			want:      []int64{0, -2, 0},
			after:     []string{"ZRANGE", "$q", "0", "-1"},
			afterWant: []string{"live.1", "me.1"},
		},
		{
			name:   "write Lock that waited, its mark the last, the readers only expired",
			script: "rwmutex_lock",
			state: [][]string{
				{"HSET", "$h", "q", live, "f", "100"},
				{"ZADD", "$z", "1", "reader.1"},
				{"HSET", "$t", "old.1", "1"},
				{"ZADD", "$m", live, "mark.1"},
			},
			args:      []string{"me", "60000", "0", "me.1", "", "1000", "mark.1"},
			want:      []int64{1, 1, -1},
			after:     []string{"HMGET", "$h", "o", "q"},
			afterWant: []string{"me", ""},
		},
		{
			name:   "write Lock that waited, another writer's mark left",
			script: "rwmutex_lock",
			state: [][]string{
				{"HSET", "$h", "q", live, "f", "100"},
				{"ZADD", "$z", "1", "reader.1"},
				{"HSET", "$t", "old.1", "1"},
				{"ZADD", "$m", live, "mark.1", "1", "dead.mark", "99999999999998", "other.mark"},
			},
			args:      []string{"me", "60000", "0", "me.1", "", "1000", "mark.1"},
			want:      []int64{1, 1, -1},
			after:     []string{"ZRANGE", "$m", "0", "-1"},
			afterWant: []string{"other.mark"},
		},
		{
			name:   "write Lock that waited, another writer's mark later than its own: q comes back to that one",
			script: "rwmutex_lock",
			state: [][]string{
				{"HSET", "$h", "q", live, "f", "100"},
				{"ZADD", "$z", "1", "reader.1"},
				{"HSET", "$t", "old.1", "1"},
				{"ZADD", "$m", "99999999999990", "mark.1", live, "other.mark"},
			},
			args:      []string{"me", "60000", "0", "me.1", "", "1000", "mark.1"},
			want:      []int64{1, 1, -1},
			after:     []string{"HMGET", "$h", "o", "q"},
			afterWant: []string{"me", live},
		},
		{
			name:   "read lock past expired readers only",
			script: "rwmutex_rlock",
			state: [][]string{
				{"HSET", "$h", "f", "100"},
				{"ZADD", "$z", "1", "reader.1", "2", "reader.2"},
				{"HSET", "$t", "old.1", "1"},
			},
			args:      []string{"me", "60000", "0", "me.1", ""},
			want:      []int64{1, 0, 0},
			after:     []string{"ZRANGE", "$z", "0", "-1"},
			afterWant: []string{"me.1"},
		},
		{
			// A retry after a lost reply whose first read lease ran out:
			// listed again, not removed with the other expired ones.
			name:   "read lock retried, its own read lease the oldest expired",
			script: "rwmutex_rlock",
			state: [][]string{
				{"HSET", "$h", "f", "100"},
				{"ZADD", "$z", "1", "me.1", "2", "reader.2"},
				{"HSET", "$t", "old.1", "1"},
			},
			args:      []string{"me", "60000", "0", "me.1", ""},
			want:      []int64{1, 0, 0},
			after:     []string{"ZRANGE", "$z", "0", "-1"},
			afterWant: []string{"me.1"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) { runMigrating(t, tt) })
	}
}

func runMigrating(t *testing.T, tt migratingCall) {
	c := redistest.SharedCluster(t)
	client := redistest.Client(t, c.Addrs()...)
	sc := newScripts(t, client)
	ctx := context.Background()
	name := "migrating:" + t.Name() + ":" + uuid.NewString()[:8]
	p := mutex.DefaultPrefix
	keys := map[string]string{
		"rec": keyspace.Key(p, name, ""), "x": keyspace.Key(p, name, ":x"),
		"q": keyspace.Key(p, name, ":q"), "e": keyspace.Key(p, name, ":e"),
		"h": keyspace.Key(p, name, ":rw.h"), "z": keyspace.Key(p, name, ":rw.z"),
		"t": keyspace.Key(p, name, ":rw.t"), "m": keyspace.Key(p, name, ":rw.m"),
	}
	fill := func(args []string) []string {
		out := slices.Clone(args)
		for i, a := range out {
			if len(a) > 1 && a[0] == '$' {
				out[i] = keys[a[1:]]
			}
		}
		return out
	}
	sent := fill(map[string][]string{
		"mutex_lock":    {"$rec", "$x", "$q", "$e"},
		"rwmutex_lock":  {"$h", "$z", "$t", "$m"},
		"rwmutex_rlock": {"$h", "$z", "$t"},
	}[tt.script])
	for _, cmd := range tt.state {
		cmd = fill(cmd)
		if err := client.Do(ctx, client.B().Arbitrary(cmd...).Build()).Error(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
		if err := client.Do(ctx, client.B().Pexpire().Key(cmd[1]).Milliseconds(60000).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	end := c.StartKeyMigration(t, sent[0])

	s, err := sc.Script(tt.script)
	if err != nil {
		t.Fatal(err)
	}
	got, err := lockAnswer(s.Exec(ctx, sent, tt.args))
	if err != nil {
		t.Fatalf("%s while the slot migrates: %v", tt.script, err)
	}
	want := slices.Clone(tt.want)
	for i, w := range want {
		if w == -1 && i < len(got) && got[i] > 0 {
			want[i] = got[i]
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s = %v, want %v", tt.script, got, tt.want)
	}
	end() // (a key read while the slot migrates may be redirected)
	out, err := client.Do(ctx, client.B().Arbitrary(fill(tt.after)...).Build()).ToAny()
	if err != nil {
		t.Fatal(err)
	}
	var strs []string
	switch v := out.(type) {
	case int64:
		strs = []string{strconv.FormatInt(v, 10)}
	case []any:
		for _, x := range v {
			s, _ := x.(string)
			strs = append(strs, s)
		}
	}
	if !slices.Equal(strs, tt.afterWant) {
		t.Errorf("%v after the call = %q, want %q", tt.after, strs, tt.afterWant)
	}
}

// TestLockWaitsOutSlotMigration: a Lock and an Unlock whose slot is
// migrating are refused with TRYAGAIN by the cluster before the script
// runs (the Lock's keys are on no node yet; the Unlock names the wake-up
// channel among its keys, which no node holds); each is sent again until
// the migration ends, not failed.
func TestLockWaitsOutSlotMigration(t *testing.T) {
	c := redistest.SharedCluster(t)
	client := redistest.Client(t, c.Addrs()...)
	l := newLocker(t, client, mutex.Options{})
	name := "migrating:" + t.Name() + ":" + uuid.NewString()[:8]
	m := newMutex(t, l, name)
	waitsOutMigration(t, c, lockKey(name), "Lock", m.Lock)
	waitsOutMigration(t, c, lockKey(name), "Unlock", m.Unlock)
}

// waitsOutMigration runs call while key's slot migrates: it must wait, a
// TRYAGAIN seen meanwhile, and succeed once the migration ends.
func waitsOutMigration(t *testing.T, c *redistest.Cluster, key, what string, call func(context.Context) error) {
	t.Helper()
	before := tryAgains(t, c)
	end := c.StartKeyMigration(t, key)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(ctx) }()
	if !redistest.WaitFor(ctx, signal, func() bool { return tryAgains(t, c) > before }) {
		t.Fatalf("%s: no TRYAGAIN seen while the slot migrates", what)
	}
	select {
	case err := <-done:
		t.Fatalf("%s returned while its slot migrates: %v", what, err)
	default:
	}
	end()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s after the migration ended: %v", what, err)
		}
	case <-time.After(signal):
		t.Fatalf("%s still waiting after the migration ended", what)
	}
}

// tryAgains sums the TRYAGAIN replies the cluster's nodes have sent.
func tryAgains(t *testing.T, c *redistest.Cluster) int64 {
	t.Helper()
	var n int64
	for _, s := range c.Nodes {
		out, err := s.Do("INFO", "errorstats")
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(out, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_TRYAGAIN:count="); ok {
				k, _ := strconv.ParseInt(v, 10, 64)
				n += k
			}
		}
	}
	return n
}
