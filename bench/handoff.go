package main

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// holdTime is how long a contended workload keeps the lock or permit. It is
// long enough for the other program to be parked in its wait when the
// release comes, so the release has a waiter to wake.
const holdTime = time.Millisecond

// errStalled marks a wait that outlasted the round by the grace period.
var errStalled = errors.New("waiter still waiting seconds after the release (lost wake-up?)")

// gate is anything held exclusively between take and give: a mutex, or a
// semaphore of capacity one.
type gate struct {
	take func(ctx context.Context) error
	give func(ctx context.Context) error
}

// handoff measures how long a release takes to reach a waiter. Every
// goroutine (each with its own instance, as separate programs) loops: take,
// wait until another goroutine is in its take, hold for holdTime, note the
// time, give, then step aside until another goroutine has taken the gate, so
// that the releaser cannot simply take it back. The recorded latency is from
// the note to the next holder's take returning; it includes the release's
// round trip.
//
// The holder counts its holdTime from when another goroutine is known to be
// in its take, not from its own take: a goroutine stepping aside notices
// the other's take only after its next sleep, and a sleep of 50 µs can
// overshoot the whole hold on an idle machine. Its take would then find the
// gate free and return at once, which measures no wake-up at all (a polling
// peer seemed to hand over in 150 µs instead of its 10 ms poll).
type handoff struct {
	released atomic.Int64 // UnixNano just before the last give, 0 before the first
	takes    atomic.Int64 // how many takes so far
	waiting  atomic.Int64 // goroutines inside take
}

func (h *handoff) loop(g gate) loop {
	return func(ctx context.Context, deadline time.Time, r *recorder) {
		for i := 0; i < maxOpsPerGoroutine && time.Now().Before(deadline); i++ {
			h.waiting.Add(1)
			err := g.take(ctx)
			h.waiting.Add(-1)
			if err != nil {
				if ctx.Err() != nil {
					// The other goroutine gave the gate and stepped
					// aside before the deadline, yet this wait lasted
					// through the grace period: a wake-up was lost.
					r.done(0, errStalled)
					return
				}
				r.done(0, err)
				continue
			}
			now := time.Now()
			if rel := h.released.Load(); rel != 0 {
				r.done(now.Sub(time.Unix(0, rel)), nil)
			}
			mine := h.takes.Add(1)
			for h.waiting.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Microsecond)
			}
			time.Sleep(holdTime)
			h.released.Store(time.Now().UnixNano())
			if err := g.give(ctx); err != nil {
				r.done(0, err)
				return
			}
			// Step aside until someone else holds it.
			for h.takes.Load() == mine && time.Now().Before(deadline) {
				time.Sleep(50 * time.Microsecond)
			}
		}
	}
}

// barging measures fairness: each goroutine takes, holds for holdTime, gives
// and immediately competes again. The recorded latency is each take's wait;
// marks count takes by the goroutine that also made the previous take, so
// marks/ops is the share of self re-acquisitions (1/n would be fair among n).
type barging struct {
	last atomic.Int64 // 1 + index of the goroutine that took last, 0 before the first
}

func (b *barging) loop(id int, g gate) loop {
	return func(ctx context.Context, deadline time.Time, r *recorder) {
		for i := 0; i < maxOpsPerGoroutine && time.Now().Before(deadline); i++ {
			t0 := time.Now()
			if err := g.take(ctx); err != nil {
				if ctx.Err() != nil {
					// Starved past the grace period: the wait so far is
					// a lower bound, and still the most telling sample.
					r.done(time.Since(t0), nil)
					return
				}
				r.done(0, err)
				continue
			}
			r.done(time.Since(t0), nil)
			if b.last.Swap(int64(id)+1) == int64(id)+1 {
				r.marks++
			}
			time.Sleep(holdTime)
			if err := g.give(ctx); err != nil {
				r.done(0, err)
				return
			}
		}
	}
}
