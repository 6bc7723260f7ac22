package mutex

import (
	"context"
	"fmt"
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
	return doErr(err, during, rw.release(uctx, write))
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
	if err := mm.Lock(ctx); err != nil {
		return err
	}
	hctx, cancel := mm.Context(ctx)
	err := fn(hctx)
	cancel()
	during := mm.Err() // the set's hold's loss, if any by now
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), mm.ms[0].lease)
	defer ucancel()
	return doErr(err, during, mm.unlock(uctx)...)
}
