package faulttest

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/mutex"
)

// pubSubResetWaiters resets the connections of a process whose 50
// waiters wait on one lock, and releases the lock while that process is
// not subscribed, so the release message is surely lost.
//
// Pass criterion: every waiter acquires, none hangs, and all 50 have had
// the lock within one lease of the release (a waiter that depended on the
// lost message, or on a hand-off that did not come, would wait for a lease
// per turn). Calls that were in flight on the reset connection may fail
// with a connection error; the waiter then calls Lock again (counted).
func pubSubResetWaiters(t *testing.T, newCache NewCache) {
	const lease = 2 * time.Second
	waiters := pick(50, 200)
	r := newRig(t, newCache)
	locks := newLocker(t, r.proxied(t, ClientOptions{}), mutex.Options{WatchdogLease: lease})
	holderLocks := newLocker(t, r.directCache(t), mutex.Options{WatchdogLease: lease})
	ctx := context.Background()
	name := uniqueName(t)
	channel := lockKey(name) + ":w"

	holder := newMutex(t, holderLocks, name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	evalsBefore := evalCalls(t, r)

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		acquired []time.Time
		connErrs int
		failures []error
	)
	wctx, cancel := context.WithTimeout(ctx, signalWait+time.Duration(waiters)*lease/10)
	defer cancel()
	for range waiters {
		m := newMutex(t, locks, name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				err := m.Lock(wctx)
				if err == nil {
					break
				}
				if errors.Is(err, mutex.ErrNotObtained) || wctx.Err() != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
					return
				}
				mu.Lock()
				connErrs++
				mu.Unlock()
			}
			mu.Lock()
			acquired = append(acquired, time.Now())
			mu.Unlock()
			if err := m.Unlock(ctx); err != nil {
				mu.Lock()
				failures = append(failures, err)
				mu.Unlock()
			}
		}()
	}
	// Every waiter has made its first attempt (the lock script ran once per
	// waiter) and the process is subscribed.
	waitFor(t, "every waiter's first attempt", func() bool { return evalCalls(t, r)-evalsBefore >= int64(waiters) })
	waitFor(t, "the subscription", func() bool { return numsub(t, r, channel) == 1 })

	// Cut every connection of the waiters' process and keep new ones from
	// getting through until the release has been published to nobody.
	r.proxy.Blackhole(true)
	r.proxy.ResetAll()
	waitFor(t, "the server to drop the subscription", func() bool { return numsub(t, r, channel) == 0 })
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	r.proxy.Blackhole(false)

	wg.Wait()
	for _, err := range failures {
		t.Errorf("waiter: %v", err)
	}
	if len(acquired) != waiters {
		t.Fatalf("%d of %d waiters acquired", len(acquired), waiters)
	}
	sort.Slice(acquired, func(i, j int) bool { return acquired[i].Before(acquired[j]) })
	first, last := acquired[0].Sub(released), acquired[len(acquired)-1].Sub(released)
	maxGap := first
	for i := 1; i < len(acquired); i++ {
		maxGap = max(maxGap, acquired[i].Sub(acquired[i-1]))
	}
	if last > lease {
		t.Errorf("the last of %d waiters acquired %v after the release; want within the lease %v", waiters, last, lease)
	}
	t.Logf("%d waiters, release published to nobody: first acquired after %v, all after %v (lease %v), longest hand-off %v, %d calls failed on the reset connection and were repeated",
		waiters, first.Round(time.Millisecond), last.Round(time.Millisecond), lease, maxGap.Round(time.Millisecond), connErrs)
}

// evalCalls is how many EVALSHA and EVAL calls the server has run.
func evalCalls(t *testing.T, r *rig) int64 {
	t.Helper()
	info, err := do(t, r.direct, "INFO", "commandstats").ToString()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
		n += statInt(info, cmd)
	}
	return n
}

// statInt reads the integer after prefix in an INFO reply, 0 if absent.
func statInt(info, prefix string) int64 {
	i := strings.Index(info, prefix)
	if i < 0 {
		return 0
	}
	var n int64
	for _, c := range info[i+len(prefix):] {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

// numsub is how many subscribers the server counts on channel.
func numsub(t *testing.T, r *rig, channel string) int64 {
	t.Helper()
	vs, err := do(t, r.direct, "PUBSUB", "NUMSUB", channel).ToArray()
	if err != nil || len(vs) != 2 {
		t.Fatalf("PUBSUB NUMSUB: %v", err)
	}
	n, _ := vs[1].AsInt64()
	return n
}
