package lease

import (
	"context"
	"errors"
)

// Scopes are the contexts a holder made for its current hold (the Context
// methods of the mutex and semaphore packages), to cancel when the hold
// ends. They cost no goroutine: the holder cancels them from the code that
// ends the hold. The zero value is empty; the holder guards it with its
// own lock.
type Scopes []scope

type scope struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// Add keeps ctx and its cancel, and drops the contexts already done
// (cancelled by their callers, or their parents ended): a long hold that
// scopes each request with Context or Do would otherwise keep them all
// until it ends.
func (s *Scopes) Add(ctx context.Context, cancel context.CancelCauseFunc) {
	live := (*s)[:0]
	for _, e := range *s {
		if e.ctx.Err() == nil {
			live = append(live, e)
		}
	}
	clear((*s)[len(live):])
	live = append(live, scope{ctx, cancel})
	*s = live
}

// End cancels every context with cause and forgets them.
func (s *Scopes) End(cause error) {
	for _, e := range *s {
		e.cancel(cause)
	}
	*s = nil
}

// DoErr is the error of a Do (lock or acquire, run fn, release) of any
// primitive: fn's error err, joined with during, the loss of the hold
// declared by the time fn returned (nil if none), and with what the
// release's errors uerrs add (one per hold released: a set of locks has
// one per member). lost is the primitive's loss sentinel (mutex.ErrLost,
// semaphore.ErrLost), which every loss error wraps.
//
// A loss that comes to light after fn returned counts as a loss while fn
// ran unless this client declared it itself, on its own clock (Declared):
// the lease ran out (the hold lasted until its lease, after fn) or the
// keeper was closed. A loss that was found (the release, a renewal or a
// nested acquisition saw the hold gone from Redis) can date from any time
// while fn ran (an operator's delete, a restart), so it is reported.
// Losses are left out once one is reported.
func DoErr(lost, err, during error, uerrs ...error) error {
	errs := []error{err}
	if during != nil {
		errs = append(errs, during)
	}
	for _, e := range uerrs {
		switch {
		case e == nil:
		case !errors.Is(e, lost):
			errs = append(errs, e)
		case during == nil && !Declared(e):
			errs = append(errs, e)
			during = e
		}
	}
	if len(errs) == 1 {
		return err
	}
	return errors.Join(errs...)
}

// Declared reports whether the loss that err wraps is one this client
// declared on its own clock (ErrExpired: its lease ran out; ErrClosed: its
// keeper was closed), rather than one found in Redis.
func Declared(err error) bool {
	return errors.Is(err, ErrExpired) || errors.Is(err, ErrClosed)
}
