package semaphore

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicekit/sluice/internal/lease"
)

// Context returns a context derived from parent that is cancelled when the
// permit ends: lost (context.Cause wraps ErrLost and the reason) or given
// back by Release (the cause wraps ErrNotHeld; also when the Release
// failed, since the permit is no longer renewed then). Work that must stop
// when the permit is gone can simply run under it. If the permit has ended
// already, the context is already cancelled.
//
// It costs no goroutine; the cancel function only releases the context
// early, and is safe to ignore once the permit has ended.
func (p *Permit) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.err != nil:
		cancel(p.err)
	case p.released || p.stopped:
		cancel(fmt.Errorf("%w: %q: released", ErrNotHeld, p.s.name))
	default:
		p.scoped.Add(ctx, cancel)
	}
	return ctx, func() { cancel(context.Canceled) }
}

// Do acquires n permits, runs fn with a context that ends if they are lost
// (Permit.Context), and releases them. It returns fn's error, joined with
// an error wrapping ErrLost if the permits were lost while fn ran (fn then
// ran, at least in part, without them, even if it returned nil), and with
// Release's error if that failed. A loss that the final Release finds (the
// permit was deleted or expired before it) counts as one while fn ran:
// nothing tells when it happened. Only a loss this client declared on its
// own clock after fn returned (the lease ran out, the Manager was closed)
// is left out, as by mutex.Mutex.Do. If Acquire fails, fn does not run and
// Do returns Acquire's error.
//
// The Release runs even when ctx has ended meanwhile, bounded by the
// permit's lease: permits should not outlive the work they guarded.
func (s *Semaphore) Do(ctx context.Context, n int64, fn func(ctx context.Context) error) error {
	p, err := s.Acquire(ctx, n)
	if err != nil {
		return err
	}
	pctx, cancel := p.Context(ctx)
	err = fn(pctx)
	cancel()
	during := p.Err() // the loss declared by the time fn returned, if any
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), s.m.lease)
	defer rcancel()
	return lease.DoErr(ErrLost, err, during, p.Release(rctx))
}

// HeldUntil returns the time until which, by this client's clock, the
// permit is known to be held: the end of its lease counted from before the
// request that granted or last renewed it was sent, less the safety margin
// (see "Expiry and reclamation"). It returns the zero time once the permit
// is lost or a Release has begun.
//
// It reads the clock and the permit's own state only, and waits for no
// renewal or goroutine: a process resumed after a pause longer than the
// lease (SIGSTOP, a VM freeze) gets a time in the past at once, even
// before the watchdog has run and closed Lost. Check it (or Valid) right
// before a write that must not happen without the permit; the fencing is
// still the storage's, since the write itself can be delayed.
func (p *Permit) HeldUntil() time.Time {
	p.mu.Lock()
	lse, ok := p.lse, p.err == nil && !p.released && !p.stopped
	p.mu.Unlock()
	if !ok || lse == nil {
		return time.Time{}
	}
	return lse.Deadline()
}

// Valid reports whether, by this client's clock, the permit is held now:
// time.Now() is before HeldUntil.
func (p *Permit) Valid() bool {
	return time.Now().Before(p.HeldUntil())
}
