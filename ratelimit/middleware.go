package ratelimit

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// ErrNoClientIP means the client address of a request could not be parsed.
var ErrNoClientIP = errors.New("ratelimit: no client ip")

// DefaultTimeout bounds the wait for Redis per request when
// MiddlewareOptions.Timeout is 0. It is long enough for a loaded server and
// short enough that a dead one does not hold requests.
const DefaultTimeout = 200 * time.Millisecond

// MiddlewareOptions configures Middleware. The zero value of each field
// means its default.
type MiddlewareOptions struct {
	// KeyFunc returns the limiter key of a request. An empty key with a nil
	// error lets the request through unlimited (for health checks, say); an
	// error is handled like a Redis error (OnError, then FailClosed).
	// Default: the client IP grouped by IPKey with TrustedProxies and the
	// prefix lengths below.
	KeyFunc func(r *http.Request) (string, error)
	// TrustedProxies are the peers whose X-Forwarded-For and X-Real-IP
	// headers are believed. Default none: the key is the connection's
	// address and those headers are ignored.
	TrustedProxies []netip.Prefix
	// IPv4PrefixLen groups IPv4 clients by network. Default 32 (one key per
	// address).
	IPv4PrefixLen int
	// IPv6PrefixLen groups IPv6 clients by network. Default 64: one host
	// usually holds a whole /64 and could otherwise pick a new address per
	// request.
	IPv6PrefixLen int
	// Timeout bounds the wait for Redis. Default DefaultTimeout (200ms).
	Timeout time.Duration
	// FailClosed rejects requests with 503 Service Unavailable when Redis
	// cannot answer. Default false: such requests pass unlimited, so a
	// Redis outage does not take the service down with it.
	FailClosed bool
	// OnError is told about every error: Redis unreachable, timeouts, key
	// errors. Default: slog.Default() at level Error.
	OnError func(r *http.Request, err error)
	// OnDenied writes the response to a denied request. The rate-limit
	// headers, including Retry-After, are already set. Default: status 429
	// with a one-line text body.
	OnDenied func(w http.ResponseWriter, r *http.Request, res Result)
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

// Middleware returns net/http middleware that limits requests with l, one
// key per client IP by default (see MiddlewareOptions.KeyFunc).
//
// Every limited response carries the header fields of
// draft-ietf-httpapi-ratelimit-headers-10:
//
//	RateLimit-Policy: "default";q=100;w=60
//	RateLimit: "default";r=42;t=17
//
// q is Result.Limit, w the time to earn q back in seconds (the Period,
// or Burst emission intervals for GCRA), rounded up; r is
// Result.Remaining and t Result.ResetAfter in whole seconds, rounded up. A
// denied request gets 429 Too Many Requests, Retry-After in whole seconds
// (rounded up, at least 1) and a short text body, unless OnDenied writes
// something else.
func Middleware(l *Limiter, opts MiddlewareOptions) func(http.Handler) http.Handler {
	m := newMiddleware(l, opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m.serve(next, w, r)
		})
	}
}

type middleware struct {
	l       *Limiter
	opts    MiddlewareOptions
	policy  string // RateLimit-Policy value
	name    string // quoted policy name
	limit   string // X-RateLimit-Limit value
	timeout time.Duration
}

func newMiddleware(l *Limiter, opts MiddlewareOptions) *middleware {
	if l == nil {
		// A programming error, caught when the handler chain is built.
		panic("ratelimit: Middleware called with a nil *Limiter")
	}
	m := &middleware{l: l, opts: opts, timeout: opts.Timeout}
	if m.timeout <= 0 {
		m.timeout = DefaultTimeout
	}
	if m.opts.KeyFunc == nil {
		trusted, v4, v6 := opts.TrustedProxies, opts.IPv4PrefixLen, opts.IPv6PrefixLen
		m.opts.KeyFunc = func(r *http.Request) (string, error) {
			ip, err := ClientIP(r, trusted)
			if err != nil {
				return "", err
			}
			return IPKey(ip, v4, v6), nil
		}
	}
	if m.opts.OnError == nil {
		m.opts.OnError = func(r *http.Request, err error) {
			slog.Default().ErrorContext(r.Context(), "ratelimit: request not checked", "method", r.Method, "path", r.URL.Path, "err", err)
		}
	}
	if m.opts.OnDenied == nil {
		m.opts.OnDenied = denied
	}
	name := sfString(opts.PolicyName)
	if opts.PolicyName == "" {
		name = `"default"`
	}
	m.name = name
	capacity := strconv.Itoa(l.capacity)
	m.limit = capacity
	// The quota is what may be sent at once; the window is how long it
	// takes to earn it back: the Period for windows (Burst == Rate), Burst
	// emission intervals for GCRA.
	window := time.Duration(float64(l.limit.Period) * float64(l.capacity) / float64(l.limit.Rate))
	m.policy = name + ";q=" + capacity + ";w=" + strconv.FormatInt(max(ceilSeconds(window), 1), 10)
	return m
}

func (m *middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	key, err := m.opts.KeyFunc(r)
	if err == nil && key == "" {
		next.ServeHTTP(w, r)
		return
	}
	var res Result
	if err == nil {
		// A key the deny cache answers needs no context and no timer: this
		// is the path a flood from one client takes.
		var ok bool
		if res, ok = m.l.cachedDenial(key, m.l.now()); !ok {
			ctx, cancel := context.WithTimeout(r.Context(), m.timeout)
			res, err = m.l.Allow(ctx, key)
			cancel()
		}
	}
	if err != nil {
		m.opts.OnError(r, err)
		if m.opts.FailClosed {
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
		return
	}
	h := w.Header()
	if !m.opts.DisableHeaders {
		reset := ceilSeconds(res.ResetAfter)
		h.Set("RateLimit-Policy", m.policy)
		h.Set("RateLimit", m.name+";r="+strconv.Itoa(res.Remaining)+";t="+strconv.FormatInt(reset, 10))
		if m.opts.XRateLimitHeaders {
			h.Set("X-RateLimit-Limit", m.limit)
			h.Set("X-RateLimit-Remaining", strconv.Itoa(res.Remaining))
			at := time.Now().Add(res.ResetAfter)
			secs := at.Unix()
			if at.Nanosecond() > 0 {
				secs++
			}
			h.Set("X-RateLimit-Reset", strconv.FormatInt(secs, 10))
		}
	}
	if !res.Allowed {
		h.Set("Retry-After", strconv.FormatInt(max(ceilSeconds(res.RetryAfter), 1), 10))
		m.opts.OnDenied(w, r, res)
		return
	}
	next.ServeHTTP(w, r)
}

func denied(w http.ResponseWriter, _ *http.Request, _ Result) {
	http.Error(w, "too many requests", http.StatusTooManyRequests)
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
// is in trustedProxies. Then the X-Forwarded-For entries (all such header
// lines, in order) are read from the right, skipping addresses in
// trustedProxies: the first one outside them is the client. Entries to its
// left were written by the client itself and may be forged, so they never
// choose the key. If every entry is a trusted proxy, the left-most one is
// the answer; an entry that does not parse stops the walk at the last good
// address. Without X-Forwarded-For, a trusted peer's X-Real-IP is used. The
// result is unmapped (::ffff:1.2.3.4 is 1.2.3.4) and has no zone.
//
// ClientIP never panics; it returns ErrNoClientIP if RemoteAddr is not an
// IP address (a Unix socket, say).
func ClientIP(r *http.Request, trustedProxies []netip.Prefix) (netip.Addr, error) {
	peer, ok := parseIP(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, ErrNoClientIP
	}
	if !trusted(peer, trustedProxies) {
		return peer, nil
	}
	client := peer
	if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
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
	if ip, ok := parseIP(r.Header.Get("X-Real-IP")); ok {
		return ip, nil
	}
	return peer, nil
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

func trusted(ip netip.Addr, prefixes []netip.Prefix) bool {
	for _, p := range prefixes {
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
