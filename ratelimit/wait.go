package ratelimit

import (
	"context"
	"errors"
	"time"
)

// ErrNotAllowed means Wait gave up: its context ended, or would end before
// the request could be allowed. The error also wraps the context's error.
var ErrNotAllowed = errors.New("ratelimit: not allowed before the context ends")

// minWait is the shortest sleep between two tries of Wait, so that a
// denial with a zero RetryAfter (a window ending within a millisecond of
// PTTL rounding) cannot make it spin.
const minWait = time.Millisecond

// Wait blocks until a request of cost n for key is allowed, and counts it;
// it returns that Result. Between tries it sleeps the RetryAfter the
// server gave (on a timer, never polling), so a lone caller is usually
// allowed on its second try; callers that compete for one key take turns
// in no particular order.
//
// It fails at once, without sleeping, when n can never be allowed
// (ErrCostTooHigh, as AllowN) and when ctx has a deadline before the
// request could be allowed: a denial's RetryAfter only ever grows, so
// sleeping would be for nothing. Then, or when ctx ends while it sleeps,
// it returns the last denied Result and errors.Join(ErrNotAllowed,
// ctx.Err()) (context.DeadlineExceeded for a deadline it foresaw). Other
// errors are those of AllowN.
func (l *Limiter) Wait(ctx context.Context, key string, n int) (Result, error) {
	for {
		res, err := l.AllowN(ctx, key, n)
		if err != nil || res.Allowed {
			return res, err
		}
		if err := l.sleep(ctx, res.RetryAfter); err != nil {
			return res, err
		}
	}
}

// WaitPolicies is Wait for AllowPolicies: it blocks until a request of cost
// n for key is allowed by every policy of ps, sleeping the Decision's
// RetryAfter between tries.
func (l *Limiter) WaitPolicies(ctx context.Context, key string, n int, ps *Policies) (Decision, error) {
	for {
		d, err := l.AllowPolicies(ctx, key, n, ps)
		if err != nil || d.Allowed {
			return d, err
		}
		if err := l.sleep(ctx, d.RetryAfter); err != nil {
			return d, err
		}
	}
}

// sleep waits d (at least minWait) or until ctx ends, and fails at once if
// ctx's deadline comes first.
func (l *Limiter) sleep(ctx context.Context, d time.Duration) error {
	d = max(d, minWait)
	if err := ctx.Err(); err != nil {
		return errors.Join(ErrNotAllowed, err)
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d {
		return errors.Join(ErrNotAllowed, context.DeadlineExceeded)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return errors.Join(ErrNotAllowed, ctx.Err())
	}
}
