package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// TestWatchdogBatchWrongTypeOnlyThosePermits overwrites, among 60 permits
// of 6 semaphores renewed in shared batches, one semaphore's permits hash
// and another one's expiry set with strings (an operator's SET, another
// program sharing the prefix): the permits of those two semaphores are
// reported lost, saying why, and only those; the others stay held and
// release. The lease leaves the renewals 510 ms of lateness, as in
// TestWatchdogBatchGoneOnlyThatPermit.
func TestWatchdogBatchWrongTypeOnlyThosePermits(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		ctx := context.Background()
		const watchdog, sems, perSem = 900 * time.Millisecond, 6, 10
		e := newEnv(t, addrs, semaphore.Options{WatchdogLease: watchdog})
		ss := make([]*semaphore.Semaphore, sems)
		for i, name := range batchNames("wrongtype:"+uniqueName(t)+":", sems, len(addrs) > 1) {
			ss[i] = e.sem(t, name, perSem)
		}
		ps := acquireEach(t, ss, perSem)
		defer releaseEach(ps)
		for i, suffix := range []string{"", ":e"} { // semaphore 0's permits hash, 1's expiry set
			key := keyspace.Key(semaphore.DefaultPrefix, ss[i].Name(), suffix)
			if err := e.client.Do(ctx, e.client.B().Set().Key(key).Value("not a semaphore").Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		var victims []int
		for i := range 2 * perSem {
			victims = append(victims, i)
			waitLost(t, ps[i])
		}
		// The others were in the same batches; they must have been renewed
		// by them, and go on being renewed.
		time.Sleep(2 * watchdog) // nothing to wait for: asserting that nothing happens
		if lost := lostPermits(ps); !slices.Equal(lost, victims) {
			t.Fatalf("%d lost %v, want only %v; first: %v", len(lost), lost, victims, ps[lost[0]].Err())
		}
		for _, i := range victims {
			if err := ps[i].Err(); !errors.Is(err, semaphore.ErrLost) || !errors.Is(err, lease.ErrWrongType) || !strings.Contains(err.Error(), "another type") {
				t.Errorf("permit %d: Err() = %v, want ErrLost for a key of another type", i, err)
			}
		}
		for i, p := range ps {
			err := p.Release(ctx)
			switch {
			case i < 2*perSem:
				// Release still asks the server, which refuses the
				// overwritten permits hash (semaphore 0) with WRONGTYPE;
				// semaphore 1's hash, no longer renewed, has expired.
				if !errors.Is(err, semaphore.ErrNotHeld) && (err == nil || !strings.Contains(err.Error(), "WRONGTYPE")) {
					t.Errorf("Release of lost permit %d = %v, want ErrNotHeld or the server's WRONGTYPE", i, err)
				}
			case err != nil:
				t.Errorf("Release of held permit %d: %v", i, err)
			}
		}
	})
}

// TestQueueRefreshWrongTypeOnlyThatWaiter runs one batched refresh of the
// queue entries of six fair waiters, each queued behind the holder of its
// own semaphore of capacity 1 in one slot, after overwriting with a string
// the queue of one semaphore, the entries hash, permits hash and expiry
// set of three others. Those four waiters are answered "look for
// yourself" (their own Acquire then gets the error), and the call still
// refreshes the other two: their entries are rewritten and answered
// refreshed.
func TestQueueRefreshWrongTypeOnlyThatWaiter(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		ctx := context.Background()
		client := redistest.Client(t, addrs...)
		sc, err := scriptcache.New(ctx, client)
		if err != nil {
			t.Fatal(err)
		}
		queue, _ := sc.Script("semaphore_queue")
		refresh, _ := sc.Script("semaphore_queue_refresh")
		do := func(cmd rueidis.Completed) {
			t.Helper()
			if err := client.Do(ctx, cmd).Error(); err != nil {
				t.Fatal(err)
			}
		}
		key := func(name, suffix string) string { return keyspace.Key(semaphore.DefaultPrefix, name, suffix) }
		// Six names of one slot, as one call of the keeper takes them.
		prefix := uniqueName(t)
		names := []string{prefix + ":0"}
		slot := keyspace.Slot(key(names[0], ""))
		for i := 1; len(names) < 6; i++ {
			if name := fmt.Sprintf("%s:%d", prefix, i); keyspace.Slot(key(name, "")) == slot {
				names = append(names, name)
			}
		}
		var keys []string
		args := []string{"30000"}
		for j, name := range names {
			k := []string{key(name, ""), key(name, ":e"), key(name, ":w"), key(name, ":q"), key(name, ":qe")}
			if got, err := queue.Exec(ctx, k, []string{"a", "1", "1", "holder", "30000", ""}).AsIntSlice(); err != nil || got[0] != 1 {
				t.Fatalf("%s: holder's Acquire = %v, %v", name, got, err)
			}
			if got, err := queue.Exec(ctx, k, []string{"a", "1", "1", "waiter", "30000", ""}).AsIntSlice(); err != nil || got[0] != 0 {
				t.Fatalf("%s: waiter's Acquire = %v, %v; want queued", name, got, err)
			}
			// An entry the refresh must rewrite.
			do(client.B().Hset().Key(k[4]).FieldValue().FieldValue("waiter", "1 1").Build())
			keys = append(keys, k[0], k[1], k[3], k[4])
			args = append(args, strconv.Itoa(j+1), "waiter", "1")
		}
		for i, suffix := range []string{":q", ":qe", "", ":e"} { // of semaphores 1 to 4
			do(client.B().Set().Key(key(names[1+i], suffix)).Value("not a semaphore").Build())
		}
		got, err := refresh.Exec(ctx, keys, args).AsIntSlice()
		if err != nil {
			t.Fatalf("refresh: %v, want an answer for each waiter", err)
		}
		if want := []int64{1, 0, 0, 0, 0, 1}; !slices.Equal(got, want) {
			t.Fatalf("refresh answered %v, want %v", got, want)
		}
		for _, i := range []int{0, 5} {
			entry, err := client.Do(ctx, client.B().Hget().Key(key(names[i], ":qe")).Field("waiter").Build()).ToString()
			if err != nil || entry == "1 1" || !strings.HasSuffix(entry, " 1") {
				t.Errorf("%s: entry %q, %v after the refresh; want it rewritten", names[i], entry, err)
			}
		}
	})
}
