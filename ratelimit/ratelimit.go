// Package ratelimit limits how often a key (a client IP, a user, an API
// token) may do something, across every process that shares one Redis server
// or Redis Cluster.
//
// # Algorithms
//
// Each check is one Lua script, one round trip, on the server's clock (TIME
// or key TTLs; the client clock never decides), with O(1) memory per key:
//
//   - FixedWindow: the INCR/PEXPIRE counter. At most Rate requests per
//     Period, counted from the first request of a window. Cheapest, but a
//     client can send Rate requests at the end of one window and Rate more at
//     the start of the next. The counter gets its TTL in the same script that
//     creates it, and a counter found without a TTL (left by an older,
//     non-atomic client) gets one again.
//   - SlidingWindow: two fixed windows, the previous one weighted by how much
//     of it the sliding window still covers. Smooths the boundary burst, but
//     it is an estimate that assumes the previous window's requests were
//     spread evenly: when they all came at its end, fewer than 2*Rate
//     requests (at most 2*Rate-1) can pass within one Period straddling
//     the boundary. Within any aligned window it never passes more than
//     Rate.
//   - GCRA: a token bucket of Burst tokens refilled at Rate per Period, kept
//     as one timestamp. Smooth, and its RetryAfter is exact to the
//     microsecond.
//
// Denied requests do not count against the limit. AllowN weighs a request;
// Reset forgets a key.
//
// # Several limits per decision, and limits per call
//
// AllowPolicies checks a key against a set of named policies (Policies,
// say 10 per second and 1000 per hour, each with its own algorithm) in
// one script call: the request is counted in every policy only when every
// policy has room, so a request refused by the hourly limit costs nothing
// in the per-second one. Each policy's state comes back in a Decision.
// The set comes with each call, so plans and tenants need one Policies
// each (built once, or per call), not a Limiter each; one Limiter's deny
// cache serves them all, keyed by the set's limits so that a denial under
// one plan never answers for another.
//
// # Deny cache
//
// When Redis denies a key until time T, nothing another process does can
// make it allowed before T, so the Limiter answers that key locally until T
// without a round trip. This is what keeps Redis alive when one client
// floods. Local deadlines are computed from the local time taken before the
// request was sent plus the server's retry-after, so they end no later than
// the server's. The cache is on by default and holds at most
// Options.DenyCacheSize keys; it starts no goroutine.
//
// # HTTP middleware
//
// NewMiddleware limits requests per client IP (IPv6 grouped by /64). It
// reads one configured header (X-Forwarded-For by default, X-Real-IP or RFC
// 7239 Forwarded) and only from configured proxies, and answers with the
// RateLimit-Policy and RateLimit header fields of
// draft-ietf-httpapi-ratelimit-headers-11 (every policy of a set, by name,
// with MiddlewareOptions.PolicyFunc) and 429 Too Many Requests with
// Retry-After, optionally with the draft's quota-exceeded problem details. When Redis cannot answer within a bounded wait that the
// client cannot cut short, MiddlewareOptions.Fallback decides: open (the
// default; never for a client that has gone), closed (503), or local: a
// memory-capped in-process limiter per key, so that whoever can slow Redis
// cannot switch limiting off (see FallbackLocal for its accuracy). Only
// an outage reaches the fallback, as Unavailable classifies errors
// (timeouts, failed connections, a server refusing service for a while);
// any other error (a key holding another type of value, a KeyFunc that
// finds no key) gets 500 and is reported, and never switches limiting off.
//
// Checker makes the same decision for other transports; the gRPC
// interceptors of module github.com/sluicekit/sluice/grpc use it.
//
// NewConcurrencyMiddleware limits requests in flight instead: at most N
// per key at once, each holding a permit of a package semaphore Manager
// until its handler returns, with the draft's concurrent-requests quota
// unit in the header fields. Middlewares count apart unless they share a
// Name and a Limit (ConcurrencyOptions.Name).
//
// # Keys
//
// A key is stored as Prefix + "{" + key + "}" + a suffix naming the
// algorithm and the limit (":g:" interval ":" burst for GCRA, ":f:" rate
// ":" window in ms, ":s:" rate ":" window in µs), or for a Policies set
// ":m:" and a hash of its policies and limits, so keys from user input
// stay inside the prefix, each key hashes to one cluster slot, and
// Limiters with different limits never share a counter, whatever their
// prefixes (a deploy that changes a Limit starts its keys afresh).
// Limiter.RedisKey tells the key of one client.
package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/scriptcache"
)

// Errors returned by this package; check them with errors.Is.
var (
	// ErrNilCache means New was given a nil *sluice.Client.
	ErrNilCache = errors.New("ratelimit: nil client")
	// ErrInvalidLimit means Options.Limit is out of range.
	ErrInvalidLimit = errors.New("ratelimit: invalid limit")
	// ErrNoLimit means a call needs the Limiter's own Limit (Allow, a
	// middleware or Check without a Policies set), and the Limiter was
	// made without one, to run Policies sets and counters only.
	ErrNoLimit = errors.New("ratelimit: limiter has no limit of its own")
	// ErrInvalidAlgorithm means Options.Algorithm is not one of the
	// constants.
	ErrInvalidAlgorithm = errors.New("ratelimit: invalid algorithm")
	// ErrInvalidPrefix means Options.Prefix cannot start keys.
	ErrInvalidPrefix = errors.New("ratelimit: invalid prefix")
	// ErrInvalidKey means a key is empty or longer than 1024 bytes.
	ErrInvalidKey = errors.New("ratelimit: invalid key")
	// ErrInvalidCost means AllowN was given a negative n.
	ErrInvalidCost = errors.New("ratelimit: negative cost")
	// ErrCostTooHigh means AllowN was given an n larger than the limit could
	// ever allow at once (Rate for the window algorithms, Burst for GCRA).
	// Such a request would be denied forever, so it is refused without a
	// round trip.
	ErrCostTooHigh = errors.New("ratelimit: cost exceeds the limit")
	// ErrInvalidOptions means an Options field other than Limit,
	// Algorithm and Prefix is out of range, or NewMiddleware was given a
	// nil Limiter or a MiddlewareOptions field out of range.
	ErrInvalidOptions = errors.New("ratelimit: invalid options")
	// ErrUnexpectedReply means a script returned something this package
	// does not understand, such as a key holding another type of value.
	ErrUnexpectedReply = errors.New("ratelimit: unexpected reply from redis")
)

// Bounds that catch unit mistakes (a rate in the billions, a period in
// nanoseconds) before they reach Redis.
const (
	maxRate   = 1_000_000_000
	minPeriod = time.Millisecond
	maxPeriod = 366 * 24 * time.Hour
)

// Limit is a rate: Rate requests per Period, and for GCRA a bucket of Burst.
type Limit struct {
	// Rate is how many requests are allowed per Period. Required, >= 1.
	Rate int
	// Period is the window (FixedWindow, SlidingWindow) or the time the GCRA
	// bucket takes to refill Rate tokens. Required, between 1ms and 366
	// days, and kept as given to the precision of the algorithm's clock,
	// never cut: a whole number of milliseconds for FixedWindow (its
	// window is a Redis TTL), of microseconds for SlidingWindow (it
	// counts on Redis TIME); any for GCRA. Another is refused
	// (ErrInvalidLimit).
	Period time.Duration
	// Burst is the GCRA bucket size: how many requests may arrive at once
	// after a quiet spell. 0 means Rate. The window algorithms allow Rate per
	// window and require Burst to be 0 (or equal to Rate), so that a Burst
	// set for GCRA is never silently ignored.
	Burst int
}

// PerSecond returns a limit of rate requests per second.
func PerSecond(rate int) Limit { return Limit{Rate: rate, Period: time.Second} }

// PerMinute returns a limit of rate requests per minute.
func PerMinute(rate int) Limit { return Limit{Rate: rate, Period: time.Minute} }

// PerHour returns a limit of rate requests per hour.
func PerHour(rate int) Limit { return Limit{Rate: rate, Period: time.Hour} }

// PerDay returns a limit of rate requests per 24 hours (a rolling day
// from the first request with FixedWindow, not a calendar day).
func PerDay(rate int) Limit { return Limit{Rate: rate, Period: 24 * time.Hour} }

// String returns the limit as "RATE/PERIOD", with ", burst N" for a Burst
// other than 0.
func (l Limit) String() string {
	s := strconv.Itoa(l.Rate) + "/" + l.Period.String()
	if l.Burst != 0 {
		s += ", burst " + strconv.Itoa(l.Burst)
	}
	return s
}

// Algorithm selects how a Limiter counts.
type Algorithm int

// GCRA is a token bucket: Burst requests at once, refilled at Rate per
// Period. It is the zero value and the default.
const GCRA Algorithm = 0

// FixedWindow allows Rate requests per window of Period that starts with
// the first request; up to 2*Rate can pass around a window boundary.
const FixedWindow Algorithm = 1

// SlidingWindow allows about Rate requests in any Period, estimating the
// count from the current and the previous window, weighted as if the
// previous window's requests were spread evenly. At most Rate pass in
// one aligned window; when the previous window's requests all came at
// its very end, up to 2*Rate-1 can pass within one Period across the
// boundary (see the package documentation).
const SlidingWindow Algorithm = 2

// String returns the algorithm's name.
func (a Algorithm) String() string {
	switch a {
	case GCRA:
		return "gcra"
	case FixedWindow:
		return "fixed-window"
	case SlidingWindow:
		return "sliding-window"
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}

// DefaultPrefix starts every key of a Limiter whose Options.Prefix is empty.
const DefaultPrefix = "sluice:rl:"

// DefaultDenyCacheSize is the number of denied keys a Limiter remembers
// locally when Options.DenyCacheSize is 0.
const DefaultDenyCacheSize = 10_000

// Options configures New. The zero value of each field means its default;
// only Limit is required.
type Options struct {
	// Algorithm selects the counting method. Default GCRA.
	Algorithm Algorithm
	// Limit is the rate of Allow, AllowN, Wait and of the middlewares and
	// Check without a Policies set. It may be left zero (with Algorithm)
	// for a Limiter that runs only Policies sets (a middleware whose
	// PolicyFunc always returns one, say) and counters: the calls that need
	// it then return ErrNoLimit.
	Limit Limit
	// Prefix starts every key. Default DefaultPrefix ("sluice:rl:"). It
	// must not contain '{' or '}'. Limiters with different Limits may
	// share it: the limit is part of each key (see Keys in the package
	// documentation).
	Prefix string
	// DenyCacheSize caps the number of keys the local deny cache holds.
	// Default DefaultDenyCacheSize (10,000 keys, a few hundred bytes each).
	// When it is full, expired entries are dropped first, then arbitrary
	// ones; dropping an entry only costs a round trip later.
	DenyCacheSize int
	// DisableDenyCache sends every call to Redis.
	DisableDenyCache bool
}

// Limiter checks requests against one Limit. It is safe for concurrent use
// and holds no goroutine, so it needs no Close.
type Limiter struct {
	script   *scriptcache.Script
	multi    *scriptcache.Script // ratelimit_multi
	counters *scriptcache.Script // ratelimit_counters
	reset    *scriptcache.Script // ratelimit_reset
	sc       *scriptcache.Cache
	algo     Algorithm
	limit    Limit
	capacity int    // most cost one call can be allowed: Rate or Burst
	prefix   string // key prefix
	suffix   string // per algorithm, so algorithms never share a key
	args1    []string
	arg0     string // first two script arguments, fixed per limiter
	arg1     string
	unit     time.Duration // of the script's time replies
	radix    int64         // of an allowed reply packed in one integer (see compiled)
	deny     *denyCache    // nil when disabled
	now      func() time.Time
	obs      scriptcache.Observer // nil: nothing reported
	obsName  string               // Event.Name of its own Limit: the prefix
	// afterReply, when not nil, runs after a script's reply is decoded and
	// before a denial is cached: a seam for tests of that window.
	afterReply func(key string, res Result)
}

// Result is the answer to one Allow or AllowN call.
//
// Worked example, FixedWindow with Limit{Rate: 10, Period: time.Minute}: the
// first call of a window returns Allowed true, Limit 10, Remaining 9,
// RetryAfter 0 and ResetAfter 1m (the window ends in a minute). 42 seconds
// and nine calls later the tenth call returns Remaining 0, ResetAfter 18s;
// the eleventh returns Allowed false, Remaining 0, RetryAfter 18s, ResetAfter
// 18s.
type Result struct {
	// Allowed reports whether the request may proceed. A denied request
	// was not counted.
	Allowed bool
	// Limit is the most requests the limiter allows at once: Rate for the
	// window algorithms, Burst for GCRA. With GCRA and Limit{Rate: 10,
	// Period: time.Second, Burst: 20}, Limit is 20.
	Limit int
	// Remaining is how many more requests of cost 1 would be allowed right
	// now, after this call. With GCRA 10/s, burst 20, a fresh key's first
	// call leaves 19; the same call made 100ms after 19 others leaves 1.
	Remaining int
	// RetryAfter is how long to wait before the same request (same cost)
	// could be allowed; 0 when Allowed. With GCRA 10/s, burst 1, a call
	// 30ms after an allowed one is denied with RetryAfter 70ms.
	RetryAfter time.Duration
	// ResetAfter is how long until the key is back to its initial state
	// (Remaining == Limit) if no more requests come. With FixedWindow it is
	// the end of the window; with GCRA 10/s, burst 20, after 5 quick calls
	// it is 500ms.
	ResetAfter time.Duration
}

// New returns a Limiter that runs on sc's Redis.
func New(sc *sluice.Client, opts Options) (*Limiter, error) {
	if sc == nil {
		return nil, ErrNilCache
	}
	own := opts.Limit != Limit{}
	if !own && opts.Algorithm != GCRA {
		return nil, fmt.Errorf("%w: Algorithm %v without a Limit", ErrInvalidOptions, opts.Algorithm)
	}
	var c compiled
	var err error
	if own {
		if c, err = compile(opts.Algorithm, opts.Limit); err != nil {
			return nil, err
		}
	}
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := keyspace.CheckPrefix(prefix); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidPrefix, err)
	}
	if opts.DenyCacheSize < 0 {
		return nil, fmt.Errorf("%w: negative DenyCacheSize %d", ErrInvalidOptions, opts.DenyCacheSize)
	}
	l := &Limiter{
		sc:       sc,
		algo:     opts.Algorithm,
		limit:    opts.Limit,
		prefix:   prefix,
		now:      time.Now,
		capacity: c.capacity,
		arg0:     c.arg0,
		arg1:     c.arg1,
		suffix:   c.suffix + ":" + c.arg0 + ":" + c.arg1,
		unit:     c.unit,
		radix:    c.radix,
		obs:      sc.Observer(),
		obsName:  prefix,
	}
	name := c.script
	if l.multi, err = sc.Script("ratelimit_multi"); err != nil {
		return nil, fmt.Errorf("ratelimit: %w", err)
	}
	if l.counters, err = sc.Script("ratelimit_counters"); err != nil {
		return nil, fmt.Errorf("ratelimit: %w", err)
	}
	if l.reset, err = sc.Script("ratelimit_reset"); err != nil {
		return nil, fmt.Errorf("ratelimit: %w", err)
	}
	if own {
		s, err := sc.Script(name)
		if err != nil {
			return nil, fmt.Errorf("ratelimit: %w", err)
		}
		l.script = s
		l.args1 = []string{l.arg0, l.arg1, "1"}
	}
	if !opts.DisableDenyCache {
		size := opts.DenyCacheSize
		if size == 0 {
			size = DefaultDenyCacheSize
		}
		l.deny = newDenyCache(size)
	}
	return l, nil
}

// compiled is a Limit prepared for one algorithm's scripts.
type compiled struct {
	capacity   int    // most cost one call can be allowed: Rate or Burst
	arg0, arg1 string // the script's first two arguments
	idArg1     string // arg1 as the state key of Policies names it
	script     string // single-limit script
	code       string // algorithm code of ratelimit_multi
	suffix     string // key suffix, so algorithms never share a key (New adds the limit)
	unit       time.Duration
	// radix is the base of an allowed reply that the GCRA and sliding
	// window scripts pack into one integer, remaining * radix + reset,
	// computed as the script computes it; 0 for the fixed window, whose
	// replies are never packed.
	radix int64
}

// compile checks lim for algo and prepares the script arguments.
func compile(algo Algorithm, lim Limit) (compiled, error) {
	var c compiled
	switch {
	case lim.Rate < 1 || lim.Rate > maxRate:
		return c, fmt.Errorf("%w: rate %d is not between 1 and %d", ErrInvalidLimit, lim.Rate, maxRate)
	case lim.Period < minPeriod || lim.Period > maxPeriod:
		return c, fmt.Errorf("%w: period %v is not between %v and %v", ErrInvalidLimit, lim.Period, minPeriod, maxPeriod)
	case lim.Burst < 0 || lim.Burst > maxRate:
		return c, fmt.Errorf("%w: burst %d is not between 0 and %d", ErrInvalidLimit, lim.Burst, maxRate)
	}
	switch algo {
	case FixedWindow, SlidingWindow:
		if lim.Burst != 0 && lim.Burst != lim.Rate {
			return c, fmt.Errorf("%w: burst %d is only meaningful for GCRA", ErrInvalidLimit, lim.Burst)
		}
		c.capacity = lim.Rate
		c.arg0 = strconv.Itoa(lim.Rate)
		if algo == FixedWindow {
			// The window is the counter's TTL, which Redis keeps in
			// milliseconds: a finer Period cannot be kept, and cutting
			// it would change the rate (1.999ms would run as 1ms).
			if lim.Period%time.Millisecond != 0 {
				return c, fmt.Errorf("%w: fixed window period %v is not a whole number of milliseconds, the precision of the TTL that is its window (SlidingWindow and GCRA take microseconds)", ErrInvalidLimit, lim.Period)
			}
			c.arg1 = strconv.FormatInt(lim.Period.Milliseconds(), 10)
			c.idArg1 = c.arg1
			c.script, c.code, c.suffix, c.unit = "ratelimit_fixed", "f", ":f", time.Millisecond
		} else {
			// Windows are counted on Redis TIME, in microseconds.
			if lim.Period%time.Microsecond != 0 {
				return c, fmt.Errorf("%w: sliding window period %v is not a whole number of microseconds, the precision of the Redis TIME it counts on", ErrInvalidLimit, lim.Period)
			}
			c.arg1 = strconv.FormatInt(lim.Period.Microseconds(), 10)
			// The state key of Policies names a whole number of
			// milliseconds as versions that sent milliseconds did, so
			// that they count together (see NewPolicies).
			c.idArg1 = strconv.FormatInt(lim.Period.Milliseconds(), 10)
			if lim.Period%time.Millisecond != 0 {
				c.idArg1 = c.arg1 + "us"
			}
			c.script, c.code, c.suffix, c.unit = "ratelimit_sliding", "s", ":s", time.Microsecond
			c.radix = 2*lim.Period.Microseconds() + 1
		}
	case GCRA:
		burst := lim.Burst
		if burst == 0 {
			burst = lim.Rate
		}
		c.capacity = burst
		// The whole Period, to the nanosecond: the interval may be
		// fractional. (Exact for whole microseconds: the same text as
		// from Period.Microseconds(), which cut finer periods.)
		interval := float64(lim.Period) / float64(time.Microsecond) / float64(lim.Rate)
		if interval*float64(burst) > float64(maxPeriod.Microseconds()) {
			return c, fmt.Errorf("%w: burst %d at %v takes longer than %v to refill", ErrInvalidLimit, burst, lim, maxPeriod)
		}
		// 'f', not 'g': intervals of a second or more would go out in
		// exponent form ("1e+07"), which Redis's Lua reads but some
		// embedded Lua interpreters (miniredis's) do not.
		c.arg0 = strconv.FormatFloat(interval, 'f', -1, 64)
		c.arg1 = strconv.Itoa(burst)
		c.idArg1 = c.arg1
		c.script, c.code, c.suffix, c.unit = "ratelimit_gcra", "g", ":g", time.Microsecond
		// The script's radix: ceil(burst * interval) + 1, with the same
		// double as the interval it reads (the text above reads back as
		// interval). The conversion keeps the product from being fused
		// into anything.
		c.radix = int64(math.Ceil(float64(float64(burst)*interval))) + 1
	default:
		return c, fmt.Errorf("%w: %d", ErrInvalidAlgorithm, int(algo))
	}
	return c, nil
}

// RedisKey returns the Redis key that holds key's state for this Limiter
// (without a Policies set): for an operator's look with redis-cli, or a
// DEL. key is the one Allow takes, which must be a valid key.
func (l *Limiter) RedisKey(key string) string { return keyspace.Key(l.prefix, key, l.suffix) }

// Limit returns the limiter's Limit, with Burst as configured.
func (l *Limiter) Limit() Limit { return l.limit }

// Algorithm returns the limiter's algorithm.
func (l *Limiter) Algorithm() Algorithm { return l.algo }

// Allow reports whether one request for key may proceed, and counts it if
// so. It is AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN reports whether a request of cost n for key may proceed, and counts
// it (as n requests) if so. A denied request is not counted. n == 0 only
// reads the key's state. Errors: ErrInvalidKey, ErrInvalidCost,
// ErrCostTooHigh, or the Redis error (wrapped).
//
// A cost above the limit (Rate for the window algorithms, Burst for GCRA)
// is ErrCostTooHigh, not a denied Result: a denial promises that the same
// request can pass after RetryAfter, and no wait would ever let this one
// pass. Returning an error keeps a caller that retries after RetryAfter
// from looping forever, and costs no round trip.
func (l *Limiter) AllowN(ctx context.Context, key string, n int) (Result, error) {
	if err := keyspace.CheckName(key); err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	switch {
	case l.script == nil:
		return Result{}, ErrNoLimit
	case n < 0:
		return Result{}, fmt.Errorf("%w: %d", ErrInvalidCost, n)
	case n > l.capacity:
		return Result{}, fmt.Errorf("%w: %d > %d", ErrCostTooHigh, n, l.capacity)
	}
	// Taken before the request is sent, so a deadline built on it is never
	// later than the server's.
	start := l.now()
	var gen uint64
	if n > 0 && l.deny != nil {
		if res, ok := l.cachedDenialOf(key, start, n); ok {
			if l.obs != nil {
				l.observe(l.obsName, false, n, scriptcache.SourceDenyCache)
			}
			return res, nil
		}
		// Read before the request is sent: a Reset of key from now on
		// keeps this call's denial out of the cache.
		gen = l.deny.generation(key)
	}
	args := l.args1
	if n != 1 {
		args = []string{l.arg0, l.arg1, strconv.Itoa(n)}
	}
	v, err := l.decode(l.script.Exec(ctx, []string{l.RedisKey(key)}, args))
	if err != nil {
		return Result{}, err
	}
	res := Result{Allowed: v[0] == 1, Limit: l.capacity}
	if l.algo == FixedWindow {
		// {allowed, count, ttl ms}: the window ends at the TTL, for every
		// cost.
		res.Remaining = max(l.capacity-int(v[1]), 0)
		res.ResetAfter = time.Duration(v[2]) * time.Millisecond
		if !res.Allowed {
			res.RetryAfter = res.ResetAfter
		}
	} else {
		res.Remaining = int(v[1])
		res.RetryAfter = time.Duration(v[2]) * l.unit
		res.ResetAfter = time.Duration(v[3]) * l.unit
	}
	if l.afterReply != nil {
		l.afterReply(key, res)
	}
	if !res.Allowed && l.deny != nil && res.RetryAfter > 0 && l.denialCoversAll(res, n) {
		l.deny.add(key, start, res, gen)
	}
	if l.obs != nil && n > 0 {
		l.observe(l.obsName, res.Allowed, n, scriptcache.SourceRedis)
	}
	return res, nil
}

// decode returns a single-limit script's reply as the array {allowed,
// count or remaining, ttl or retry, reset} (the fixed window's has no
// fourth value). The GCRA and sliding window scripts answer an allowed
// call with one integer, remaining * l.radix + reset, when that is exact in
// a double: the server then builds no array.
func (l *Limiter) decode(r scriptcache.Reply) ([4]int64, error) {
	var v [4]int64
	if err := r.Error(); err != nil {
		return v, fmt.Errorf("ratelimit: %w", err)
	}
	if l.radix > 0 {
		if packed, err := r.AsInt64(); err == nil {
			if packed < 0 {
				return v, fmt.Errorf("%w: %d", ErrUnexpectedReply, packed)
			}
			return [4]int64{1, packed / l.radix, 0, packed % l.radix}, nil
		}
	}
	reply, err := r.ToArray()
	if err != nil {
		return v, fmt.Errorf("%w: %w", ErrUnexpectedReply, err)
	}
	if reply.Len() != 3 && reply.Len() != 4 {
		return v, fmt.Errorf("%w: %d values", ErrUnexpectedReply, reply.Len())
	}
	for i := range reply.Len() {
		if v[i], err = reply.At(i).AsInt64(); err != nil {
			return v, fmt.Errorf("%w: %w", ErrUnexpectedReply, err)
		}
	}
	return v, nil
}

// observe reports a decision of cost n under the limit called name. Call
// it only when l.obs is set.
func (l *Limiter) observe(name string, allowed bool, n int, src scriptcache.Source) {
	l.obs.Observe(scriptcache.Event{Kind: scriptcache.EventDecision, Primitive: scriptcache.PrimitiveRateLimit, Name: name, Allowed: allowed, Weight: int64(n), Source: src})
}

// fallback reports that src answered for Redis, which failed with err.
func (l *Limiter) fallback(name string, src scriptcache.Source, err error) {
	if l.obs != nil {
		l.obs.Observe(scriptcache.Event{Kind: scriptcache.EventFallback, Primitive: scriptcache.PrimitiveRateLimit, Name: name, Source: src, Err: err})
	}
}

// cachedDenial returns the local deny cache's answer for a request of cost
// >= 1 for key at now, if it has one.
func (l *Limiter) cachedDenial(key string, now time.Time) (Result, bool) {
	if l.deny == nil {
		return Result{}, false
	}
	res, ok := l.deny.lookup(key, now, l.capacity)
	if ok && l.obs != nil {
		l.observe(l.obsName, false, 1, scriptcache.SourceDenyCache)
	}
	return res, ok
}

// cachedDenialOf returns the deny cache's answer for a request of cost n
// >= 1 for key at now, with that cost's figures, if the entry tells them.
// An entry is the denial of cost 1 (see denialCoversAll): every cost is
// denied until it ends, and a larger cost waits longer. A fixed window
// admits any cost at its end; GCRA admits cost n (n-1) emission intervals
// after cost 1; a sliding window's wait for n depends on counts the entry
// does not keep, so such a call asks Redis.
func (l *Limiter) cachedDenialOf(key string, now time.Time, n int) (Result, bool) {
	if n > 1 && l.algo == SlidingWindow {
		return Result{}, false
	}
	res, ok := l.deny.lookup(key, now, l.capacity)
	if ok && n > 1 && l.algo == GCRA {
		more := time.Duration(n-1) * l.limit.Period / time.Duration(l.limit.Rate)
		res.RetryAfter += more
		res.ResetAfter = max(res.ResetAfter, res.RetryAfter)
	}
	return res, ok
}

// denialCoversAll reports whether a denial of cost n means that every cost
// >= 1 stays denied for res.RetryAfter. For n == 1 that is what RetryAfter
// says (a larger cost needs longer). A fixed window with nothing left stays
// full until it ends, whatever the cost asked.
func (l *Limiter) denialCoversAll(res Result, n int) bool {
	return n == 1 || (l.algo == FixedWindow && res.Remaining == 0)
}

// Reset forgets key: its next request starts from a full limit. With sets,
// it also forgets the key's state under each set, and its local denials
// under them. Only this Limiter's deny cache hears of it: other Limiters
// with the same prefix, in this process or others, may keep denying the
// key until the time Redis last gave them. Share one Limiter per prefix in
// a process.
//
// In this process, a denial of key that Redis decided before the DEL but
// whose reply arrives after it is not cached: the local entry is dropped
// after the DEL, and a generation counter keeps calls that started before
// that from caching their denials afterwards. The local entry is
// dropped even when the DEL fails, since it may have run.
func (l *Limiter) Reset(ctx context.Context, key string, sets ...*Policies) error {
	if err := keyspace.CheckName(key); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	var keys, ids []string
	if l.script != nil {
		keys, ids = []string{l.RedisKey(key)}, []string{""}
	} else if len(sets) == 0 {
		return ErrNoLimit
	}
	for _, ps := range sets {
		if ps == nil {
			return fmt.Errorf("%w: nil *Policies", ErrInvalidOptions)
		}
		keys = append(keys, keyspace.Key(l.prefix, key, ps.suffix))
		ids = append(ids, ps.id)
	}
	// One slot: every key carries key's hash tag.
	err := l.reset.Exec(ctx, keys, nil).Error()
	if l.deny != nil {
		l.deny.remove(key, ids...)
	}
	if err != nil {
		return fmt.Errorf("ratelimit: reset: %w", err)
	}
	return nil
}

// ceilSeconds rounds d up to whole seconds, as HTTP headers need them.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
