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
			cause = fmt.Errorf("%w: %q", ErrNotHeld, m.name)
		}
		cancel(cause)
	} else {
		m.scoped.add(ctx, cancel)
	}
	return ctx, func() { cancel(context.Canceled) }
}

// endScopedLocked cancels the contexts of the hold that just ended. Called
// with m.mu held.
func (m *Mutex) endScopedLocked(cause error) {
	m.scoped.end(cause)
}

// scopes are the contexts Context made for a hold, to cancel when it ends.
type scopes []scope

type scope struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// add keeps ctx and its cancel, and drops the contexts already done
// (cancelled by their callers, or their parents ended): a long hold that
// scopes each request with Context or Do would otherwise keep them all
// until it ends.
func (s *scopes) add(ctx context.Context, cancel context.CancelCauseFunc) {
	live := (*s)[:0]
	for _, e := range *s {
		if e.ctx.Err() == nil {
			live = append(live, e)
		}
	}
	clear((*s)[len(live):])
	*s = append(live, scope{ctx, cancel})
}

// end cancels every context with cause.
func (s *scopes) end(cause error) {
	for _, e := range *s {
		e.cancel(cause)
	}
	*s = nil
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
	if err := m.Lock(ctx); err != nil {
		return err
	}
	lost := m.Lost()
	hctx, cancel := m.Context(ctx)
	err := fn(hctx)
	cancel()
	during := lossBy(lost, m.Err, m.name)
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), m.lease)
	defer ucancel()
	return doErr(err, during, m.Unlock(uctx))
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
// (one per hold released: a MultiMutex's members each have one).
//
// A loss that comes to light after fn returned counts as a loss while fn
// ran unless this client declared it itself, on its own clock: the lease
// ran out (lease.ErrExpired: the hold lasted until its lease, after fn) or
// the Locker was closed (lease.ErrClosed). A loss that was found (the
// release, a renewal or a nested Lock saw the hold gone from Redis) can
// date from any time while fn ran (an operator's ForceUnlock, a DEL, a
// restart), so it is reported. Losses are left out once one is reported.
func doErr(err, during error, uerrs ...error) error {
	errs := []error{err}
	if during != nil {
		errs = append(errs, during)
	}
	for _, e := range uerrs {
		switch {
		case e == nil:
		case !errors.Is(e, ErrLost):
			errs = append(errs, e)
		case during == nil && !declaredLoss(e):
			errs = append(errs, e)
			during = e
		}
	}
	if len(errs) == 1 {
		return err
	}
	return errors.Join(errs...)
}

// declaredLoss reports whether the loss that err wraps is one this client
// declared on its own clock (its lease ran out, or its Locker was closed),
// rather than one found in Redis.
func declaredLoss(err error) bool {
	return errors.Is(err, lease.ErrExpired) || errors.Is(err, lease.ErrClosed)
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
// a d outside the lease bounds.
func (m *Mutex) Extend(ctx context.Context, d time.Duration) (time.Time, error) {
	if m.watchdog {
		return time.Time{}, fmt.Errorf("%w: %q", ErrNotFixed, m.name)
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
		return time.Time{}, fmt.Errorf("%w: %q", ErrNotHeld, m.name)
	}
	sent := time.Now()
	ok, err := m.l.renew.Exec(ctx, m.keys[:1], []string{m.owner, tokenArg, strconv.FormatInt(d.Milliseconds(), 10)}).AsInt64()
	if err != nil {
		return time.Time{}, fmt.Errorf("mutex: extend %q: %w", m.name, inner(err))
	}
	if ok == 0 {
		return time.Time{}, m.foundNotHeld(gen)
	}
	m.mu.Lock()
	if m.gen != gen || m.holds == 0 {
		// Declared lost while the call was in flight (the old lease ran
		// out first). The server has the extended hold; the next Unlock
		// gives it back.
		err := m.err
		m.mu.Unlock()
		return time.Time{}, err
	}
	old := m.lse
	m.mu.Unlock()
	lse := m.l.keeper.Add(sent, d, nil, func(err error) { m.lose(gen, err) })
	if old != nil {
		old.Stop()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gen != gen || m.holds == 0 {
		lse.Stop()
		return time.Time{}, m.err
	}
	m.lse = lse
	return lse.Deadline(), nil
}
