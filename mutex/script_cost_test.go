package mutex_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestScriptCost measures the Redis server time of mutex_lock and
// mutex_release per call, by path, from the server's SLOWLOG (threshold 0),
// which times each script run on the server alone: no network, no client,
// so it stays comparable on a machine whose wall-clock numbers swing. It
// runs only when SLUICE_COST_REDIS names a server of one's own (it resets
// the slowlog and flushes nothing else); SLUICE_COST_LUA names a directory
// of scripts to measure instead of package lua's (say, the previous commit's,
// from git show), so that old and new can be run alternately, and
// SLUICE_COST_UNFAIR_ONLY=1 leaves out the fair paths:
//
//	SLUICE_COST_REDIS=127.0.0.1:6411 go test -run TestScriptCost -v ./mutex/
//
// Paths: the unfair uncontended pair through package mutex (64 goroutines,
// distinct names), and, script by script, a fair hand-off (a release with a
// live waiter queued) with the enqueue before it and the waiter's release
// after it.
func TestScriptCost(t *testing.T) {
	addr := os.Getenv("SLUICE_COST_REDIS")
	if addr == "" {
		t.Skip("SLUICE_COST_REDIS not set")
	}
	pairs := 400
	if s := os.Getenv("SLUICE_COST_PAIRS"); s != "" {
		pairs, _ = strconv.Atoi(s)
	}
	ctx := context.Background()
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	var opts []scriptcache.Option
	if dir := os.Getenv("SLUICE_COST_LUA"); dir != "" {
		opts = append(opts, scriptcache.WithFS(os.DirFS(dir)))
	}
	sc, err := scriptcache.New(ctx, client, opts...)
	if err != nil {
		t.Fatal(err)
	}
	lock, _ := sc.Script("mutex_lock")
	release, _ := sc.Script("mutex_release")
	do := func(args ...string) rueidis.RedisResult {
		return client.Do(ctx, client.B().Arbitrary(args[0]).Args(args[1:]...).Build())
	}
	for _, kv := range [][2]string{{"slowlog-log-slower-than", "0"}, {"slowlog-max-len", "1000000"}} {
		if err := do("CONFIG", "SET", kv[0], kv[1]).Error(); err != nil {
			t.Fatal(err)
		}
	}
	defer do("CONFIG", "SET", "slowlog-log-slower-than", "10000")
	run := strconv.FormatInt(int64(os.Getpid()), 36) + ":"

	// The unfair, uncontended pair, as package mutex sends it.
	l, err := mutex.NewLocker(sc, mutex.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const goroutines = 64
	ms := make([]*mutex.Mutex, goroutines)
	for i := range ms {
		if ms[i], err = l.NewMutex("cost:" + run + strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		if err := ms[i].Lock(ctx); err != nil { // the first, onto no key, is not the steady state
			t.Fatal(err)
		}
		if err := ms[i].Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	do("SLOWLOG", "RESET")
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range pairs {
				if err := m.Lock(ctx); err != nil {
					t.Error(err)
					return
				}
				if err := m.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	costs := slowlog(t, do, func(argv []string) string {
		switch argv[1] {
		case lock.SHA1():
			return "unfair lock"
		case release.SHA1():
			return "unfair unlock"
		}
		return ""
	})

	// A fair hand-off, script by script, in 64 goroutines with a lock
	// each: A takes the lock, B queues, A's release hands it to B, B finds
	// its grant (as after a lost message) and releases with nobody queued.
	fairPairs := pairs
	if os.Getenv("SLUICE_COST_UNFAIR_ONLY") != "" {
		fairPairs = 0
	}
	fairRound := func(g, i int) error {
		k := "sluice:mutex:{cost:" + run + "f" + strconv.Itoa(g) + "}"
		lockKeys := []string{k, k + ":x", k + ":q", k + ":e"}
		releaseKeys := []string{k, k + ":w", k + ":q", k + ":e", k + ":x"}
		id := strconv.Itoa(i)
		a, err := execLock(ctx, lock, lockKeys, "A", "30000", "a."+id, "f")
		if err != nil || a[0] != 1 {
			return fmt.Errorf("A's lock = %v, %v", a, err) //nolint:errorlint // err may be nil here: %v prints <nil>, %w would print %!w(<nil>)
		}
		b, err := execLock(ctx, lock, lockKeys, "B", "30000", "b."+id, "f")
		if err != nil || b[0] != 0 {
			return fmt.Errorf("B's lock = %v, %v", b, err) //nolint:errorlint // err may be nil here: %v prints <nil>, %w would print %!w(<nil>)
		}
		if n, err := release.Exec(ctx, releaseKeys, unlockArgs("A", 1, a[2])).AsInt64(); err != nil || n != 0 {
			return fmt.Errorf("A's release = %d, %v", n, err) //nolint:errorlint // err may be nil here: %v prints <nil>, %w would print %!w(<nil>)
		}
		b, err = execLock(ctx, lock, lockKeys, "B", "30000", "b."+id, "f")
		if err != nil || b[0] != 2 {
			return fmt.Errorf("B's lock after the hand-off = %v, %v", b, err) //nolint:errorlint // err may be nil here: %v prints <nil>, %w would print %!w(<nil>)
		}
		if n, err := release.Exec(ctx, releaseKeys, unlockArgs("B", 1, b[2])).AsInt64(); err != nil || n != 0 {
			return fmt.Errorf("B's release = %d, %v", n, err) //nolint:errorlint // err may be nil here: %v prints <nil>, %w would print %!w(<nil>)
		}
		return nil
	}
	if fairPairs > 0 {
		for g := range goroutines { // every key used once before the measurement
			if err := fairRound(g, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	do("SLOWLOG", "RESET")
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= fairPairs; i++ {
				if err := fairRound(g, i); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	seen := map[string]bool{} // B's attempts that have queued
	for k, v := range slowlog(t, do, func(argv []string) string {
		if len(argv) < 11 {
			return ""
		}
		switch {
		case argv[1] == lock.SHA1() && argv[8] == "A":
			return "fair lock, free"
		case argv[1] == lock.SHA1() && argv[8] == "B":
			if !seen[argv[3]+argv[9]] {
				seen[argv[3]+argv[9]] = true
				return "fair lock, queue"
			}
			return "fair lock, finds its grant"
		case argv[1] == release.SHA1() && argv[10] == "A":
			return "fair release, hand-off"
		case argv[1] == release.SHA1() && argv[10] == "B":
			return "fair release, none queued"
		}
		return ""
	}) {
		costs[k] = v
	}
	keys := make([]string, 0, len(costs))
	for k := range costs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		t.Logf("%-32s %s", k, costs[k])
	}
}

// cost is the server time of one kind of call.
type cost struct {
	n                int
	mean, tmean      float64 // tmean: of the fastest 90%, not disturbed by preemption
	p10, median, p90 int64
}

func (c cost) String() string {
	return fmt.Sprintf("n=%6d tmean90=%6.2f µs mean=%6.2f µs  p10=%d median=%d p90=%d", c.n, c.tmean, c.mean, c.p10, c.median, c.p90)
}

// slowlog reads and resets the server's slowlog, grouping the entries'
// durations by kind(argv) ("" drops an entry).
func slowlog(t *testing.T, do func(...string) rueidis.RedisResult, kind func(argv []string) string) map[string]cost {
	t.Helper()
	entries, err := do("SLOWLOG", "GET", "-1").ToArray()
	if err != nil {
		t.Fatal(err)
	}
	do("SLOWLOG", "RESET")
	slices.Reverse(entries) // oldest first
	us := map[string][]int64{}
	for _, e := range entries {
		f, err := e.ToArray()
		if err != nil || len(f) < 4 {
			t.Fatalf("slowlog entry %v: %v", f, err)
		}
		d, _ := f[2].AsInt64()
		argv, _ := f[3].AsStrSlice()
		if len(argv) < 2 || !strings.EqualFold(argv[0], "EVALSHA") {
			continue
		}
		if k := kind(argv); k != "" {
			us[k] = append(us[k], d)
		}
	}
	out := map[string]cost{}
	for k, ds := range us {
		slices.Sort(ds)
		n, n90 := len(ds), max(1, len(ds)*9/10)
		var sum, sum90 int64
		for i, d := range ds {
			sum += d
			if i < n90 {
				sum90 += d
			}
		}
		out[k] = cost{n: n, mean: float64(sum) / float64(n), tmean: float64(sum90) / float64(n90),
			p10: ds[n/10], median: ds[n/2], p90: ds[n*9/10]}
	}
	return out
}
