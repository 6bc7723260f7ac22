package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/sluicekit/sluice/semaphore"
)

// DefaultConcurrencyRetryAfter is the Retry-After of a request refused by
// the concurrency middleware when ConcurrencyOptions.RetryAfter is 0.
const DefaultConcurrencyRetryAfter = time.Second

// concurrencyName starts the semaphore name of every key, so that the
// middleware's semaphores never share a name with others of the Manager.
const concurrencyName = "rl-conc:"

// maxConcurrencyName is the longest ConcurrencyOptions.Name, so that the
// key keeps most of the semaphore name's 1024 bytes.
const maxConcurrencyName = 256

// ConcurrencyOptions configures NewConcurrencyMiddleware. The zero value of
// each field means its default; negative or out-of-range values are errors.
type ConcurrencyOptions struct {
	// Limit is the most requests of one key in flight at once, across
	// every process that shares the Manager's Redis. Required, between 1
	// and semaphore.MaxCapacity.
	//
	// Middlewares count together only if they have the same Name and the
	// same Limit: each Limit has semaphores of its own. So a rolling
	// deploy that changes Limit never makes the old and the new
	// configuration refuse each other (a semaphore is held under one
	// capacity at a time, see semaphore.ErrCapacityMismatch); while both
	// run, a key may have up to the old Limit in flight through the old
	// processes and the new Limit through the new ones.
	Limit int
	// Name names the count, so that middlewares for different routes
	// count separately: middlewares on Managers that share a Redis and a
	// Prefix, with the same Name and Limit, share one count per key (a
	// request in flight through one counts against the other). Any bytes,
	// at most 256. Default: PolicyName, itself "concurrency" by default.
	Name string
	// KeyFunc, TrustedProxies, ClientIPHeader, IPv4PrefixLen and
	// IPv6PrefixLen choose the key of a request, as in MiddlewareOptions:
	// by default the client IP, IPv6 grouped by /64. A KeyFunc that
	// returns one constant key limits the whole server instead (see
	// NewConcurrencyMiddleware).
	KeyFunc        func(r *http.Request) (string, error)
	TrustedProxies []netip.Prefix
	ClientIPHeader ClientIPHeader
	IPv4PrefixLen  int
	IPv6PrefixLen  int
	// Timeout bounds each Redis call: taking the permit and giving it
	// back. Default DefaultTimeout (200ms). The client cannot shorten it.
	Timeout time.Duration
	// Fallback is FallbackOpen (the default) or FallbackClosed, as in
	// MiddlewareOptions; there is no local fallback for concurrency. It
	// answers only for errors Unavailable counts as an outage (a timeout,
	// a failed connection, a server that refuses service for a while):
	// any other error (a capacity mismatch, a closed Manager, a KeyFunc
	// error that is no outage) gets 500 Internal Server Error.
	Fallback Fallback
	// UnavailableRetryAfter is the Retry-After of FallbackClosed's 503.
	// Default 0: none.
	UnavailableRetryAfter time.Duration
	// RetryAfter is the Retry-After of the 429 sent when the key has Limit
	// requests in flight, rounded up to whole seconds. Default
	// DefaultConcurrencyRetryAfter (1s): when a request ends is not known.
	RetryAfter time.Duration
	// OnError is told about every error, including a permit that could
	// not be given back (it then expires with its lease). The semaphore
	// Manager reports failed acquisitions to its Cache's observer too
	// (scriptcache.EventAcquireFailed). Default: slog.Default() at level
	// Error.
	OnError func(r *http.Request, err error)
	// PolicyName names the policy in the header fields. Default
	// "concurrency".
	PolicyName string
	// DisableHeaders sends no RateLimit-Policy and RateLimit fields.
	DisableHeaders bool
	// ProblemDetails makes the 429 an RFC 9457 problem details body of the
	// draft's quota-exceeded type, as in MiddlewareOptions.
	ProblemDetails bool
}

// NewConcurrencyMiddleware returns net/http middleware that lets at most
// opts.Limit requests of one key (by default one client IP) be in flight
// at once, holding a permit of a distributed semaphore of mgr per request.
// A request over the limit gets 429 Too Many Requests with Retry-After,
// and every limited response the header fields of
// draft-ietf-httpapi-ratelimit-headers-11 for a quota of concurrent
// requests:
//
//	RateLimit-Policy: "concurrency";q=10;qu="concurrent-requests"
//	RateLimit: "concurrency";r=0
//
// RateLimit is sent with the 429 only: knowing how many permits are left
// after taking one would cost another round trip per request.
//
// The key is the client IP by default, so each client has Limit requests
// in flight. For one limit over the whole server, give a KeyFunc that
// returns the same non-empty key for every request (an empty key passes
// the request unlimited):
//
//	KeyFunc: func(*http.Request) (string, error) { return "all", nil },
//
// Stacked with NewMiddleware, in either order, each middleware adds its
// policy to the RateLimit-Policy and RateLimit lists the other wrote
// (different PolicyNames keep both; a name is listed once). What is
// counted depends on the order:
//
//   - Rate limit outside (rate(concurrency(h))), the usual choice: a
//     request the rate limit refuses never takes a permit, so a flooding
//     client is turned away by the rate limiter (from its deny cache,
//     without a Redis call) and never holds one of the slots. A request
//     refused for concurrency has been counted by the rate limit.
//   - Concurrency outside (concurrency(rate(h))): every request takes a
//     permit first, also one the rate limit then refuses (it holds the
//     permit while the rate limit is asked), so each request of a flood
//     costs the Redis calls that take and give back a permit. A request refused for concurrency is not counted
//     by the rate limit: choose this order when requests turned away for
//     being too many at once must not spend a client's rate.
//
// The semaphores report to the observer of mgr's Cache under the prefix
// their names share (scriptcache.Event.Name), which the configuration
// makes (Name and Limit), never under a client's key: a metric labelled
// with the name gets one series per middleware, not one per client.
//
// The permit is given back when the handler returns, also by a panic. A
// client that goes away cancels the request's context; a handler that
// watches it (as net/http handlers should) returns, which frees the
// permit. A process that dies holding permits gives them back when their
// lease ends (see package semaphore: the Manager's watchdog renews them
// while the handler runs).
//
// It returns an error wrapping ErrInvalidOptions for a nil mgr, a Manager
// with a fixed semaphore.Options.Lease (its permits would expire under a
// handler that runs longer, which would then no longer count), or an
// option out of range.
func NewConcurrencyMiddleware(mgr *semaphore.Manager, opts ConcurrencyOptions) (func(http.Handler) http.Handler, error) {
	switch {
	case mgr == nil:
		return nil, fmt.Errorf("%w: nil *semaphore.Manager", ErrInvalidOptions)
	case opts.Limit < 1 || int64(opts.Limit) > semaphore.MaxCapacity:
		return nil, fmt.Errorf("%w: concurrency Limit %d is not between 1 and %d", ErrInvalidOptions, opts.Limit, int64(semaphore.MaxCapacity))
	case len(opts.Name) > maxConcurrencyName:
		return nil, fmt.Errorf("%w: concurrency Name is longer than %d bytes", ErrInvalidOptions, maxConcurrencyName)
	case opts.Timeout < 0 || opts.RetryAfter < 0 || opts.UnavailableRetryAfter < 0:
		return nil, fmt.Errorf("%w: negative duration", ErrInvalidOptions)
	case opts.Fallback != FallbackOpen && opts.Fallback != FallbackClosed:
		return nil, fmt.Errorf("%w: concurrency Fallback %v", ErrInvalidOptions, opts.Fallback)
	}
	if _, renewed := mgr.Lease(); !renewed {
		return nil, fmt.Errorf("%w: the Manager has a fixed Lease, so a permit would stop counting when a handler outlasts it", ErrInvalidOptions)
	}
	keyFunc, err := requestKeyFunc(opts.KeyFunc, opts.TrustedProxies, opts.ClientIPHeader, opts.IPv4PrefixLen, opts.IPv6PrefixLen)
	if err != nil {
		return nil, err
	}
	c := &concurrency{mgr: mgr, opts: opts, keyFunc: keyFunc, timeout: opts.Timeout}
	c.prefix = concurrencyPrefix(opts)
	c.event = semaphore.WithEventName(c.prefix)
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
	}
	if opts.UnavailableRetryAfter > 0 {
		c.unavailable = strconv.FormatInt(ceilSeconds(opts.UnavailableRetryAfter), 10)
	}
	if c.opts.OnError == nil {
		c.opts.OnError = func(r *http.Request, err error) {
			slog.Default().ErrorContext(r.Context(), "ratelimit: concurrency not checked", "method", r.Method, "path", r.URL.Path, "err", err)
		}
	}
	name := `"concurrency"`
	if opts.PolicyName != "" {
		name = sfString(opts.PolicyName)
	}
	c.names = []string{name}
	c.policy = name + ";q=" + strconv.Itoa(opts.Limit) + `;qu="concurrent-requests"`
	retry := opts.RetryAfter
	if retry == 0 {
		retry = DefaultConcurrencyRetryAfter
	}
	c.retry = strconv.FormatInt(max(ceilSeconds(retry), 1), 10)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { c.serve(next, w, r) })
	}, nil
}

type concurrency struct {
	mgr         *semaphore.Manager
	opts        ConcurrencyOptions
	keyFunc     func(r *http.Request) (string, error)
	prefix      string           // of every semaphore name, see concurrencyPrefix
	event       semaphore.Option // reports the semaphores' events under prefix
	timeout     time.Duration
	unavailable string   // Retry-After of the 503, or ""
	retry       string   // Retry-After of the 429
	policy      string   // RateLimit-Policy value
	names       []string // quoted policy name
}

func (c *concurrency) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	key, err := c.keyFunc(r)
	if err == nil && key == "" {
		next.ServeHTTP(w, r)
		return
	}
	if se, ok := refusal(err); ok {
		refuse(w, se)
		return
	}
	var p *semaphore.Permit
	if err == nil {
		var sem *semaphore.Semaphore
		// Bounded as the rate middleware's keys are (see boundKey): a
		// name the semaphore refuses would be an error for every
		// request of the client.
		name := c.prefix + boundKey(key, maxKeyLen-len(c.prefix))
		if sem, err = c.mgr.NewSemaphore(name, int64(c.opts.Limit), c.event); err == nil {
			// Not r.Context(), as in the rate middleware: the decision must
			// not be the client's.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), c.timeout)
			p, err = sem.TryAcquire(ctx, 1)
			cancel()
		}
	}
	h := w.Header()
	// A timeout wraps ErrNotObtained too: it is an outage, not a denial.
	unavailable := Unavailable(err)
	denied := !unavailable && errors.Is(err, semaphore.ErrNotObtained)
	if !c.opts.DisableHeaders && p != nil {
		// Added to the policies of an outer middleware, not set over
		// them (see addPolicies).
		addPolicies(h, c.names, c.policy, "")
	}
	switch {
	case p != nil:
		defer c.release(r, p)
		next.ServeHTTP(w, r)
	case denied:
		if !c.opts.DisableHeaders {
			addPolicies(h, c.names, c.policy, c.names[0]+";r=0")
		}
		h.Set("Retry-After", c.retry)
		if c.opts.ProblemDetails {
			writeProblem(w, c.names[:1])
			return
		}
		http.Error(w, "too many requests in flight", http.StatusTooManyRequests)
	case !unavailable:
		// A configuration or semantic error: never a fallback.
		c.opts.OnError(r, err)
		refuseError(w)
	default:
		c.opts.OnError(r, err)
		if c.opts.Fallback == FallbackClosed || r.Context().Err() != nil {
			if c.unavailable != "" {
				h.Set("Retry-After", c.unavailable)
			}
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
	}
}

// concurrencyPrefix starts the semaphore names of the middleware of opts:
// concurrencyName, the length of the Name, the Name and the Limit, each
// followed by ':', so that no (Name, Limit, key) shares a semaphore with
// another and a semaphore is only ever made with one capacity.
func concurrencyPrefix(opts ConcurrencyOptions) string {
	name := opts.Name
	if name == "" {
		name = opts.PolicyName
	}
	if name == "" {
		name = "concurrency"
	}
	return concurrencyName + strconv.Itoa(len(name)) + ":" + name + ":" + strconv.Itoa(opts.Limit) + ":"
}

// release gives p back, bounded by the timeout whatever the client did.
func (c *concurrency) release(r *http.Request, p *semaphore.Permit) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), c.timeout)
	defer cancel()
	if err := p.Release(ctx); err != nil {
		c.opts.OnError(r, err)
	}
}

// writeProblem writes the 429 problem details naming the policies in
// names, already quoted (valid JSON strings).
func writeProblem(w http.ResponseWriter, names []string) {
	b := []byte(`{"type":"` + problemType + `","title":"Request cannot be satisfied as assigned quota has been exceeded","status":429,"violated-policies":[`)
	for i, n := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, n...)
	}
	b = append(b, "]}\n"...)
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(b) // a client that left cannot be told anything
}
