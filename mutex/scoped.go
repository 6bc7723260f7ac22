package mutex

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicekit/sluice/internal/lease"
)

// Context returns a context derived from parent that is cancelled when the
// current hold ends: lost (context.Cause wraps ErrLost and the reason) or
// released by the last Unlock (the cause wraps ErrNotHeld). Work that must
// stop when the lock is gone can simply run under it. If nothing is held,
// the context is already cancelled.
//
// It costs no goroutine; the cancel function only releases the context
// early, and is safe to ignore once the hold has ended.
func (m *Mutex) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.holds == 0 {
		cause := m.err
		if cause == nil {
			cause = fmt.Errorf("%w: %q", ErrNotHeld, m.Name())
		}
		cancel(cause)
	} else {
		if m.scoped == nil {
			m.scoped = new(lease.Scopes)
		}
		m.scoped.Add(ctx, cancel)
	}
	return ctx, func() { cancel(context.Canceled) }
}

// endScopedLocked cancels the contexts of the hold that just ended. Called
// with m.mu held.
func (m *Mutex) endScopedLocked(cause error) {
	if m.scoped != nil {
		m.scoped.End(cause)
	}
}

// Do locks m, runs fn with a context that ends if the hold is lost, and
// unlocks. It returns fn's error, joined with an error wrapping ErrLost if
// the hold was lost while fn ran (fn then ran, at least in part, without the
// lock, even if it returned nil), and with Unlock's error if that failed.
// A loss that the final Unlock finds (the lock was deleted, expired or
// taken over before it) counts as one while fn ran: nothing tells when it
// happened. If Lock fails, fn does not run and Do returns Lock's error.
//
// The Unlock runs even when ctx has ended meanwhile, bounded by the lock's
// lease: a hold should not outlive the work it guarded.
func (m *Mutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	outer := m.Holds() == 0
	if err := m.Lock(ctx); err != nil {
		return err
	}
	lost := m.Lost()
	hctx, cancel := m.Context(ctx)
	err := fn(hctx)
	cancel()
	during := lossBy(lost, m.Err, m.Name())
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), m.set.lease)
	defer ucancel()
	uerr := m.Unlock(uctx)
	if uerr != nil && outer && !errors.Is(uerr, ErrNotHeld) {
		// The final Unlock failed (a lost connection, a TRYAGAIN while
		// the slot moves). Nobody will call Unlock again for a hold Do
		// took, so the watchdog must not renew it: drop it, and let the
		// server's lease end what Redis still keeps.
		m.dropHold(uerr)
	}
	return doErr(err, during, uerr)
}

// lossBy returns the loss of a hold whose Lost channel is lost, if it has
// closed by now (errOf says why; the error wraps ErrLost), or nil.
func lossBy(lost <-chan struct{}, errOf func() error, name string) error {
	select {
	case <-lost:
	default:
		return nil
	}
	if err := errOf(); errors.Is(err, ErrLost) {
		return err
	}
	// The hold was lost, then fn locked afresh, which reset Err.
	return fmt.Errorf("%w: %q", ErrLost, name)
}

// doErr is the error of a Do (Mutex, RWMutex and MultiMutex alike): fn's
// error err, joined with during, the loss of the hold declared by the time
// fn returned (nil if none), and with what the release's errors uerrs add
// (one per hold released: a MultiMutex's members each have one). The rule,
// shared with the semaphore's Do, is lease.DoErr's: a loss that comes to
// light after fn returned counts as one while fn ran unless this client
// declared it on its own clock (its lease ran out, its Locker was closed).
func doErr(err, during error, uerrs ...error) error {
	return lease.DoErr(ErrLost, err, during, uerrs...)
}

// ErrNotFixed means Extend was called on a Mutex whose lease the watchdog
// renews; only fixed leases (Options.Lease, WithLease) can be extended.
var ErrNotFixed = errors.New("mutex: lease is renewed by the watchdog, not fixed")

// Extend gives the current hold of a Mutex with a fixed lease a new lease
// of d from now, if this Mutex still holds it, and returns the time until
// which the hold is known to last (counted, like every lease, from before
// the request was sent, less the safety margin). It returns an error
// wrapping ErrNotHeld if nothing is held, ErrLost if the server no longer
// has the hold, ErrNotFixed for a watchdog lease, and ErrInvalidOptions for
// a d outside the lease bounds. ErrLost also when this client declared the
// hold lost while the call was on its way (the old lease ran out first on
// its clock): if the server took the new lease all the same, Extend gives
// it back before it returns. A new lease that ends before the old one
// wakes the Locks waiting for the lock (they sleep at most until the end of
// the lease they were refused under), so that they wait for the new end.
// A new lease that ends before the old one bounds the hold from the moment
// the call is sent, since the server may apply it before its reply comes
// back: the hold is known to last only until its end (HeldUntil, Valid,
// Lost), also if the call fails with its outcome unknown (ctx ended, the
// connection failed) or is refused.
func (m *Mutex) Extend(ctx context.Context, d time.Duration) (time.Time, error) {
	if m.set.watchdog {
		return time.Time{}, fmt.Errorf("%w: %q", ErrNotFixed, m.Name())
	}
	if err := lease.CheckFixed(d); err != nil || d == 0 {
		return time.Time{}, fmt.Errorf("%w: extend by %v: lease outside [%v, %v]", ErrInvalidOptions, d, lease.MinLease, lease.MaxLease)
	}
	m.op.Lock()
	defer m.op.Unlock()
	m.mu.Lock()
	holds, gen, tokenArg, lostErr := m.holds, m.gen, m.tokenArg, m.err
	m.mu.Unlock()
	if holds == 0 {
		if lostErr != nil {
			return time.Time{}, fmt.Errorf("%w: %w", ErrNotHeld, inner(lostErr))
		}
		return time.Time{}, fmt.Errorf("%w: %q", ErrNotHeld, m.Name())
	}
	sent := time.Now()
	// A shorter lease takes effect when the call reaches the server, and
	// another owner may get the lock when it ends, before the reply is
	// back (a slow network): the hold follows the shorter end from now.
	m.mayHaveExtended(gen, sent, d)
	rep := m.l.renew.Exec(ctx, []string{m.key(keyLock), m.key(keyWake)}, []string{m.owner, tokenArg, strconv.FormatInt(d.Milliseconds(), 10), m.l.pubMode})
	ok, err := rep.AsInt64()
	if err != nil {
		return time.Time{}, fmt.Errorf("mutex: extend %q: %w", m.Name(), inner(err))
	}
	if ok == 0 {
		return time.Time{}, m.foundNotHeld(gen)
	}
	m.mu.Lock()
	if m.gen != gen || m.holds == 0 {
		// Declared lost while the call was in flight (the old lease ran
		// out first on this client's clock, not yet on the server's).
		// The server took the new lease, which nobody holds now: give it
		// back at once, as a late grant is, instead of leaving it to the
		// next Unlock, which a holder told of the loss may never call
		// (the lock stayed held for all of d). Only this acquisition's
		// token is released; m.op keeps a new one from starting.
		err := m.err
		m.mu.Unlock()
		gctx, cancel := m.l.grantBound(m.set.lease)
		m.unlockCall(gctx, holds, tokenArg)
		cancel()
		return time.Time{}, err
	}
	old := m.lse
	m.mu.Unlock()
	// Answered when the new lease was already over on this client's
	// clock, the hold is lost: the server may have ended it meanwhile, as
	// a late grant is not a hold (see Mutex.startHold).
	if lse := m.replaceLease(gen, sent, d, old); lse != nil {
		return lse.Deadline(), nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Time{}, m.err
}

// replaceLease makes the lease d, counted from sent, the hold's in place
// of old (nil: none), and returns it; or nil if the hold of gen is gone,
// or declared lost here because that lease is already over. Called with
// m.op held.
func (m *Mutex) replaceLease(gen uint64, sent time.Time, d time.Duration, old *lease.Lease) *lease.Lease {
	if !lease.Live(sent, d, time.Now()) {
		if old != nil {
			old.Stop()
		}
		m.lose(gen, lease.ErrExpired)
		return nil
	}
	lse := m.l.keeper.AddHeld(sent, d, nil, (*heldMutex)(m), gen)
	if old != nil {
		old.Stop()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gen != gen || m.holds == 0 {
		lse.Stop()
		return nil
	}
	m.lse = lse
	return lse
}

// mayHaveExtended follows an Extend by d, sent at sent, from its send on:
// until its reply, and for good if its outcome stays unknown (its context
// ended, or the connection failed, before the reply), the server may have
// taken the new lease or not. If the new one ends first (an Extend that
// shortens), the hold is known to last only until its end, so HeldUntil,
// Valid and Lost follow it: keeping the old end would let this client
// believe it holds the lock after the server freed it for others (also
// while the reply is on its way). A longer new lease changes nothing: the
// old end holds either way. An Extend that the server refused (an error
// reply) leaves the hold with the shorter end: early, never late. Called
// with m.op held.
func (m *Mutex) mayHaveExtended(gen uint64, sent time.Time, d time.Duration) {
	m.mu.Lock()
	old := m.lse
	if m.gen != gen || m.holds == 0 || old == nil || !lease.End(sent, d).Before(old.Deadline()) {
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	m.replaceLease(gen, sent, d, old)
}

// HeldUntil returns the time until which, by this client's clock, the
// current hold is known to last: the end of its lease counted from before
// the request that took or last renewed (or extended) it was sent, less
// the safety margin (see "Loss" in the package doc). It returns the zero
// time if nothing is held or the hold was lost.
//
// It reads the clock and this Mutex's own state only, and waits for no
// renewal or goroutine: a process resumed after a pause longer than the
// lease (SIGSTOP, a VM freeze) gets a time in the past at once, even
// before the watchdog has run and closed Lost. Check it (or Valid) right
// before a write that must not happen without the lock; the fencing token
// is still what makes a write that is itself delayed harmless.
func (m *Mutex) HeldUntil() time.Time {
	m.mu.Lock()
	lse := m.lse
	if m.holds == 0 {
		lse = nil
	}
	m.mu.Unlock()
	if lse == nil {
		return time.Time{}
	}
	return lse.Deadline()
}

// Valid reports whether, by this client's clock, this Mutex holds the lock
// now: time.Now() is before HeldUntil.
func (m *Mutex) Valid() bool {
	return time.Now().Before(m.HeldUntil())
}
