package faulttest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/mutex"
)

// blackholeLossBeforeExpiry partitions a lock holder from Redis for
// longer than its lease, over several trials.
//
// Pass criteria, in every trial: the key does disappear (checked on a
// direct connection that bypasses the proxy), Err says the lease expired,
// and the loss signal (Lost closing) comes before the moment the key can
// disappear on the server, by about the margin the keeper keeps
// (lease.Margin):
//   - not more than the margin plus a fifth of the lease before it (the
//     fifth is for the one-way time of the renewal that set the expiry,
//     which the server counts from and the client does not know): an
//     earlier signal would be a loss declared while the lease still held.
//     This is not checked when the blackhole held back a reply (on a
//     loaded machine the cut can fall inside a renewal's round trip): that
//     renewal extended the lease on the server, and the client, never told,
//     rightly gives up a renewal interval earlier. At least one trial must
//     be checked in full;
//   - at least half the margin before it, unless the process demonstrably
//     was not scheduled in time: the promise rests on the process running
//     within the margin (see package lease), so a signal that comes later,
//     even after the expiry, is accepted only if a probe goroutine
//     sleeping in 1 ms steps saw a stall of at least half the margin
//     between the keeper's deadline and the signal, and never if it is
//     more than a second late.
//
// The moment of expiry is taken from the server itself: PEXPIRETIME is the
// absolute Unix time, in milliseconds, after which the key is gone, on the
// same machine clock as the client's. The last value read before the key
// vanished is the deadline.
func blackholeLossBeforeExpiry(t *testing.T, newCache NewCache) {
	const watchdog = time.Second
	margin := lease.Margin(watchdog)
	trials := pick(5, 50)
	r := newRig(t, newCache)
	locks := newLocker(t, r.proxied(t, ClientOptions{}), mutex.Options{WatchdogLease: watchdog})
	ctx := context.Background()
	probe := startProbe(t)

	var early []time.Duration
	excused, cutReplies := 0, 0
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
		held := r.proxy.HeldReplies()
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
		cutReply := r.proxy.HeldReplies() > held
		r.proxy.Blackhole(false)
		if !ok {
			t.Fatalf("trial %d: no loss signal within %v of the blackhole", trial, watchdog+signalWait)
		}
		if expireAt == 0 {
			t.Fatalf("trial %d: never saw the key's expiry time", trial)
		}
		if err := m.Err(); !errors.Is(err, mutex.ErrLost) || !errors.Is(err, lease.ErrExpired) {
			t.Errorf("trial %d: Err() = %v, want ErrLost wrapping lease.ErrExpired", trial, err)
		}
		expiry := time.UnixMilli(expireAt)
		e := expiry.Sub(tLost)
		early = append(early, e)
		switch {
		case e > margin+watchdog/5 && cutReply:
			cutReplies++
			t.Logf("trial %d: loss signalled %v before the server-side expiry; a reply was cut in flight, so the server had one renewal more than the client knew of", trial, e)
		case e > margin+watchdog/5:
			t.Errorf("trial %d: loss signalled %v before the server-side expiry; want about the margin %v (at most %v): given up while the lease held",
				trial, e, margin, margin+watchdog/5)
		case e >= margin/2:
		case -e > time.Second:
			t.Errorf("trial %d: loss signalled %v AFTER the key could expire on the server", trial, -e)
		default:
			stall := probe.maxStall(expiry.Add(-margin), tLost)
			if stall < margin/2 {
				t.Errorf("trial %d: loss signalled %v before the server-side expiry (negative: after), want about the margin %v, and the process was not stalled (longest stall %v)",
					trial, e, margin, stall)
			} else {
				excused++
				t.Logf("trial %d: loss signalled %v before the server-side expiry (negative: after), margin %v; the process stalled %v around the deadline", trial, e, margin, stall)
			}
		}
	}
	if cutReplies == trials {
		t.Errorf("every trial cut a renewal's reply in flight: the early bound was never checked")
	}
	t.Logf("%d trials, watchdog lease %v, margin %v: loss came before the server-side expiry by %s; %d late on a stalled process, %d early after a reply cut in flight",
		trials, watchdog, margin, durations(early), excused, cutReplies)
}

// probe measures how promptly the process is scheduled: a goroutine sleeps
// in 1 ms steps and records every wake-up that came late.
type probe struct {
	mu     sync.Mutex
	stalls []stall // guarded by mu
}

// stall is a sleep that ended late: the goroutine was due at from and ran
// at to.
type stall struct{ from, to time.Time }

// startProbe runs a probe until t ends.
func startProbe(t *testing.T) *probe {
	p := &probe{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			due := time.Now().Add(time.Millisecond)
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			if now := time.Now(); now.Sub(due) > time.Millisecond {
				p.mu.Lock()
				p.stalls = append(p.stalls, stall{due, now})
				p.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return p
}

// maxStall is the longest stall overlapping [from, to].
func (p *probe) maxStall(from, to time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var longest time.Duration
	for _, s := range p.stalls {
		if s.to.After(from) && s.from.Before(to) {
			longest = max(longest, s.to.Sub(s.from))
		}
	}
	return longest
}
