package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/mutex"
)

// scriptCalls returns how many EVALSHA and EVAL calls the servers of client
// have run, summed over its nodes.
func scriptCalls(t testing.TB, client rueidis.Client) int64 {
	t.Helper()
	var n int64
	for _, node := range client.Nodes() {
		info, err := node.Do(context.Background(), node.B().Info().Section("commandstats").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
			if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
				continue
			}
			calls, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			n += calls
		}
	}
	return n
}

// heldNames returns n lock names. On a cluster they share 16 slots, so
// that each slot's locks form a batch as they would with many locks per
// slot (2,000 names spread over 16384 slots would be one per slot).
func heldNames(prefix string, n int, cluster bool) []string {
	names := make([]string, 0, n)
	for i := 0; len(names) < n; i++ {
		name := prefix + strconv.Itoa(i)
		if !cluster || keyspace.Slot(lockKey(name))%1024 == 0 {
			names = append(names, name)
		}
	}
	return names
}

// lockAll takes a Mutex for each name.
func lockAll(t testing.TB, l *mutex.Locker, names []string) []*mutex.Mutex {
	t.Helper()
	ms := make([]*mutex.Mutex, len(names))
	for i, name := range names {
		ms[i] = newMutex(t, l, name)
	}
	lockAllOf(t, ms)
	return ms
}

// lockAllOf locks every Mutex of ms, from a few goroutines.
func lockAllOf(t testing.TB, ms []*mutex.Mutex) {
	t.Helper()
	if err := eachOf(ms, func(m *mutex.Mutex) error { return m.Lock(context.Background()) }); err != nil {
		t.Fatal(err)
	}
}

// unlockAll unlocks every Mutex of ms, from a few goroutines, ignoring
// errors (a lost lock's Unlock reports its loss).
func unlockAll(ms []*mutex.Mutex) {
	eachOf(ms, func(m *mutex.Mutex) error { m.Unlock(context.Background()); return nil })
}

// eachOf calls f for every Mutex of ms from 32 goroutines; each stops at
// its first error.
func eachOf(ms []*mutex.Mutex, f func(*mutex.Mutex) error) error {
	const workers = 32
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(ms); i += workers {
				if err := f(ms[i]); err != nil {
					errs[w] = fmt.Errorf("%s: %w", ms[i].Name(), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// lostOf returns the indexes of the Mutexes whose hold was declared lost.
func lostOf(ms []*mutex.Mutex) []int {
	var lost []int
	for i, m := range ms {
		select {
		case <-m.Lost():
			lost = append(lost, i)
		default:
		}
	}
	return lost
}

// TestWatchdogManyLocksBatched holds 2,000 locks on a 2 s watchdog lease
// for three leases: none may be lost, and the renewals go out many per
// script call (one call each would be 2,000 per 667 ms). The lease lets a
// round of renewals start 2*2000/3 - Margin = 1,133 ms late before its
// locks are (rightly) lost: batched locks are renewed together, so one late
// round would lose them all. A loaded machine with -race runs timers up to
// about 240 ms late, and a round of four 512-lock calls takes longer
// still: at 900 ms (510 ms of slack) a machine loaded far beyond two CPU
// hogs lost a batch now and then.
func TestWatchdogManyLocksBatched(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			client := clientFor(t, tg)
			const watchdog, leases = 2 * time.Second, 3
			l := newLocker(t, client, mutex.Options{WatchdogLease: watchdog})
			cluster := tg.name == "cluster"
			start := time.Now()
			ms := lockAll(t, l, heldNames("held:"+t.Name()+":", 2000, cluster))
			t.Logf("2000 locks taken in %v", time.Since(start))
			defer unlockAll(ms)
			before := scriptCalls(t, client)
			time.Sleep(leases * watchdog) // nothing to wait for: asserting that nothing happens
			calls := scriptCalls(t, client) - before
			if lost := lostOf(ms); len(lost) > 0 {
				t.Fatalf("%d of %d held locks lost, first %s: %v", len(lost), len(ms), ms[lost[0]].Name(), ms[lost[0]].Err())
			}
			// Each lock is renewed about every watchdog/3.
			renewals := int64(len(ms)) * leases * 3
			t.Logf("%d script calls for about %d renewals", calls, renewals)
			if calls*20 > renewals {
				t.Errorf("%d script calls in %d leases, want at most %d (a twentieth of the renewals)", calls, leases, renewals/20)
			}
		})
	}
}

// TestWatchdogBatchGoneOnlyThatLock deletes one lock of a batch: the
// watchdog reports that lock lost, with the reason, and only that one. The
// lease leaves the renewals 2*900/3 - Margin = 510 ms of lateness: 50
// locks make one call, quicker than the 2,000 above.
func TestWatchdogBatchGoneOnlyThatLock(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			ctx := context.Background()
			client := clientFor(t, tg)
			const watchdog = 900 * time.Millisecond
			l := newLocker(t, client, mutex.Options{WatchdogLease: watchdog})
			ms := lockAll(t, l, heldNames("gone:"+t.Name()+":", 50, tg.name == "cluster"))
			defer unlockAll(ms)
			victim := ms[25]
			if err := client.Do(ctx, client.B().Del().Key(lockKey(victim.Name())).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-victim.Lost():
			case <-time.After(signal):
				t.Fatal("the deleted lock was not reported lost")
			}
			if err := victim.Err(); !errors.Is(err, mutex.ErrLost) || !errors.Is(err, lease.ErrGone) {
				t.Fatalf("Err() = %v, want ErrLost found gone by a renewal", err)
			}
			// The others were in the same batches; they must have been
			// renewed by them, and go on being renewed.
			time.Sleep(2 * watchdog) // nothing to wait for: asserting that nothing happens
			if lost := lostOf(ms); len(lost) != 1 || lost[0] != 25 {
				t.Fatalf("lost %v, want only [25]", lost)
			}
		})
	}
}
