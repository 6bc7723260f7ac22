package mutex

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicekit/sluice/internal/lease"
)

// Context returns a context derived from parent that is cancelled when the
// holds of this RWMutex end: one of them is lost (context.Cause wraps
// ErrLost and the reason) or the last of them, write or read, is released
// (the cause wraps ErrNotHeld). If nothing is held, the context is already
// cancelled. It costs no goroutine; the cancel function only releases the
// context early.
func (rw *RWMutex) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.w.holds == 0 && rw.r.holds == 0 {
		cause := rw.err
		if cause == nil {
			cause = fmt.Errorf("%w: %q", ErrNotHeld, rw.name)
		}
		cancel(cause)
	} else {
		rw.scoped.Add(ctx, cancel)
	}
	return ctx, func() { cancel(context.Canceled) }
}

// endScopedLocked cancels the contexts made by Context. Called with rw.mu
// held.
func (rw *RWMutex) endScopedLocked(cause error) {
	rw.scoped.End(cause)
}

// Do takes the write lock, runs fn with a context that ends if a hold is
// lost, and unlocks, with the errors of Mutex.Do.
func (rw *RWMutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return rw.do(ctx, true, fn)
}

// RDo takes a read hold, runs fn with a context that ends if a hold is
// lost, and releases it, with the errors of Mutex.Do.
func (rw *RWMutex) RDo(ctx context.Context, fn func(ctx context.Context) error) error {
	return rw.do(ctx, false, fn)
}

func (rw *RWMutex) do(ctx context.Context, write bool, fn func(ctx context.Context) error) error {
	rw.mu.Lock()
	outer := rw.side(write).holds == 0
	rw.mu.Unlock()
	if err := rw.observed(ctx, write, false); err != nil {
		return err
	}
	lost := rw.Lost()
	hctx, cancel := rw.Context(ctx)
	err := fn(hctx)
	cancel()
	during := lossBy(lost, rw.Err, rw.name)
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), rw.lease)
	defer ucancel()
	uerr := rw.release(uctx, write)
	if uerr != nil && outer && !errors.Is(uerr, ErrNotHeld) {
		// As in Mutex.Do: nobody will release a hold Do took again, so
		// the watchdog must stop renewing it.
		rw.dropHold(write, uerr)
	}
	return doErr(err, during, uerr)
}

// dropHold declares the hold of one kind lost without a word to Redis,
// after a release that failed, as Mutex.dropHold does.
func (rw *RWMutex) dropHold(write bool, cause error) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	sd := rw.side(write)
	if sd.holds == 0 {
		return
	}
	if sd.lse != nil {
		sd.lse.Stop()
	}
	rw.loseLocked(write, cause)
	sd.unacked = false // the caller was never given this hold
}

// Context returns a context derived from parent that is cancelled when
// the set's hold ends: any member lost (context.Cause wraps ErrLost) or
// released (the cause wraps ErrNotHeld). If the set is not held, the
// context is already cancelled. It costs no goroutine.
func (mm *MultiMutex) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx := parent
	cancels := make([]context.CancelFunc, len(mm.ms))
	for i, m := range mm.ms {
		ctx, cancels[i] = m.Context(ctx)
	}
	return ctx, func() {
		for i := len(cancels) - 1; i >= 0; i-- {
			cancels[i]()
		}
	}
}

// Do locks the set, runs fn with a context that ends if any member is
// lost, and unlocks, with the errors of Mutex.Do.
func (mm *MultiMutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	outer := mm.Holds() == 0
	if err := mm.Lock(ctx); err != nil {
		return err
	}
	hctx, cancel := mm.Context(ctx)
	err := fn(hctx)
	cancel()
	during := mm.Err() // the set's hold's loss, if any by now
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), mm.ms[0].set.lease)
	defer ucancel()
	uerrs := mm.unlock(uctx)
	if outer {
		// As in Mutex.Do: a member whose give-back failed keeps a hold
		// nobody will release again; drop it so the watchdog stops
		// renewing it.
		for _, uerr := range uerrs {
			if uerr != nil && !errors.Is(uerr, ErrNotHeld) {
				mm.dropHolds(uerr)
				break
			}
		}
	}
	return doErr(err, during, uerrs...)
}

// dropHolds drops, as Mutex.dropHold does, every member's hold that a
// failed final Unlock of the set left behind; the set then reports the
// loss (a member's Lost is closed) and holds nothing.
func (mm *MultiMutex) dropHolds(cause error) {
	for _, m := range mm.ms {
		if m.Holds() > 0 {
			m.dropHold(cause)
		}
	}
}

// HeldUntil returns the time until which, by this client's clock, every
// hold of this RWMutex (write and read) is known to last: the earliest end
// of their leases, as for Mutex.HeldUntil. It returns the zero time if
// nothing is held or a hold was lost (Lost is closed).
func (rw *RWMutex) HeldUntil() time.Time {
	rw.mu.Lock()
	var leases [2]*lease.Lease
	if rw.err == nil {
		for i, sd := range [2]*rwSide{&rw.w, &rw.r} {
			if sd.holds > 0 {
				leases[i] = sd.lse
			}
		}
	}
	rw.mu.Unlock()
	var until time.Time
	for _, l := range leases {
		if l == nil {
			continue
		}
		if d := l.Deadline(); until.IsZero() || d.Before(until) {
			until = d
		}
	}
	return until
}

// Valid reports whether, by this client's clock, this RWMutex's holds last
// now: time.Now() is before HeldUntil.
func (rw *RWMutex) Valid() bool {
	return time.Now().Before(rw.HeldUntil())
}

// HeldUntil returns the time until which, by this client's clock, the
// set's hold is known to last: the earliest of its members' HeldUntil. It
// returns the zero time if the set holds nothing or a member was lost.
func (mm *MultiMutex) HeldUntil() time.Time {
	if mm.Holds() == 0 {
		return time.Time{}
	}
	var until time.Time
	for i, m := range mm.ms {
		d := m.HeldUntil()
		if d.IsZero() {
			return time.Time{}
		}
		if i == 0 || d.Before(until) {
			until = d
		}
	}
	return until
}

// Valid reports whether, by this client's clock, the set is held now:
// time.Now() is before HeldUntil.
func (mm *MultiMutex) Valid() bool {
	return time.Now().Before(mm.HeldUntil())
}
