package ratelimit

import (
	"context"
	"fmt"
	"time"
)

// CheckerOptions configures NewChecker. The zero value of each field means
// its default; negative values are errors.
type CheckerOptions struct {
	// Timeout bounds the wait for Redis. Default DefaultTimeout (200ms).
	Timeout time.Duration
	// FallbackLocal decides with the in-process limiter while Redis fails
	// (an error for which Unavailable is true), as MiddlewareOptions.Fallback
	// FallbackLocal does (see FallbackLocal for its accuracy). Default
	// false: Check returns Redis's error.
	FallbackLocal bool
	// LocalKeys and LocalHold are those of MiddlewareOptions. They must be
	// 0 without FallbackLocal.
	LocalKeys int
	LocalHold time.Duration
	// OnLocal is told about each Redis error that the local fallback
	// answered (Check returns no error then). Default: nothing.
	OnLocal func(ctx context.Context, err error)
}

// Checker is the decision of the HTTP middleware for other transports
// (gRPC interceptors, message consumers): one request of cost 1 per Check,
// answered by the deny cache, by Redis under a context that the caller's
// cancellation does not end (so a client cannot turn its check into an
// error by going away), or by the local fallback. It is safe for
// concurrent use and starts no goroutine.
type Checker struct {
	c       checker
	onLocal func(ctx context.Context, err error)
}

// NewChecker returns a Checker deciding with l. It returns an error
// wrapping ErrInvalidOptions for a nil l or an option out of range.
func NewChecker(l *Limiter, opts CheckerOptions) (*Checker, error) {
	switch {
	case l == nil:
		return nil, fmt.Errorf("%w: nil *Limiter", ErrInvalidOptions)
	case opts.Timeout < 0:
		return nil, fmt.Errorf("%w: negative Timeout %v", ErrInvalidOptions, opts.Timeout)
	case opts.LocalKeys < 0:
		return nil, fmt.Errorf("%w: negative LocalKeys %d", ErrInvalidOptions, opts.LocalKeys)
	case opts.LocalHold < 0:
		return nil, fmt.Errorf("%w: negative LocalHold %v", ErrInvalidOptions, opts.LocalHold)
	case !opts.FallbackLocal && (opts.LocalKeys != 0 || opts.LocalHold != 0):
		return nil, fmt.Errorf("%w: LocalKeys and LocalHold need FallbackLocal", ErrInvalidOptions)
	}
	c := &Checker{onLocal: opts.OnLocal}
	c.c.init(l, opts.Timeout, opts.FallbackLocal, opts.LocalKeys, opts.LocalHold)
	if c.onLocal == nil {
		c.onLocal = func(context.Context, error) {}
	}
	return c, nil
}

// Check decides one request for key under ps (nil: the Limiter's own
// Limit) and counts it if allowed. A key longer than 1024 bytes, or one
// that starts with "~#", is counted under "~#" and its SHA-256, as
// MiddlewareOptions.KeyFunc says: keys often come from the client.
//
// Errors are those of AllowN and AllowPolicies, in two classes that
// Unavailable tells apart. An outage (Unavailable(err): a timeout, a
// failed connection, a server refusing service for a while) is answered
// locally with FallbackLocal (and told to OnLocal); otherwise Check returns
// it, and the caller chooses to pass the request (fail open) or refuse it
// (fail closed). A caller whose client is gone should not pass it: it may
// still read the answer. Any other error is a configuration or semantic
// error (a key holding another type of value, say): no fallback answers
// it, Check reports it to the Cache's observer (an EventFallback with
// SourceFailClosed) and returns it, and the caller must refuse the
// request, since passing it would switch limiting off while Redis is
// healthy.
func (c *Checker) Check(ctx context.Context, key string, ps *Policies) (Decision, error) {
	one := new([1]Result)
	return c.c.decide(ctx, key, ps, one, func(err error) { c.onLocal(ctx, err) })
}
