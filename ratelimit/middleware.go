package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicekit/sluice/scriptcache"
)

// ErrNoClientIP means the client address of a request could not be parsed.
var ErrNoClientIP = errors.New("ratelimit: no client ip")

// DefaultTimeout bounds the wait for Redis per request when
// MiddlewareOptions.Timeout is 0. It is long enough for a loaded server and
// short enough that a dead one does not hold requests.
const DefaultTimeout = 200 * time.Millisecond

// ClientIPHeader names the one request header ClientIP reads when the peer
// is a trusted proxy.
//
// Exactly one header is read and the others are ignored. A proxy sets or
// appends to the header it is configured for and usually passes the others
// through from the client untouched, so reading a second header would let a
// client choose its own key. Configure the header your proxy writes.
type ClientIPHeader int

// XForwardedFor reads X-Forwarded-For, the comma-separated list a proxy
// appends its peer to (nginx $proxy_add_x_forwarded_for, HAProxy
// "option forwardfor", AWS and Google load balancers, Envoy). It is
// the zero value and the default because it is what most proxies write.
const XForwardedFor ClientIPHeader = 0

// XRealIP reads X-Real-IP, one address a proxy sets to its peer
// (nginx "proxy_set_header X-Real-IP $remote_addr"). If the header
// appears on several lines, the last is read.
const XRealIP ClientIPHeader = 1

// Forwarded reads the for= parameters of RFC 7239 Forwarded, one
// element per proxy. Obfuscated identifiers ("_hidden") and "unknown"
// name no address, so they stop the walk like an unparsable entry.
const Forwarded ClientIPHeader = 2

// String returns the header's name.
func (h ClientIPHeader) String() string {
	switch h {
	case XForwardedFor:
		return "X-Forwarded-For"
	case XRealIP:
		return "X-Real-IP"
	case Forwarded:
		return "Forwarded"
	}
	return "ClientIPHeader(" + strconv.Itoa(int(h)) + ")"
}

// Fallback says what the middleware does with a request when Redis cannot
// answer in time (MiddlewareOptions.Timeout) or at all.
//
// Only the errors that Unavailable counts as an outage reach a fallback:
// timeouts, failed connections, and a server that refuses service for a
// while (LOADING, BUSY, READONLY and the like). Any other error of a check
// is a configuration or semantic error (a key holding another type of
// value, a closed Manager, a KeyFunc that finds no key): the request gets
// 500 Internal Server Error, the error goes to OnError and, if Redis was
// asked, to the Cache's observer (an EventFallback with SourceFailClosed),
// and limiting is never switched off for it.
//
// None is free. FallbackOpen keeps the service up through a Redis outage
// but removes limiting: whoever can slow Redis past the timeout (by
// flooding it, or with more keys than the deny cache holds) switches
// limiting off for everyone. FallbackClosed keeps every limit and takes the
// service down with Redis. FallbackLocal keeps limiting and the service up,
// with weaker limits: each process limits on its own, so a fleet of N
// processes admits up to N times the limit per key while Redis fails, and
// each key starts from a full bucket when the fallback begins.
type Fallback int

// FallbackOpen passes requests unlimited while Redis fails. It is the
// zero value and the default. A request whose client is gone (its
// context is done) is never passed unlimited: it gets a 503, since it
// may only have half-closed and would read the response.
const FallbackOpen Fallback = 0

// FallbackClosed rejects requests with 503 Service Unavailable (and
// UnavailableRetryAfter, if set) while Redis fails.
const FallbackClosed Fallback = 1

// FallbackLocal decides requests with an in-process limiter while
// Redis fails, and for LocalHold after each failure.
//
// The local limiter is a GCRA token bucket per key with the Limiter's
// Rate, Period and capacity (Burst for GCRA, Rate for the windows),
// whatever its algorithm. Its accuracy: per process, each key gets at
// most its capacity at once and Rate per Period after, counted from
// the first local decision for the key; N processes admit up to N
// times that. It holds at most LocalKeys keys; when full, a new key
// evicts the least recently used one, which starts from a full bucket
// if it comes back. A flooding key is always recently used, so it is
// only evicted if more than LocalKeys/16 other keys (of its shard)
// arrive between two of its requests; each of those is limited as a
// key of its own. A request whose KeyFunc fails with an outage
// (Unavailable) gets a 503, since there is no key to limit locally.
const FallbackLocal Fallback = 2

// String returns the fallback's name.
func (f Fallback) String() string {
	switch f {
	case FallbackOpen:
		return "open"
	case FallbackClosed:
		return "closed"
	case FallbackLocal:
		return "local"
	}
	return "Fallback(" + strconv.Itoa(int(f)) + ")"
}

// DefaultLocalKeys is the number of keys the local limiter of
// FallbackLocal holds when MiddlewareOptions.LocalKeys is 0: 16,384 keys,
// a few megabytes.
const DefaultLocalKeys = 16_384

// DefaultLocalHold is how long FallbackLocal decides locally after a Redis
// failure when MiddlewareOptions.LocalHold is 0.
const DefaultLocalHold = time.Second

// MiddlewareOptions configures NewMiddleware. The zero value of each field
// means its default; negative or out-of-range values are errors.
type MiddlewareOptions struct {
	// KeyFunc returns the limiter key of a request. An empty key with a nil
	// error lets the request through unlimited (for health checks, say); a
	// *StatusError answers the request with its client error status (a
	// request without the header its key comes from); any other error is
	// told to OnError and then handled as a Redis error is: by the
	// Fallback if Unavailable(err), by 500 otherwise (ErrNoClientIP, say:
	// a listener whose peers have no IP address). A key
	// longer than 1024 bytes, or one that starts with "~#", is counted
	// under "~#" and its SHA-256, so that a client cannot escape its limit
	// by sending a long key (which the Limiter itself refuses).
	// Default: the client IP of ClientIP with TrustedProxies and
	// ClientIPHeader, grouped by IPKey with the prefix lengths below.
	KeyFunc func(r *http.Request) (string, error)
	// TrustedProxies are the peers whose ClientIPHeader is believed.
	// Default none: the key is the connection's address and headers are
	// ignored. IPv4 proxies may be written as IPv4 prefixes or as
	// IPv4-mapped IPv6 prefixes (::ffff:10.0.0.0/104 is 10.0.0.0/8);
	// peers are compared unmapped, so other IPv6 prefixes, even ::/0, match
	// no IPv4 peer. An invalid (zero) prefix is an error.
	TrustedProxies []netip.Prefix
	// ClientIPHeader is the header read from a trusted proxy. Default
	// XForwardedFor; see ClientIPHeader for why only one is read.
	ClientIPHeader ClientIPHeader
	// IPv4PrefixLen groups IPv4 clients by network, 1 to 32. Default 32
	// (one key per address).
	IPv4PrefixLen int
	// IPv6PrefixLen groups IPv6 clients by network, 1 to 128. Default 64:
	// one host usually holds a whole /64 and could otherwise pick a new
	// address per request.
	IPv6PrefixLen int
	// Timeout bounds the wait for Redis. Default DefaultTimeout (200ms).
	// The client cannot shorten it: the check does not end when the
	// client's connection closes.
	Timeout time.Duration
	// Fallback says what happens to a request when Redis cannot answer in
	// time, or at all (an error for which Unavailable is true). Default
	// FallbackOpen; see Fallback for the trade-offs.
	Fallback Fallback
	// LocalKeys caps the keys the in-process limiter of FallbackLocal
	// holds, rounded up to a multiple of 16. Default DefaultLocalKeys.
	// Each key costs about 150 bytes plus the key itself. Must be 0
	// without FallbackLocal.
	LocalKeys int
	// LocalHold is how long FallbackLocal keeps deciding locally, without
	// asking Redis, after a Redis call failed. Then one request asks
	// Redis again while the others stay local, until Redis answers.
	// Default DefaultLocalHold (1s). Without it, every request would wait
	// Timeout for a Redis that an attacker keeps slow. Must be 0 without
	// FallbackLocal.
	LocalHold time.Duration
	// UnavailableRetryAfter is sent as Retry-After with the 503 of
	// FallbackClosed, rounded up to whole seconds. Default 0: no
	// Retry-After, since how long Redis stays unreachable is not known.
	UnavailableRetryAfter time.Duration
	// OnError is told about every error: Redis unreachable, timeouts, key
	// and policy errors, configuration errors (those answered with 500).
	// Default: slog.Default() at level Error.
	OnError func(r *http.Request, err error)
	// OnDenied writes the response to a denied request. The rate-limit
	// headers, including Retry-After, are already set. With several
	// policies, res is the Result of the policy that needs the longest
	// wait. Default: status 429 with a one-line text body, or the problem
	// details of ProblemDetails.
	OnDenied func(w http.ResponseWriter, r *http.Request, res Result)
	// ProblemDetails makes the default denial an RFC 9457 problem
	// details body (application/problem+json) of the draft's
	// quota-exceeded type, naming the policies without room in
	// "violated-policies". Default false: a one-line text body. It is an
	// error to set it with OnDenied.
	ProblemDetails bool
	// PolicyFunc returns the policies a request is checked against, for
	// limits that depend on the request (a tenant's plan, an endpoint's
	// cost class): one Policies per plan, built once with NewPolicies, or
	// built per request. The request is counted in all of them only when
	// all have room, and every one is reported in the header fields, as
	// named policies. A nil set means the Limiter's own Limit; an error is
	// handled as KeyFunc's is (a *StatusError answers the request; any
	// other goes to OnError, then the Fallback if Unavailable, else 500). Default nil:
	// the Limiter's own Limit for every request.
	PolicyFunc func(r *http.Request) (*Policies, error)
	// PolicyName names the policy in the RateLimit-Policy and RateLimit
	// fields. Default "default". It is sent as a structured-field string,
	// so it must be printable ASCII; other bytes are dropped.
	PolicyName string
	// XRateLimitHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (Unix time in seconds at which the key is reset, as
	// GitHub sends it). Default false.
	XRateLimitHeaders bool
	// DisableHeaders sends no rate-limit header fields except Retry-After on
	// denial. Default false.
	DisableHeaders bool
}

// NewMiddleware returns net/http middleware that limits requests with l,
// one key per client IP by default (see MiddlewareOptions.KeyFunc). It
// returns an error wrapping ErrInvalidOptions if l is nil or an option is
// out of range.
//
// Every limited response carries the header fields of
// draft-ietf-httpapi-ratelimit-headers-11:
//
//	RateLimit-Policy: "default";q=100;w=60
//	RateLimit: "default";r=42;t=17
//
// q is Result.Limit, w the time to earn q back in seconds (the Period,
// or Burst emission intervals for GCRA), rounded up; r is
// Result.Remaining. t is the number of seconds, rounded up, until quota is
// available again: Result.ResetAfter when the request is allowed, and
// Result.RetryAfter when it is denied, so that t and Retry-After name the
// same time. A denied request gets 429 Too Many Requests, Retry-After in
// whole seconds (rounded up, at least 1) and a short text body, unless
// OnDenied writes something else.
//
// Stacked with another middleware that sets these fields
// (NewConcurrencyMiddleware, or NewMiddleware with another Limiter), it adds
// its members to their lists rather than replacing them; see
// NewConcurrencyMiddleware for which order to stack them in.
//
// The decision does not depend on the client: Redis is asked under a
// context that the client's disconnect does not cancel, bounded by
// Timeout. Otherwise a client could half-close its connection after
// sending a request, make the check fail with context.Canceled, be let
// through by fail-open, and still read the response.
func NewMiddleware(l *Limiter, opts MiddlewareOptions) (func(http.Handler) http.Handler, error) {
	m, err := newMiddleware(l, opts)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(next, w, r)
		})
	}, nil
}

// MustNewMiddleware is NewMiddleware for handler chains built at start-up:
// it panics where NewMiddleware returns an error (a nil l or an option out
// of range), as regexp.MustCompile does for Compile.
func MustNewMiddleware(l *Limiter, opts MiddlewareOptions) func(http.Handler) http.Handler {
	mw, err := NewMiddleware(l, opts)
	if err != nil {
		panic(err)
	}
	return mw
}

type middleware struct {
	opts   MiddlewareOptions
	policy string   // RateLimit-Policy value of the Limiter's own Limit
	names  []string // its quoted policy name
	retry  string   // Retry-After of the 503, or ""
	checker
}

// checker is the decision core of the middleware and of Checker: the deny
// cache, Redis under a bounded context the caller cannot cancel, and the
// local fallback.
type checker struct {
	l       *Limiter
	timeout time.Duration

	// FallbackLocal only.
	local       *localLimiter
	localPolicy []localPolicy
	hold        time.Duration
	// localUntil is the local time (UnixNano) until which requests are
	// decided locally without asking Redis; 0 when Redis last answered.
	localUntil atomic.Int64
}

// init sets c up for l; keys and hold are used only with local.
func (c *checker) init(l *Limiter, timeout time.Duration, local bool, keys int, hold time.Duration) {
	c.l, c.timeout = l, timeout
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
	}
	if local {
		if keys == 0 {
			keys = DefaultLocalKeys
		}
		c.local = newLocalLimiter(keys)
		if l.script != nil { // else every decision has a Policies set
			c.localPolicy = []localPolicy{localPolicyOf(l.limit, l.capacity)}
		}
		c.hold = hold
		if c.hold == 0 {
			c.hold = DefaultLocalHold
		}
	}
}

func newMiddleware(l *Limiter, opts MiddlewareOptions) (*middleware, error) {
	switch {
	case l == nil:
		return nil, fmt.Errorf("%w: nil *Limiter", ErrInvalidOptions)
	case opts.Timeout < 0:
		return nil, fmt.Errorf("%w: negative Timeout %v", ErrInvalidOptions, opts.Timeout)
	case opts.UnavailableRetryAfter < 0:
		return nil, fmt.Errorf("%w: negative UnavailableRetryAfter %v", ErrInvalidOptions, opts.UnavailableRetryAfter)
	case opts.Fallback < FallbackOpen || opts.Fallback > FallbackLocal:
		return nil, fmt.Errorf("%w: %v", ErrInvalidOptions, opts.Fallback)
	case opts.LocalKeys < 0:
		return nil, fmt.Errorf("%w: negative LocalKeys %d", ErrInvalidOptions, opts.LocalKeys)
	case opts.ProblemDetails && opts.OnDenied != nil:
		return nil, fmt.Errorf("%w: ProblemDetails with OnDenied", ErrInvalidOptions)
	case opts.LocalHold < 0:
		return nil, fmt.Errorf("%w: negative LocalHold %v", ErrInvalidOptions, opts.LocalHold)
	case opts.Fallback != FallbackLocal && (opts.LocalKeys != 0 || opts.LocalHold != 0):
		return nil, fmt.Errorf("%w: LocalKeys and LocalHold need Fallback FallbackLocal", ErrInvalidOptions)
	case l.script == nil && opts.PolicyFunc == nil:
		return nil, fmt.Errorf("%w: a Limiter without a Limit needs a PolicyFunc", ErrInvalidOptions)
	}
	keyFunc, err := requestKeyFunc(opts.KeyFunc, opts.TrustedProxies, opts.ClientIPHeader, opts.IPv4PrefixLen, opts.IPv6PrefixLen)
	if err != nil {
		return nil, err
	}
	opts.KeyFunc = keyFunc
	m := &middleware{opts: opts}
	m.init(l, opts.Timeout, opts.Fallback == FallbackLocal, opts.LocalKeys, opts.LocalHold)
	if opts.UnavailableRetryAfter > 0 {
		m.retry = strconv.FormatInt(ceilSeconds(opts.UnavailableRetryAfter), 10)
	}
	if m.opts.OnError == nil {
		m.opts.OnError = func(r *http.Request, err error) {
			slog.Default().ErrorContext(r.Context(), "ratelimit: request not checked", "method", r.Method, "path", r.URL.Path, "err", err)
		}
	}
	name := sfString(opts.PolicyName)
	if opts.PolicyName == "" {
		name = `"default"`
	}
	m.names = []string{name}
	if l.script == nil {
		return m, nil // no Limit of its own: PolicyFunc supplies every set
	}
	capacity := strconv.Itoa(l.capacity)
	// The quota is what may be sent at once; the window is how long it
	// takes to earn it back: the Period for windows (Burst == Rate), Burst
	// emission intervals for GCRA.
	window := time.Duration(float64(l.limit.Period) * float64(l.capacity) / float64(l.limit.Rate))
	m.policy = name + ";q=" + capacity + ";w=" + strconv.FormatInt(max(ceilSeconds(window), 1), 10)
	return m, nil
}

// requestKeyFunc checks the key options shared by the middlewares and
// returns kf, or when it is nil the default: the client IP of ClientIP
// with trusted and header, grouped by IPKey with v4 and v6.
func requestKeyFunc(kf func(*http.Request) (string, error), trustedProxies []netip.Prefix, header ClientIPHeader, v4, v6 int) (func(*http.Request) (string, error), error) {
	switch {
	case v4 < 0 || v4 > 32:
		return nil, fmt.Errorf("%w: IPv4PrefixLen %d is not between 0 and 32", ErrInvalidOptions, v4)
	case v6 < 0 || v6 > 128:
		return nil, fmt.Errorf("%w: IPv6PrefixLen %d is not between 0 and 128", ErrInvalidOptions, v6)
	case header < XForwardedFor || header > Forwarded:
		return nil, fmt.Errorf("%w: %v", ErrInvalidOptions, header)
	}
	trusted := make([]netip.Prefix, len(trustedProxies))
	for i, p := range trustedProxies {
		if !p.IsValid() {
			return nil, fmt.Errorf("%w: invalid trusted proxy prefix %d", ErrInvalidOptions, i)
		}
		if m := p.Masked(); m.Addr().Is4In6() && m.Bits() < 96 {
			// Part IPv4-mapped, part not: no IPv4 prefix says the same.
			return nil, fmt.Errorf("%w: trusted proxy prefix %v mixes IPv4-mapped and IPv6 addresses", ErrInvalidOptions, p)
		}
		trusted[i] = unmapPrefix(p)
	}
	if kf != nil {
		return kf, nil
	}
	return func(r *http.Request) (string, error) {
		ip, err := ClientIP(r, trusted, header)
		if err != nil {
			return "", err
		}
		return IPKey(ip, v4, v6), nil
	}, nil
}

// The canonical forms of the header field names the middleware sets on
// every answer (http.CanonicalHeaderKey("RateLimit-Policy") and of
// "RateLimit"), as Header.Set would store them.
const (
	headerPolicy    = "Ratelimit-Policy"
	headerRateLimit = "Ratelimit"
)

func (m *middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	key, err := m.opts.KeyFunc(r)
	if err == nil && key == "" {
		next.ServeHTTP(w, r)
		return
	}
	var ps *Policies
	if err == nil && m.opts.PolicyFunc != nil {
		ps, err = m.opts.PolicyFunc(r)
	}
	var d Decision
	var one [1]Result // Results of the Limiter's own Limit, kept off the heap
	decided, asked := false, false
	if err == nil {
		d, err = m.decide(r.Context(), key, ps, &one, func(err error) { m.opts.OnError(r, err) })
		decided, asked = err == nil, true
	}
	if !decided {
		if se, ok := refusal(err); ok && !asked {
			refuse(w, se)
			return
		}
		m.opts.OnError(r, err)
		if !Unavailable(err) {
			// A configuration or semantic error, not an outage: no
			// fallback (decide reported it to the observer if it asked).
			refuseError(w)
			return
		}
		// A client that is gone gets no fail-open: it may only have
		// half-closed, and would read what the handler writes.
		open := m.opts.Fallback == FallbackOpen && r.Context().Err() == nil
		if asked && m.l.obs != nil {
			src := scriptcache.SourceFailClosed
			if open {
				src = scriptcache.SourceFailOpen
			}
			m.l.fallback(m.obsName(ps), src, err)
		}
		if !open {
			if m.retry != "" {
				w.Header().Set("Retry-After", m.retry)
			}
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
		return
	}
	h := w.Header()
	// The policy that decides: the one that needs the longest wait on a
	// denial, else the one with the least left.
	top := 0
	for i, res := range d.Results {
		if t := d.Results[top]; !d.Allowed && res.RetryAfter > t.RetryAfter || d.Allowed && res.Remaining < t.Remaining {
			top = i
		}
	}
	retry := max(ceilSeconds(d.RetryAfter), 1)
	if !m.opts.DisableHeaders {
		policy, names := m.policy, m.names
		if ps != nil {
			policy, names = ps.header, ps.quoted
		}
		// t is when quota is available again: for a policy without room
		// that is its RetryAfter (GCRA and sliding-window ResetAfter, the
		// time until the key is back to full, is later), so that the
		// decisive policy's t and Retry-After name the same time.
		item := func(i int) string {
			res := d.Results[i]
			reset := ceilSeconds(res.ResetAfter)
			if !res.Allowed {
				reset = max(ceilSeconds(res.RetryAfter), 1)
			}
			return names[i] + ";r=" + strconv.Itoa(res.Remaining) + ";t=" + strconv.FormatInt(reset, 10)
		}
		value := item(0)
		for i := 1; i < len(d.Results); i++ {
			value += ", " + item(i)
		}
		if len(h[headerPolicy]) == 0 && len(h[headerRateLimit]) == 0 {
			// Set would make the canonical form of each name (an
			// allocation, for these two) and a slice of each value; this
			// is the same, with one slice for both.
			vs := []string{policy, value}
			h[headerPolicy], h[headerRateLimit] = vs[0:1:1], vs[1:2:2]
		} else {
			// An outer middleware wrote its policies: add ours to its
			// list (see addPolicies).
			addPolicies(h, names, policy, value)
		}
		if m.opts.XRateLimitHeaders {
			res := d.Results[top]
			h.Set("X-RateLimit-Limit", strconv.Itoa(res.Limit))
			h.Set("X-RateLimit-Remaining", strconv.Itoa(res.Remaining))
			at := time.Now().Add(res.ResetAfter)
			secs := at.Unix()
			if at.Nanosecond() > 0 {
				secs++
			}
			h.Set("X-RateLimit-Reset", strconv.FormatInt(secs, 10))
		}
	}
	if !d.Allowed {
		h.Set("Retry-After", strconv.FormatInt(retry, 10))
		switch {
		case m.opts.OnDenied != nil:
			res := d.Results[top]
			res.RetryAfter = d.RetryAfter
			m.opts.OnDenied(w, r, res)
		case m.opts.ProblemDetails:
			m.problem(w, ps, d)
		default:
			http.Error(w, "too many requests", http.StatusTooManyRequests)
		}
		return
	}
	next.ServeHTTP(w, r)
}

// decide asks the deny cache, the local limiter while it holds, or Redis
// about one request for key under ps (nil: the Limiter's own Limit). A
// Redis error that the local fallback answers goes to report. An error
// that Unavailable does not count as an outage is never answered by the
// local fallback: it is reported to the observer as refused and returned,
// and the caller must refuse the request.
func (m *checker) decide(parent context.Context, key string, ps *Policies, one *[1]Result, report func(error)) (Decision, error) {
	if ps == nil && m.l.script == nil {
		return Decision{}, ErrNoLimit // a configuration error: never the fallback
	}
	key = boundKey(key, maxKeyLen)
	// A key the deny cache answers needs no context and no timer: this is
	// the path a flood from one client takes.
	now := m.l.now()
	if ps == nil {
		if res, ok := m.l.cachedDenial(key, now); ok {
			one[0] = res
			return Decision{RetryAfter: res.RetryAfter, Results: one[:]}, nil
		}
	} else if d, ok := m.l.cachedDecision(key, ps, now, 1); ok {
		return d, nil
	}
	var probe int64 // the localUntil this request set to probe Redis, or 0
	if m.local != nil {
		if until := m.localUntil.Load(); until != 0 {
			// Redis failed lately. Once LocalHold has passed, one request
			// (the one that moves localUntil on) asks Redis again; the
			// others keep deciding locally instead of each waiting
			// Timeout for a Redis that may still be slow.
			probe = now.Add(m.hold).UnixNano()
			if now.UnixNano() < until || !m.localUntil.CompareAndSwap(until, probe) {
				d := m.decideLocally(key, ps, now, one)
				m.observeLocal(ps, d)
				return d, nil
			}
		}
	}
	// Not the caller's cancellation: net/http cancels a request's context
	// when the client half-closes, and the decision must not be the
	// client's.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), m.timeout)
	var d Decision
	var err error
	if ps == nil {
		var res Result
		res, err = m.l.Allow(ctx, key)
		one[0] = res
		d = Decision{Allowed: res.Allowed, RetryAfter: res.RetryAfter, Results: one[:]}
	} else {
		d, err = m.l.AllowPolicies(ctx, key, 1, ps)
	}
	cancel()
	if err == nil && probe != 0 {
		m.localUntil.CompareAndSwap(probe, 0) // Redis is back
	}
	if err != nil && !Unavailable(err) {
		// Redis answered, or was never asked: no fallback may decide.
		m.l.fallback(m.obsName(ps), scriptcache.SourceFailClosed, err)
		return d, err
	}
	if err != nil && m.local != nil {
		// Redis failed: decide locally, and keep doing so for a while
		// rather than make every request wait Timeout.
		report(err)
		now = m.l.now()
		m.localUntil.Store(now.Add(m.hold).UnixNano())
		d = m.decideLocally(key, ps, now, one)
		if m.l.obs != nil {
			m.l.fallback(m.obsName(ps), scriptcache.SourceLocal, err)
			m.observeLocal(ps, d)
		}
		return d, nil
	}
	return d, err
}

// refuseError answers a request whose check failed with an error that
// Unavailable does not count as an outage: 500, whatever the Fallback.
func refuseError(w http.ResponseWriter) {
	http.Error(w, "rate limit not checked", http.StatusInternalServerError)
}

// obsName is the Event.Name of decisions under ps.
func (m *checker) obsName(ps *Policies) string {
	if ps == nil {
		return m.l.obsName
	}
	return ps.names
}

// observeLocal reports a decision of the local fallback.
func (m *checker) observeLocal(ps *Policies, d Decision) {
	if m.l.obs != nil {
		m.l.observe(m.obsName(ps), d.Allowed, 1, scriptcache.SourceLocal)
	}
}

// decideLocally is the FallbackLocal decision for key under ps at now.
func (m *checker) decideLocally(key string, ps *Policies, now time.Time, one *[1]Result) Decision {
	if ps == nil {
		m.local.allow("0:"+key, now, 1, m.localPolicy, one[:])
		return Decision{Allowed: one[0].Allowed, RetryAfter: one[0].RetryAfter, Results: one[:]}
	}
	// Prefixed with the length of the set's id, so that no (set, key)
	// pair writes another's entry, nor one of the Limiter's own ("0:").
	d := Decision{Results: make([]Result, len(ps.local))}
	d.Allowed = m.local.allow(strconv.Itoa(len(ps.id))+":"+ps.id+key, now, 1, ps.local, d.Results)
	for _, res := range d.Results {
		if !res.Allowed {
			d.RetryAfter = max(d.RetryAfter, res.RetryAfter)
		}
	}
	return d
}

// problemType is the draft's problem type for a request over its quota.
const problemType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// problem writes the RFC 9457 problem details of a denial: the draft's
// quota-exceeded type, with the policies that had no room.
func (m *middleware) problem(w http.ResponseWriter, ps *Policies, d Decision) {
	names := m.names
	if ps != nil {
		names = ps.quoted
	}
	// The quoted names are valid JSON strings too: printable ASCII with
	// '"' and '\\' escaped.
	violated := make([]string, 0, len(d.Results))
	for i, res := range d.Results {
		if !res.Allowed {
			violated = append(violated, names[i])
		}
	}
	writeProblem(w, violated)
}

// sfString quotes s as a structured-field string (RFC 8941): printable
// ASCII, with '"' and '\' escaped; other bytes are dropped.
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e {
			continue
		}
		if c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
	return b.String()
}

// ClientIP returns the address of the client that sent r.
//
// It is the connection's peer (r.RemoteAddr, port stripped) unless that peer
// is in trustedProxies. Then the one header named by header is read, and
// no other:
//
//   - XForwardedFor: the entries of every X-Forwarded-For line, in order,
//     are read from the right, skipping addresses in trustedProxies: the
//     first one outside them is the client.
//   - Forwarded: the same walk over the for= parameter of each element of
//     every Forwarded line (RFC 7239). A node is an IPv4 address or a
//     bracketed IPv6 address, with an optional port, quoted or not.
//   - XRealIP: the address in the last X-Real-IP line.
//
// Entries to the left of the client were written by the client itself and
// may be forged, so they never choose the key. If every entry is a trusted
// proxy, the left-most one is the answer. An entry that names no address (it
// does not parse, is "unknown" or an obfuscated "_name", or is an element
// without for=) stops the walk at the last address that parsed, which is at
// worst the peer: requests are then counted against the proxy, never against
// an address the client picked. A missing or unparsable X-Real-IP also gives
// the peer.
//
// Trusted prefixes written as IPv4-mapped IPv6 (::ffff:10.0.0.0/104) match
// the IPv4 addresses they map. The result is unmapped (::ffff:1.2.3.4 is
// 1.2.3.4) and has no zone.
//
// ClientIP never panics. It returns ErrNoClientIP if RemoteAddr is not an
// IP address (a Unix socket, say), and an error wrapping ErrInvalidOptions
// if header is not one of the constants.
func ClientIP(r *http.Request, trustedProxies []netip.Prefix, header ClientIPHeader) (netip.Addr, error) {
	if header < XForwardedFor || header > Forwarded {
		return netip.Addr{}, fmt.Errorf("%w: %v", ErrInvalidOptions, header)
	}
	peer, ok := parseIP(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, ErrNoClientIP
	}
	if !trusted(peer, trustedProxies) {
		return peer, nil
	}
	switch header {
	case XRealIP:
		if lines := r.Header.Values("X-Real-IP"); len(lines) > 0 {
			if ip, ok := parseIP(lines[len(lines)-1]); ok {
				return ip, nil
			}
		}
		return peer, nil
	case Forwarded:
		var nodes []string
		for _, line := range r.Header.Values("Forwarded") {
			nodes = appendForwardedFor(nodes, line)
		}
		client := peer
		for i := len(nodes) - 1; i >= 0; i-- {
			ip, ok := parseForwardedNode(nodes[i])
			if !ok {
				return client, nil
			}
			client = ip
			if !trusted(ip, trustedProxies) {
				return client, nil
			}
		}
		return client, nil
	}
	client := peer
	xff := r.Header.Values("X-Forwarded-For")
	for i := len(xff) - 1; i >= 0; i-- {
		line := xff[i]
		for line != "" {
			var entry string
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				entry, line = line[j+1:], line[:j]
			} else {
				entry, line = line, ""
			}
			ip, ok := parseIP(entry)
			if !ok {
				return client, nil
			}
			client = ip
			if !trusted(ip, trustedProxies) {
				return client, nil
			}
		}
	}
	return client, nil
}

// parseIP reads an address with or without a port, in brackets or not,
// surrounded by optional spaces.
func parseIP(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	ip, err := netip.ParseAddr(s)
	if err != nil {
		host, _, err2 := net.SplitHostPort(s)
		if err2 != nil {
			host = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
		}
		if ip, err = netip.ParseAddr(host); err != nil {
			return netip.Addr{}, false
		}
	}
	return ip.Unmap().WithZone(""), true
}

// appendForwardedFor appends to dst the for= value of each element of one
// Forwarded header line (RFC 7239: elements separated by commas, pairs by
// semicolons, values tokens or quoted strings), unquoted. An element with no
// for=, more than one, or a syntax error gives "", which names no address.
// Empty elements, which the list syntax allows, are skipped.
func appendForwardedFor(dst []string, line string) []string {
	var (
		node      string
		pairs     int  // pairs seen in this element
		fors      int  // for= pairs seen in this element
		malformed bool // this element has a syntax error
	)
	i := 0
	for {
		for i < len(line) && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		// A pair: token "=" (token / quoted-string).
		j := i
		for j < len(line) && line[j] != '=' && line[j] != ';' && line[j] != ',' && line[j] != '"' {
			j++
		}
		name := strings.TrimRight(line[i:j], " \t")
		if name != "" || (j < len(line) && line[j] != ',' && line[j] != ';') {
			pairs++
			var value string
			if j >= len(line) || line[j] != '=' || name == "" {
				malformed = true
			} else if j++; j < len(line) && line[j] == '"' {
				var b strings.Builder
				closed := false
				for j++; j < len(line); j++ {
					c := line[j]
					if c == '\\' && j+1 < len(line) {
						j++
						b.WriteByte(line[j])
						continue
					}
					if c == '"' {
						closed = true
						j++
						break
					}
					b.WriteByte(c)
				}
				malformed = malformed || !closed
				value = b.String()
			} else {
				k := j
				for j < len(line) && line[j] != ';' && line[j] != ',' {
					j++
				}
				value = strings.TrimRight(line[k:j], " \t")
			}
			if strings.EqualFold(name, "for") {
				fors++
				node = value
			}
			for j < len(line) && (line[j] == ' ' || line[j] == '\t') {
				j++
			}
			if j < len(line) && line[j] != ';' && line[j] != ',' {
				// Text after a value: skip to the next separator.
				malformed = true
				for j < len(line) && line[j] != ';' && line[j] != ',' {
					j++
				}
			}
		}
		if j >= len(line) || line[j] == ',' {
			if pairs > 0 {
				if fors != 1 || malformed {
					node = ""
				}
				dst = append(dst, node)
			}
			node, pairs, fors, malformed = "", 0, 0, false
		}
		if j >= len(line) {
			return dst
		}
		i = j + 1
	}
}

// parseForwardedNode reads a Forwarded for= node: an IPv4 address or an
// IPv6 address in brackets, optionally followed by ":" and a port (digits,
// or an obfuscated "_port"). "unknown" and obfuscated names ("_abc") name no
// address.
func parseForwardedNode(s string) (netip.Addr, bool) {
	host, port := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		host, port = s[1:end], s[end+1:]
		if port != "" && port[0] != ':' {
			return netip.Addr{}, false
		}
		ip, err := netip.ParseAddr(host)
		if err != nil || !ip.Is6() || ip.Zone() != "" || !validNodePort(strings.TrimPrefix(port, ":"), port != "") {
			return netip.Addr{}, false
		}
		return ip.Unmap(), true
	}
	if i := strings.IndexByte(s, ':'); i >= 0 {
		host, port = s[:i], s[i+1:]
		if !validNodePort(port, true) {
			return netip.Addr{}, false
		}
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.Is4() {
		return netip.Addr{}, false
	}
	return ip, true
}

// validNodePort reports whether port is a valid RFC 7239 node-port: 1 to 5
// digits, or "_" and letters, digits, ".", "_", "-". An empty port is valid
// only when there was no ":".
func validNodePort(port string, present bool) bool {
	if !present {
		return port == ""
	}
	if port == "" || len(port) > 64 {
		return false
	}
	if port[0] == '_' {
		for i := 1; i < len(port); i++ {
			c := port[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
				return false
			}
		}
		return true
	}
	if len(port) > 5 {
		return false
	}
	for i := 0; i < len(port); i++ {
		if port[i] < '0' || port[i] > '9' {
			return false
		}
	}
	return true
}

// unmapPrefix turns an IPv4-mapped IPv6 prefix (::ffff:10.0.0.0/104) into
// the IPv4 prefix it covers (10.0.0.0/8), since peers and header addresses
// are compared unmapped. Other prefixes are returned masked.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	p = p.Masked()
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

func trusted(ip netip.Addr, prefixes []netip.Prefix) bool {
	for _, p := range prefixes {
		if p.Addr().Is4In6() {
			p = unmapPrefix(p)
		}
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// IPKey returns the limiter key for ip: the address itself when the prefix
// length covers it all, else its network in CIDR notation
// ("2001:db8:1:2::/64"). v4Bits and v6Bits of 0 mean 32 and 64; values out
// of range are clamped.
func IPKey(ip netip.Addr, v4Bits, v6Bits int) string {
	ip = ip.Unmap().WithZone("")
	bits, full := v6Bits, 128
	if ip.Is4() {
		bits, full = v4Bits, 32
		if bits == 0 {
			bits = 32
		}
	} else if bits == 0 {
		bits = 64
	}
	bits = min(max(bits, 1), full)
	if bits == full || !ip.IsValid() {
		return ip.String()
	}
	p, err := ip.Prefix(bits)
	if err != nil {
		return ip.String()
	}
	return p.String()
}
