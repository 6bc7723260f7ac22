package chaos

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// The rate-limit routes of a node: middlewares with each Fallback, each
// ClientIPHeader, TrustedProxies, a KeyFunc by header (keys over 1024
// bytes among them, and one that refuses), a PolicyFunc, the optional
// header fields, and a concurrency middleware keyed per client. Every
// client (an IP, an API key) is used by one goroutine at a time, so the
// exact model (exact.go) says what each answer must be; the headers are
// checked against it.

// trusted proxies of the routes; clients and forged addresses lie
// outside them.
var trustedProxies = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8:ffff::/48")}

// rateRoute is one rate-limit middleware and what the oracle needs of it.
type rateRoute struct {
	name     string // its PolicyName
	spec     limiterSpec
	prefix   string
	lim      *ratelimit.Limiter
	fallback ratelimit.Fallback
	header   ratelimit.ClientIPHeader
	byIP     bool // the default KeyFunc: the client IP; else X-Api-Key
	plans    bool // a PolicyFunc: X-Plan "gold" gets goldPolicies
	xrl      bool // XRateLimitHeaders
	problem  bool // ProblemDetails
	conc     bool // stacked over the per-client concurrency middleware
	h        http.Handler

	mu   sync.Mutex
	errs []time.Time // OnError calls (its own, and the stacked concurrency middleware's)
	// timeouts are the OnError calls for an outage (outageErr), which
	// needs no fault injected: a loaded machine, an exhausted pool.
	timeouts []time.Time
}

// told records an error the route's OnError was told.
func (r *rateRoute) told(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, time.Now())
	if outageErr(err) {
		r.timeouts = append(r.timeouts, time.Now())
	}
}

// outageErr reports whether err is an outage (as Unavailable counts them)
// and not the reply of a server that ran the script on a counter holding
// a string: a timeout of a loaded machine, an exhausted pool, need no
// injected fault.
func outageErr(err error) bool {
	if !ratelimit.Unavailable(err) {
		return false
	}
	for _, s := range []string{"WRONGTYPE", "not an integer", "arithmetic", "script"} {
		if strings.Contains(err.Error(), s) {
			return false
		}
	}
	return true
}

// timedOut reports whether a timeout was told within [from, to]. It takes
// the slice by pointer: its header is written under mu, so it is read
// under mu too.
func timedOut(mu *sync.Mutex, ts *[]time.Time, from, to time.Time) bool {
	mu.Lock()
	defer mu.Unlock()
	for _, t := range *ts {
		if !t.Before(from) && !t.After(to) {
			return true
		}
	}
	return false
}

// limitNode is what the limits workload adds to a node: its routes, a
// Checker, the gRPC server, built on a script cache of their own (the
// node's client, with the metrics observer, or Config.RouteClient's).
type limitNode struct {
	sc      *scriptcache.Cache
	routes  []*rateRoute
	mgr     *semaphore.Manager
	checker *ratelimit.Checker
	chkSpec limiterSpec
	chkLim  *ratelimit.Limiter // the Checker's
	grpc    *grpcNode
	envoy   *envoyNode
	idents  atomic.Int64
	closers []func()
}

const (
	concRouteLimit = 2
	concRouteName  = "inflight"
	goldName       = "gold"
)

// goldSpecs are the policies of the "gold" plan of the routes with a
// PolicyFunc.
func goldSpecs(lease time.Duration) []limiterSpec {
	period := lease / 2
	return []limiterSpec{
		{ratelimit.GCRA, ratelimit.Limit{Rate: 6, Period: period, Burst: 3}},
		{ratelimit.FixedWindow, ratelimit.Limit{Rate: 4, Period: period}},
	}
}

var goldNames = []string{"g-burst", "g-window"}

func (w *world) newLimitNode(t testing.TB, n *node) {
	ln := &limitNode{}
	n.limits = ln
	client := n.sc.Client()
	if w.cfg.RouteClient != nil {
		sc, closeClient, err := w.cfg.RouteClient(context.Background(), w.nodeAddrs(n), w.cl != nil)
		if err != nil {
			t.Fatal(err)
		}
		ln.closers = append(ln.closers, closeClient)
		client = sc.Client()
	}
	var err error
	if ln.sc, err = scriptcache.NewFrom(context.Background(), client, scriptcache.WithObserver(w.metrics)); err != nil {
		t.Fatal(err)
	}
	ln.mgr, err = semaphore.NewManager(ln.sc, semaphore.Options{WatchdogLease: w.cfg.Lease})
	if err != nil {
		t.Fatal(err)
	}
	period := w.cfg.Lease / 2
	var gold []ratelimit.Policy
	for i, s := range goldSpecs(w.cfg.Lease) {
		gold = append(gold, ratelimit.Policy{Name: goldNames[i], Algorithm: s.algo, Limit: s.limit})
	}
	goldSet, err := ratelimit.NewPolicies(gold...)
	if err != nil {
		t.Fatal(err)
	}
	apikeyMode := []ratelimit.Fallback{ratelimit.FallbackLocal, ratelimit.FallbackOpen, ratelimit.FallbackClosed}[(n.i%3+3)%3]
	ln.routes = []*rateRoute{
		{name: "r-open", spec: limiterSpec{ratelimit.FixedWindow, ratelimit.Limit{Rate: 4, Period: period}}, fallback: ratelimit.FallbackOpen,
			header: ratelimit.XForwardedFor, byIP: true, xrl: true, conc: true},
		{name: "r-closed", spec: limiterSpec{ratelimit.SlidingWindow, ratelimit.Limit{Rate: 5, Period: period}}, fallback: ratelimit.FallbackClosed,
			header: ratelimit.XRealIP, byIP: true},
		{name: "r-local", spec: limiterSpec{ratelimit.GCRA, ratelimit.Limit{Rate: 5, Period: period, Burst: 3}}, fallback: ratelimit.FallbackLocal,
			header: ratelimit.Forwarded, byIP: true, problem: true},
		// A burst of two and a half periods' refill: RateLimit-Policy's w
		// (3) is not the Period.
		{name: "r-apikey", spec: limiterSpec{ratelimit.GCRA, ratelimit.Limit{Rate: 2, Period: period, Burst: 5}}, fallback: apikeyMode, plans: true},
	}
	for _, r := range ln.routes {
		r.prefix = "sluice:rl:" + r.name + ":"
		l, err := ratelimit.New(ln.sc, ratelimit.Options{Algorithm: r.spec.algo, Limit: r.spec.limit, Prefix: r.prefix})
		if err != nil {
			t.Fatal(err)
		}
		r.lim = l
		opts := ratelimit.MiddlewareOptions{PolicyName: r.name, Fallback: r.fallback, TrustedProxies: trustedProxies,
			ClientIPHeader: r.header, XRateLimitHeaders: r.xrl, ProblemDetails: r.problem,
			OnError: func(_ *http.Request, err error) { r.told(err) }}
		if r.fallback == ratelimit.FallbackClosed {
			opts.UnavailableRetryAfter = 2 * time.Second
		}
		if !r.byIP {
			opts.KeyFunc = apiKey
		}
		if r.plans {
			opts.PolicyFunc = func(req *http.Request) (*ratelimit.Policies, error) {
				if req.Header.Get("X-Plan") == goldName {
					return goldSet, nil
				}
				return nil, nil
			}
		}
		mw, err := ratelimit.NewMiddleware(l, opts)
		if err != nil {
			t.Fatal(err)
		}
		var inner http.Handler = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
		if r.conc {
			conc, err := ratelimit.NewConcurrencyMiddleware(ln.mgr, ratelimit.ConcurrencyOptions{Limit: concRouteLimit, PolicyName: concRouteName,
				TrustedProxies: trustedProxies, ClientIPHeader: r.header, OnError: func(_ *http.Request, err error) { r.told(err) }})
			if err != nil {
				t.Fatal(err)
			}
			inner = conc(inner)
		}
		r.h = mw(inner)
	}
	ln.chkSpec = limiterSpec{ratelimit.SlidingWindow, ratelimit.Limit{Rate: 6, Period: period}}
	cl, err := ratelimit.New(ln.sc, ratelimit.Options{Algorithm: ln.chkSpec.algo, Limit: ln.chkSpec.limit, Prefix: "sluice:rl:checker:"})
	if err != nil {
		t.Fatal(err)
	}
	ln.chkLim = cl
	if ln.checker, err = ratelimit.NewChecker(cl, ratelimit.CheckerOptions{}); err != nil {
		t.Fatal(err)
	}
	w.newGRPC(t, n)
	w.newEnvoy(t, n)
}

// nodeAddrs are the addresses node n's clients connect to.
func (w *world) nodeAddrs(n *node) []string {
	if w.cl != nil {
		return w.cl.Addrs()
	}
	return []string{n.proxy.Addr()}
}

// close closes what the limits workload built for the node (after its
// Lockers and Managers, before its client).
func (ln *limitNode) close() {
	if ln == nil {
		return
	}
	ln.envoy.close()
	ln.grpc.close()
	ln.mgr.Close()
	for _, f := range ln.closers {
		f()
	}
}

// errKeyStore is the error of the API-key route's KeyFunc for a request
// with "X-Refuse: outage": its key store timed out, an outage.
var errKeyStore = fmt.Errorf("chaos: key store: %w", context.DeadlineExceeded)

// apiKey is the KeyFunc of the API-key route: the X-Api-Key header (none:
// an unlimited request), or an error for X-Refuse.
func apiKey(r *http.Request) (string, error) {
	switch r.Header.Get("X-Refuse") {
	case "semantic":
		return "", errors.New("chaos: no key for this request")
	case "outage":
		return "", errKeyStore
	}
	return r.Header.Get("X-Api-Key"), nil
}

// boundKey is the key the middlewares and Checker count a client's key
// under, as MiddlewareOptions.KeyFunc documents it.
func boundKey(key string) string {
	if len(key) <= keyspace.MaxNameLen && !strings.HasPrefix(key, "~#") {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "~#" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// client is one client of a route: an IPv4 or IPv6 address (a /64 whose
// host bits change per request), or an API key.
type client struct {
	v4, v6 bool
	ip     netip.Addr // v4: the address; v6: the /64's first address
	apikey string
	key    string // the limiter key the middleware must use
}

// newClient draws a client no other goroutine uses: addresses in
// 100.64.0.0/10 and 2001:db8:N:C::/64, keys with the node and a count
// (a third of them over 1024 bytes, sharing their first 1100 or more
// bytes, so that only a digest of the whole key tells them apart).
func (ln *limitNode) newClient(n *node, rng *rand.Rand, byIP bool) client {
	c := ln.idents.Add(1)
	if !byIP {
		k := fmt.Sprintf("ak-%d-%d", n.i, c)
		if rng.IntN(3) == 0 {
			k = strings.Repeat("L", 1100+rng.IntN(900)) + k
		}
		return client{apikey: k, key: boundKey(k)}
	}
	if rng.IntN(2) == 0 {
		ip := netip.AddrFrom4([4]byte{100, byte(64 + n.i*16 + int(c>>16)&15), byte(c >> 8), byte(c)})
		return client{v4: true, ip: ip, key: ip.String()}
	}
	var b [16]byte
	copy(b[:], netip.MustParseAddr("2001:db8::").AsSlice())
	b[4], b[5] = 0, byte(n.i)
	b[6], b[7] = byte(c>>8), byte(c)
	ip := netip.AddrFrom16(b)
	return client{v6: true, ip: ip, key: netip.PrefixFrom(ip, 64).String()}
}

// addr is the client's address for one request: a v6 client's host bits
// are new each time, the /64 stays.
func (c client) addr(rng *rand.Rand) netip.Addr {
	if !c.v6 {
		return c.ip
	}
	b := c.ip.As16()
	for i := 8; i < 16; i++ {
		b[i] = byte(rng.IntN(256))
	}
	return netip.AddrFrom16(b)
}

// forged is an address a client writes into a header to pass for
// another: never a client's, never a proxy's.
func forged(rng *rand.Rand) netip.Addr {
	if rng.IntN(2) == 0 {
		return netip.AddrFrom4([4]byte{203, 0, 113, byte(rng.IntN(256))})
	}
	return netip.MustParseAddr(fmt.Sprintf("2001:db8:fff0::%x", rng.IntN(65536)))
}

func proxyAddr(rng *rand.Rand) netip.Addr {
	if rng.IntN(2) == 0 {
		return netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + rng.IntN(254))})
	}
	return netip.MustParseAddr(fmt.Sprintf("2001:db8:ffff::%x", 1+rng.IntN(65535)))
}

func hostPort(ip netip.Addr, rng *rand.Rand) string {
	return netip.AddrPortFrom(ip, uint16(1024+rng.IntN(60000))).String()
}

// forwardedNode is ip as an RFC 7239 node, with a port now and then.
func forwardedNode(ip netip.Addr, rng *rand.Rand) string {
	s := ip.String()
	if ip.Is6() {
		s = "[" + s + "]"
	}
	if rng.IntN(2) == 0 {
		s += ":" + strconv.Itoa(1+rng.IntN(65535))
	}
	if ip.Is6() || rng.IntN(2) == 0 {
		return `"` + s + `"`
	}
	return s
}

// request builds a request of client c to route r: through a trusted
// proxy that writes the route's header (after whatever the client forged
// into it, and with the other headers forged), or straight from the
// client with forged headers of every kind.
func (r *rateRoute) request(ctx context.Context, c client, rng *rand.Rand) *http.Request {
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	if !r.byIP {
		req.RemoteAddr = hostPort(forged(rng), rng)
		if c.apikey != "" {
			req.Header.Set("X-Api-Key", c.apikey)
		}
		return req
	}
	ip := c.addr(rng)
	forge := func() {
		req.Header.Add("X-Forwarded-For", forged(rng).String())
		req.Header.Set("X-Real-IP", forged(rng).String())
		req.Header.Add("Forwarded", "for="+forwardedNode(forged(rng), rng))
	}
	if rng.IntN(3) == 0 {
		// Straight from the client: every header is forged.
		req.RemoteAddr = hostPort(ip, rng)
		forge()
		return req
	}
	req.RemoteAddr = hostPort(proxyAddr(rng), rng)
	hops := rng.IntN(2) // further trusted proxies between the client and the last
	switch r.header {
	case ratelimit.XForwardedFor:
		req.Header.Set("X-Real-IP", forged(rng).String())
		line := ""
		if rng.IntN(2) == 0 {
			line = forged(rng).String() + ", "
		}
		line += ip.String()
		for range hops {
			line += ", " + proxyAddr(rng).String()
		}
		if rng.IntN(2) == 0 {
			// The client's forged line first, the proxy's own after it.
			req.Header.Add("X-Forwarded-For", forged(rng).String())
		}
		req.Header.Add("X-Forwarded-For", line)
	case ratelimit.XRealIP:
		req.Header.Add("X-Forwarded-For", forged(rng).String())
		if rng.IntN(2) == 0 {
			req.Header.Add("X-Real-IP", forged(rng).String()) // the last line is read
		}
		req.Header.Add("X-Real-IP", ip.String())
	case ratelimit.Forwarded:
		req.Header.Set("X-Forwarded-For", forged(rng).String())
		line := ""
		if rng.IntN(2) == 0 {
			line = "for=" + forwardedNode(forged(rng), rng) + ";proto=http, "
		}
		line += "for=" + forwardedNode(ip, rng) + ";proto=https"
		for range hops {
			line += ", for=" + forwardedNode(proxyAddr(rng), rng)
		}
		req.Header.Add("Forwarded", line)
	}
	return req
}

// errNear reports whether an OnError of r came near [from, to]: its
// Local fallback may have decided then (for LocalHold after each).
func (r *rateRoute) errNear(from, to time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.errs {
		if !e.After(to) && !e.Add(localSpan).Before(from) {
			return true
		}
	}
	return false
}

// routeWorker sends sequences of requests, one client at a time, to node
// n's rate-limit routes, and checks each answer.
func (w *world) routeWorker(ctx context.Context, n *node, rng *rand.Rand) {
	ln := n.limits
	period := w.cfg.Lease / 2
	for ctx.Err() == nil && !n.closed.Load() {
		r := ln.routes[rng.IntN(len(ln.routes))]
		// While the node is cut off, a burst at the Local route: its
		// bucket must refuse what passes its capacity.
		now := time.Now()
		burst := w.outage(n.i, now, now)
		if burst {
			r = ln.routes[2]
		}
		c := ln.newClient(n, rng, r.byIP)
		plan := ""
		if r.plans && rng.IntN(2) == 0 {
			plan = goldName
		}
		if plan == "" && rng.IntN(10) == 0 {
			w.routeSemantic(ctx, n, r, c, rng)
			continue
		}
		if !r.byIP && rng.IntN(10) == 0 {
			w.routeNoKey(ctx, n, r, rng)
			continue
		}
		k := &exactKey{key: c.key, born: time.Now(), what: "route " + r.name}
		if plan == goldName {
			for _, s := range goldSpecs(w.cfg.Lease) {
				k.models = append(k.models, newModel(s))
			}
		} else {
			k.models = []*algoModel{newModel(r.spec)}
		}
		local := &localCount{}
		for range 4 + rng.IntN(10) {
			if ctx.Err() != nil || n.closed.Load() {
				break
			}
			req := r.request(ctx, c, rng)
			if plan != "" {
				req.Header.Set("X-Plan", plan)
			}
			rec := httptest.NewRecorder()
			w.count("route." + r.name)
			call := time.Now()
			r.h.ServeHTTP(rec, req)
			ret := time.Now()
			if clientGone(ctx) {
				break
			}
			w.judgeRoute(n, r, k, local, call, ret, rec)
			if !burst {
				sleep(ctx, pause(rng, period))
			}
		}
		if burst {
			sleep(ctx, period/4) // one burst, not a spin for the whole outage
		}
	}
}

// clientGone reports whether the context of the requests a route was
// just serving has ended (the run's end): the middleware then gives the
// request no fail-open, as it documents for a client that is gone ("it
// may only have half-closed, and would read what the handler writes"),
// so its 503 judges nothing (seen: a route of Fallback open that answered
// 503 to a request called 16.101 s into a run of 16 s).
func clientGone(ctx context.Context) bool { return ctx.Err() != nil }

// localCount counts one client's requests that a Local route allowed
// during an outage of its node.
type localCount struct{ allowed []time.Time }

// judgeRoute checks one answer of route r to client k.
func (w *world) judgeRoute(n *node, r *rateRoute, k *exactKey, local *localCount, call, ret time.Time, rec *httptest.ResponseRecorder) {
	h := rec.Result().Header
	_, decided := h["Ratelimit"]
	where := fmt.Sprintf("route %s (Fallback %v) for %s, called %s", r.name, r.fallback, short(k.key), w.hist.since(call))
	if n.closed.Load() {
		return
	}
	out := w.outage(n.i, call, ret)
	switch code := rec.Code; {
	case code == http.StatusInternalServerError:
		w.hist.violation("%s: 500 (%s), with no semantic error: only an outage was possible, and Fallback %v decides those",
			where, strings.TrimSpace(rec.Body.String()), r.fallback)
		k.forget()
		return
	case code == http.StatusServiceUnavailable:
		if r.fallback != ratelimit.FallbackClosed {
			w.hist.violation("%s: 503 under Fallback %v", where, r.fallback)
		} else if got := h.Get("Retry-After"); got != "2" {
			w.hist.violation("%s: 503 with Retry-After %q, UnavailableRetryAfter 2s", where, got)
		}
		k.forget()
		return
	case code == http.StatusOK && !decided:
		if r.fallback != ratelimit.FallbackOpen {
			w.hist.violation("%s: served without a decision (no RateLimit field) under Fallback %v", where, r.fallback)
		}
		k.forget()
		return
	case code != http.StatusOK && code != http.StatusTooManyRequests:
		w.hist.violation("%s: status %d", where, code)
		k.forget()
		return
	}
	allowed := rec.Code == http.StatusOK
	if r.conc && !allowed && strings.Contains(h.Get("Ratelimit"), `"`+concRouteName+`";r=0`) {
		// Refused for concurrency: with one request of the client in
		// flight, only permits a fault left behind (given back late, or
		// counted on a Redis that did not answer) explain it.
		if !w.hist.unavailableNear(call, ret, n.i) {
			w.hist.violation("%s: refused for concurrency (RateLimit %q) with one request of the client in flight and no fault near", where, h.Get("Ratelimit"))
		}
		k.forget()
		return
	}
	if out {
		// Redis cannot answer in an outage of the node: the deny cache
		// refuses, or the fallback decides.
		switch {
		case r.fallback == ratelimit.FallbackClosed && allowed:
			w.hist.violation("%s: served during an outage of its node under Fallback closed", where)
		case r.fallback == ratelimit.FallbackOpen && allowed:
			w.hist.violation("%s: served with a decision (RateLimit field) during an outage of its node under Fallback open", where)
		case r.fallback == ratelimit.FallbackLocal && allowed:
			local.allowed = append(local.allowed, ret)
			w.checkLocalBound(where, k, local)
		}
	}
	// The concurrency middleware's fallback serves without its policy: only
	// after an error it told (an exhausted pool needs no injected fault).
	ms := w.checkHeaders(where, r, k, h, rec, allowed, !w.hist.unavailableNear(call, ret, n.i) && !r.errNear(call, ret))
	if r.fallback == ratelimit.FallbackLocal && (out || w.metrics.localWithin(r.obsName(k), call, ret)) {
		k.forget() // maybe decided locally: the model is Redis's
		return
	}
	if !k.known() {
		return
	}
	// The figures of the RateLimit field, per policy: Remaining exact,
	// ResetAfter only in seconds.
	results := make([]ratelimit.Result, len(k.models))
	for i, m := range ms {
		if i < len(results) {
			results[i] = ratelimit.Result{Allowed: allowed, Limit: k.models[i].capacity(), Remaining: m.r}
		}
	}
	w.judgeCoarse(k, call, ret, allowed, results, ms, h, "route "+r.name)
}

// short names a key in a report: a long one by its start and length.
func short(k string) string {
	if len(k) > 60 {
		return fmt.Sprintf("%s...(%d bytes)", k[:20], len(k))
	}
	return k
}

// checkLocalBound: FallbackLocal's bucket per key (one per policy of a
// set) passes at most its capacity at once and Rate per Period after.
func (w *world) checkLocalBound(where string, k *exactKey, local *localCount) {
	span := local.allowed[len(local.allowed)-1].Sub(local.allowed[0])
	bound, spec := -1, k.models[0].spec
	for _, m := range k.models {
		b := m.capacity() + int(float64(m.spec.limit.Rate)*float64(span)/float64(m.spec.limit.Period)) + 1
		if bound < 0 || b < bound {
			bound, spec = b, m.spec
		}
	}
	if len(local.allowed) > bound {
		w.hist.violation("%s: %d requests passed in %v of an outage under Fallback local, whose bucket (%v, capacity %d) passes at most %d",
			where, len(local.allowed), span.Round(time.Millisecond), spec.limit, newModel(spec).capacity(), bound)
		local.allowed = nil
	}
}

// outage reports whether [call, ret] lies within a blackhole of node's
// network (after it began, before it ended): no Redis answer can reach
// the node then.
func (w *world) outage(node int, call, ret time.Time) bool {
	w.hist.mu.Lock()
	defer w.hist.mu.Unlock()
	ends := map[time.Time]time.Time{}
	for _, f := range w.hist.faults {
		if f.node != node || f.what != "blackhole" && f.what != "partition" {
			continue
		}
		end := f.to.Add(-w.cfg.Lease)
		if e, ok := ends[f.from]; !ok || end.Before(e) {
			ends[f.from] = end
		}
	}
	for from, end := range ends {
		if call.After(from.Add(20*time.Millisecond)) && ret.Before(end) {
			return true
		}
	}
	return false
}

// routeSemantic stages a semantic error: the client's counter holds a
// string, which every Fallback must answer with 500, never with itself,
// unless the route told OnError of an outage (Redis did not answer): a
// fault near is no excuse, a reply is a reply.
func (w *world) routeSemantic(ctx context.Context, n *node, r *rateRoute, c client, rng *rand.Rand) {
	rkey := r.lim.RedisKey(c.key)
	setAt := time.Now()
	if !w.setString(rkey) {
		return
	}
	defer w.delKey(rkey)
	rec := httptest.NewRecorder()
	w.count("route.semantic")
	call := time.Now()
	r.h.ServeHTTP(rec, r.request(ctx, c, rng))
	ret := time.Now()
	if clientGone(ctx) {
		return
	}
	// A Local route still deciding locally after an earlier outage does
	// not ask Redis, and never sees the string.
	local := r.fallback == ratelimit.FallbackLocal && w.metrics.localWithin(r.prefix, call, ret)
	if rec.Code != http.StatusInternalServerError && !n.closed.Load() && !timedOut(&r.mu, &r.timeouts, call, ret) && !w.wipedSince(setAt, ret) && !local {
		w.hist.violation("route %s (Fallback %v): %d for a client whose counter holds a string (called %s): a semantic error is a 500, never the fallback",
			r.name, r.fallback, rec.Code, w.hist.since(call))
	}
}

// routeNoKey sends a request without a key (served unlimited) or one
// whose KeyFunc refuses: a semantic refusal is a 500, an outage the
// Fallback's (Open serves, Closed and Local answer 503).
func (w *world) routeNoKey(ctx context.Context, n *node, r *rateRoute, rng *rand.Rand) {
	req := r.request(ctx, client{}, rng)
	refuse := []string{"", "semantic", "outage"}[rng.IntN(3)]
	if refuse != "" {
		req.Header.Set("X-Refuse", refuse)
	}
	rec := httptest.NewRecorder()
	w.count("route.nokey")
	r.h.ServeHTTP(rec, req)
	if clientGone(ctx) {
		return
	}
	want := http.StatusOK
	switch {
	case refuse == "semantic":
		want = http.StatusInternalServerError
	case refuse == "outage" && r.fallback != ratelimit.FallbackOpen:
		want = http.StatusServiceUnavailable
	}
	_, fields := rec.Result().Header["Ratelimit"]
	if rec.Code != want || fields {
		w.hist.violation("route %s (Fallback %v): a request with X-Refuse %q got %d (RateLimit field %v), want %d without one",
			r.name, r.fallback, refuse, rec.Code, fields, want)
	}
}

// setString writes a string over key, as a careless operator might.
func (w *world) setString(key string) bool {
	srv, err := w.owner(key)
	if err != nil {
		return false
	}
	_, err = srv.Do("SET", key, "operator", "PX", strconv.FormatInt(w.cfg.Lease.Milliseconds(), 10))
	return err == nil
}

func (w *world) delKey(key string) {
	if srv, err := w.owner(key); err == nil {
		_, _ = srv.Do("DEL", key)
	}
}

// startLimits starts node n's limits workload: two workers of exact
// sequences on the Limiters, one on AllowCounters, three on the rate-limit
// routes, one on the gRPC server and the Checker and one on the Envoy
// services (envoy.go), each with a stream drawn from the run's
// seed and the node (the other goroutines' streams stay as they were).
func (w *world) startLimits(ctx context.Context, wg *sync.WaitGroup, n *node) {
	rng := rand.New(rand.NewPCG(w.cfg.Seed, 0x11a175+uint64(n.i)))
	exact, r1, r2, g, r3, exact2, env := rng.Uint64(), rng.Uint64(), rng.Uint64(), rng.Uint64(), rng.Uint64(), rng.Uint64(), rng.Uint64()
	// They start once every node has loaded its scripts and settled.
	start := func(f func()) { wg.Go(func() { sleep(ctx, w.cfg.Lease/8); f() }) }
	start(func() { w.exactWorker(ctx, n, 0, rand.New(rand.NewPCG(exact, 0xe8ac7)), false) })
	start(func() { w.routeWorker(ctx, n, rand.New(rand.NewPCG(r1, 0x70de))) })
	start(func() { w.routeWorker(ctx, n, rand.New(rand.NewPCG(r2, 0x70df))) })
	start(func() { w.routeWorker(ctx, n, rand.New(rand.NewPCG(r3, 0x70e0))) })
	start(func() { w.exactWorker(ctx, n, 1, rand.New(rand.NewPCG(exact2, 0xe8ac8)), false) })
	start(func() { w.grpcWorker(ctx, n, rand.New(rand.NewPCG(g, 0x6a9c))) })
	start(func() { w.envoyWorker(ctx, n.i, rand.New(rand.NewPCG(env, 0xe4701))) })
	ctr := rng.Uint64()
	start(func() { w.exactWorker(ctx, n, 2, rand.New(rand.NewPCG(ctr, 0xe8ac9)), true) })
}

// localSpan is how long after an OnError a Local fallback may still
// decide locally: LocalHold, then the probe that asks Redis again waits
// up to Timeout while the others stay local, and a margin.
const localSpan = ratelimit.DefaultLocalHold + ratelimit.DefaultTimeout + 100*time.Millisecond

// obsName is the Event.Name of r's decisions for k: the Limiter's prefix,
// or the gold plan's policy names.
func (r *rateRoute) obsName(k *exactKey) string {
	if len(k.models) > 1 {
		return strings.Join(goldNames, ",")
	}
	return r.prefix
}
