package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/semaphore"
)

// privateSems keeps an exact model of a semaphore that node n alone uses
// (lsx<i> plain, lsf<i> fair, in turn), so that every answer is judged
// both ways, where the shared lanes can only bound them. A round takes a
// capacity of 2 to 5 (nothing is held between rounds, so the new one
// applies) and makes 4 to 10 steps: a TryAcquire of 1 to the capacity
// (granted exactly when it fits, refused exactly when it does not), or a
// Release of a held permit; after each, Info (Capacity, Used, Holders,
// Available, nothing expired or queued) and Available must be the model's,
// and while something is held a TryAcquire through a Semaphore of another
// capacity must fail with ErrCapacityMismatch (package doc, "Capacity").
// A call that fails otherwise ends the round (its outcome is unknown); a
// fault of n's network or the server, a wipe, or stalls of this process
// of a quarter lease since the round began excuse what was seen
// (suspect): permits may have been lost.
func (w *world) privateSems(ctx context.Context, n *node, rng *rand.Rand) {
	for seq := 1; ctx.Err() == nil && !n.closed.Load(); seq++ {
		sleep(ctx, time.Duration(rng.Float64()*float64(w.cfg.Lease)/10))
		mgr, name := n.sems, fmt.Sprintf("lsx%d", n.i)
		if seq%2 == 0 {
			mgr, name = n.fairSems, fmt.Sprintf("lsf%d", n.i)
		}
		w.privateSemRound(ctx, n, rng, mgr, name)
	}
}

func (w *world) privateSemRound(ctx context.Context, n *node, rng *rand.Rand, mgr *semaphore.Manager, name string) {
	capacity := int64(2 + rng.IntN(4))
	s, err := mgr.NewSemaphore(name, capacity)
	if err != nil {
		w.hist.violation("NewSemaphore: %v", err)
		return
	}
	other, err := mgr.NewSemaphore(name, capacity+1)
	if err != nil {
		w.hist.violation("NewSemaphore: %v", err)
		return
	}
	var held []*semaphore.Permit
	defer func() {
		for _, p := range held {
			w.releaseSure(ctx, p.Release)
		}
	}()
	begin := time.Now()
	cctx := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, w.cfg.Lease/2) }
	wrong := func(format string, args ...any) {
		w.hist.mu.Lock()
		_, stalled := w.hist.stallsLocked(begin, time.Now())
		w.hist.mu.Unlock()
		// A stall of a good part of a lease may have let a permit's
		// lease run out before the watchdog renewed it.
		if stalled < w.cfg.Lease/4 && !w.wipedSince(begin, time.Now()) {
			w.suspect(begin, time.Now(), []int{n.i}, "", "private semaphore %q (capacity %d): "+format, append([]any{name, capacity}, args...)...)
		}
	}
	var used int64
	// A round starts on an empty semaphore: one left held by a round
	// that ended on an error is waited out, not judged.
	c, cancel := cctx()
	info, err := s.Info(c)
	cancel()
	if err != nil || info.Used != 0 || info.Holders != 0 || info.Expired != 0 || info.Queued != 0 {
		return
	}
	w.count("lane.privsem")
	for range 4 + rng.IntN(7) {
		if ctx.Err() != nil || n.closed.Load() {
			return
		}
		if len(held) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(held))
			p := held[i]
			c, cancel := cctx()
			err := p.Release(c)
			cancel()
			if err != nil {
				w.expected("a private semaphore's Release", time.Now(), err, semErrs...)
				return
			}
			held = append(held[:i], held[i+1:]...)
			used -= p.Weight()
		} else {
			wt := 1 + rng.Int64N(capacity)
			c, cancel := cctx()
			call := time.Now()
			p, err := s.TryAcquire(c, wt)
			cancel()
			switch {
			case err == nil:
				held = append(held, p)
				if used+wt > capacity {
					wrong("TryAcquire of %d granted with %d of %d held", wt, used, capacity)
					return
				}
				used += wt
			case refused(err) && ctx.Err() == nil:
				if used+wt <= capacity {
					wrong("TryAcquire of %d refused with %d of %d held: %v", wt, used, capacity, err)
					return
				}
			default:
				w.expected("a private semaphore's TryAcquire", call, err, semErrs...)
				return
			}
		}
		c, cancel := cctx()
		info, err := s.Info(c)
		cancel()
		if err != nil {
			w.expected("a private semaphore's Info", time.Now(), err, semErrs...)
			return
		}
		want := semaphore.Info{Capacity: capacity, Used: used, Available: capacity - used, Holders: int64(len(held))}
		if used == 0 {
			want.Capacity = info.Capacity // none held: whichever the next Acquire brings
		}
		if info != want {
			wrong("Info %+v, want %+v", info, want)
			return
		}
		c, cancel = cctx()
		avail, err := s.Available(c)
		cancel()
		if err != nil {
			w.expected("a private semaphore's Available", time.Now(), err, semErrs...)
			return
		}
		if avail != capacity-used {
			wrong("Available %d with %d held", avail, used)
			return
		}
		if used > 0 && rng.IntN(2) == 0 {
			c, cancel := cctx()
			p, err := other.TryAcquire(c, 1)
			cancel()
			if err == nil {
				held = append(held, p)
			}
			if !errors.Is(err, semaphore.ErrCapacityMismatch) {
				if err == nil || refused(err) {
					wrong("a TryAcquire through a Semaphore of capacity %d, with %d held: %v, want ErrCapacityMismatch", capacity+1, used, err)
				} else {
					w.expected("a private semaphore's TryAcquire of another capacity", time.Now(), err, semErrs...)
				}
				return
			}
		}
	}
}

// refused reports whether err is a semaphore's refusal (ErrNotObtained
// from Redis's answer), not a context that ended first.
func refused(err error) bool {
	return errors.Is(err, semaphore.ErrNotObtained) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

// releaseSure calls unlock again while it fails with the outcome unknown
// (as unlockSure does for a Mutex): a hold whose release failed is still
// counted, and a lane that dropped it would find its lock held.
func (w *world) releaseSure(ctx context.Context, unlock func(context.Context) error) {
	for range 20 {
		rctx, rcancel := w.releaseCtx()
		err := unlock(rctx)
		rcancel()
		if err == nil || errors.Is(err, mutex.ErrNotHeld) || ctx.Err() != nil {
			return
		}
		sleep(ctx, w.cfg.Lease/20)
	}
}
