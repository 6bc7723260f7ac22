package faulttest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/mutex"
)

// TestBlackholeLossBeforeExpiry partitions a lock holder from Redis for
// longer than its lease, over several trials.
//
// Pass criterion, in every trial: the holder's loss signal (Lost closing)
// comes no later than the moment the key can disappear on the server, and
// the key does disappear (checked on a direct connection that bypasses the
// proxy), and Err says the lease expired.
//
// The moment of expiry is taken from the server itself: PEXPIRETIME is the
// absolute Unix time, in milliseconds, after which the key is gone, on the
// same machine clock as the client's. The last value read before the key
// vanished is the deadline; the loss must come before it.
func TestBlackholeLossBeforeExpiry(t *testing.T) {
	const watchdog = 500 * time.Millisecond
	trials := pick(5, 50)
	r := newRig(t)
	locks := newLocker(t, r.proxied, mutex.Options{WatchdogLease: watchdog})
	ctx := context.Background()

	var margins []time.Duration
	for trial := range trials {
		m := newMutex(t, locks, uniqueName(t))
		if err := m.Lock(ctx); err != nil {
			t.Fatalf("trial %d: Lock: %v", trial, err)
		}
		key := lockKey(m.Name())
		lost := m.Lost()
		// Hold across at least one renewal, so the expiry under test is a
		// renewed one, then cut the link at a varying point of the cycle.
		time.Sleep(watchdog/2 + time.Duration(trial%5)*watchdog/15)
		r.proxy.Blackhole(true)

		lostAt := make(chan time.Time, 1)
		go func() {
			select {
			case <-lost:
				lostAt <- time.Now()
			case <-time.After(watchdog + signalWait):
				close(lostAt)
			}
		}()
		// Follow the key's absolute expiry until the key is gone.
		var expireAt int64 // Unix ms
		waitFor(t, "the key to expire", func() bool {
			ms, err := do(t, r.direct, "PEXPIRETIME", key).AsInt64()
			if err != nil {
				t.Fatalf("PEXPIRETIME: %v", err)
			}
			if ms == -2 {
				return true
			}
			expireAt = ms
			return false
		})
		tLost, ok := <-lostAt
		r.proxy.Blackhole(false)
		if !ok {
			t.Fatalf("trial %d: no loss signal within %v of the blackhole", trial, watchdog+signalWait)
		}
		if expireAt == 0 {
			t.Fatalf("trial %d: never saw the key's expiry time", trial)
		}
		margin := time.UnixMilli(expireAt).Sub(tLost)
		margins = append(margins, margin)
		if margin < 0 {
			t.Errorf("trial %d: loss signalled %v AFTER the key could expire on the server", trial, -margin)
		}
		if err := m.Err(); !errors.Is(err, mutex.ErrLost) || !errors.Is(err, lease.ErrExpired) {
			t.Errorf("trial %d: Err() = %v, want ErrLost wrapping lease.ErrExpired", trial, err)
		}
	}
	t.Logf("%d trials, watchdog lease %v: loss came before the server-side expiry by %s", trials, watchdog, durations(margins))
}
