package main

import (
	"context"
	"crypto/sha1"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/scriptcache"
)

// The HTTP load test of issue 14: a net/http server on loopback with
// ratelimit.NewMiddleware in front of a trivial handler, against the same
// handler without it, under 64 keep-alive clients that speak for thousands
// of client IPs. The server trusts X-Forwarded-For from loopback, as it
// would from its proxy, and the load generator sets it per simulated client.
//
// How the figures are taken:
//   - latency is the client's: from sending a request to having read the
//     whole response, over keep-alive connections; the added latency is
//     the middleware's median-round p50 (p99) minus the bare handler's.
//     A difference of quantiles, not a quantile of differences.
//   - the Redis round trip is a PING through rueidis, sent by 64 goroutines
//     at the HTTP clients' pace, in the same interleaved rounds; so is a
//     direct Limiter.Allow for the same client keys, the limiter's part of
//     the added latency.
//   - requests decided by Redis are counted in the middleware's own
//     rueidis client: a wrapper counts every EVALSHA and EVAL it sends
//     (one per Redis decision; a NOSCRIPT reload would count twice). The
//     rest were decided in the process, by the deny cache. OnError counts
//     failed Redis calls, which FallbackOpen would have let through.

const (
	httpClients   = 64   // concurrent keep-alive clients
	httpIPv4      = 4096 // simulated client addresses
	httpIPv6      = 4096 // simulated client /64 networks
	httpFlooders  = 4    // clients far over the limit
	httpFloodEach = 8    // one request in this many comes from a flooder
	httpRate      = 10   // per client IP and second (GCRA, burst 10)
)

// httpRun is one implementation's median round in the HTTP section.
type httpRun struct {
	Impl        string        `json:"impl"`
	Ops         int64         `json:"requests"`
	Errors      int64         `json:"errors"`
	OpsPerSec   float64       `json:"requests_per_sec"`
	P50         time.Duration `json:"p50_ns"`
	P99         time.Duration `json:"p99_ns"`
	RoundsOpsPS []float64     `json:"rounds_requests_per_sec"`
	RoundsP50   []float64     `json:"rounds_p50_ns"`
	Allowed     float64       `json:"allowed_share,omitempty"`    // 200s of all requests
	ByRedis     float64       `json:"decided_by_redis,omitempty"` // EVALSHA sent per request
	RedisErrors int64         `json:"redis_errors,omitempty"`     // OnError calls in the median round
	Err         string        `json:"error,omitempty"`
}

// httpLoad is the HTTP section's result.
type httpLoad struct {
	Name     string        `json:"name"`
	Title    string        `json:"title"`
	Runs     []httpRun     `json:"runs"`
	AddedP50 time.Duration `json:"added_p50_ns"`
	AddedP99 time.Duration `json:"added_p99_ns"`
	RTT      time.Duration `json:"redis_rtt_p50_ns"`
	// ScriptRTT is the p50 of a one-line script's EVALSHA in the same
	// conditions: the round trip a script-based limiter cannot avoid.
	ScriptRTT time.Duration `json:"redis_script_rtt_p50_ns"`
	MetScript bool          `json:"target_met_script_rtt"` // AddedP50 <= ScriptRTT + 50µs
	// LimitRTT is the p50 of a bare EVALSHA of the middleware's own script
	// (ratelimit_gcra) on the same client IPs' keys, through rueidis: what
	// the decision costs with no library around it.
	LimitRTT time.Duration `json:"redis_gcra_rtt_p50_ns"`
	MetLimit bool          `json:"target_met_gcra_rtt"` // AddedP50 <= LimitRTT + 50µs
	// OwnP50 is the middleware's p50 minus that of a handler making the
	// same Allow call itself: the middleware's own work.
	OwnP50 time.Duration `json:"middleware_own_p50_ns"`
	Met    bool          `json:"target_met"` // AddedP50 <= RTT + 50µs
}

// httpTarget is one server under load, with what it counts.
type httpTarget struct {
	name      string
	url       string
	scripts   *atomic.Int64 // EVALSHA sent; nil for the bare handler
	errs      *atomic.Int64 // OnError calls; nil for the bare handler
	limiter   *ratelimit.Limiter
	inlineURL string // the same limiter called from the handler, see allowInHandler
	close     func()
}

// httpPeers open peer libraries' HTTP middlewares, each in front of
// okHandler with the same rate per client address; filled by the peer files
// (-tags peers).
var httpPeers []func(ctx context.Context, s *server, ns string) (*httpTarget, error)

// countingClient counts the scripts a rueidis client sends.
type countingClient struct {
	rueidis.Client
	scripts atomic.Int64
}

func (c *countingClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if cs := cmd.Commands(); len(cs) > 0 && (cs[0] == "EVALSHA" || cs[0] == "EVAL") {
		c.scripts.Add(1)
	}
	return c.Client.Do(ctx, cmd)
}

var okBody = []byte("ok\n")

func okHandler(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(okBody) }

var loopbackProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// openMiddlewareServer starts the handler behind the middleware, on its own
// rueidis client, as one more program would.
func openMiddlewareServer(ctx context.Context, s *server, ns string) (*httpTarget, error) {
	c, err := s.rueidis()
	if err != nil {
		return nil, err
	}
	cc := &countingClient{Client: c}
	sc, err := sluice.New(ctx, cc)
	if err != nil {
		c.Close()
		return nil, err
	}
	l, err := ratelimit.New(sc, ratelimit.Options{
		Algorithm: ratelimit.GCRA, Limit: ratelimit.PerSecond(httpRate), Prefix: ns,
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	t := &httpTarget{name: "sluice middleware", limiter: l, scripts: &cc.scripts, errs: new(atomic.Int64)}
	mw, err := ratelimit.NewMiddleware(l, ratelimit.MiddlewareOptions{
		TrustedProxies: loopbackProxies,
		ClientIPHeader: ratelimit.XForwardedFor,
		OnError:        func(*http.Request, error) { t.errs.Add(1) },
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(okHandler)))
	inline := httptest.NewServer(allowInHandler(l))
	t.url, t.inlineURL = srv.URL, inline.URL
	t.close = func() { srv.Close(); inline.Close(); c.Close() }
	return t, nil
}

// allowInHandler is the least a handler can do to limit by client IP
// itself: the key the middleware would use, one Limiter.Allow on the
// request's context, 200 or a bare 429. Set against the middleware, it
// tells the middleware's own work (its bounded context, the deny-cache
// lookup, the header fields) from the cost of waiting for Redis inside a
// handler at all.
func allowInHandler(l *ratelimit.Limiter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ip, err := ratelimit.ClientIP(r, loopbackProxies, ratelimit.XForwardedFor)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		res, err := l.Allow(r.Context(), ratelimit.IPKey(ip, 32, 64))
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if !res.Allowed {
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		okHandler(w, r)
	})
}

// clientIPs are the simulated clients' X-Forwarded-For values, IPv4
// addresses and IPv6 addresses in distinct /64s interleaved, then the
// flooders.
func clientIPs() (polite, flooders [][]string) {
	for i := range max(httpIPv4, httpIPv6) {
		if i < httpIPv4 {
			polite = append(polite, []string{fmt.Sprintf("10.%d.%d.7", i>>8, i&0xff)})
		}
		if i < httpIPv6 {
			polite = append(polite, []string{fmt.Sprintf("2001:db8:1:%x::%x", i, i+1)})
		}
	}
	flooders = [][]string{{"198.51.100.66"}, {"2001:db8:bad::1"}, {"198.51.100.67"}, {"2001:db8:bad:1::9"}}
	return polite, flooders[:httpFlooders]
}

// clientLoops are the 64 clients of one round. Client g's request i comes
// from a flooder every httpFloodEach requests and from a polite address
// otherwise, walking the address list so that each polite address stays
// far below httpRate; do sends it for the address at index ip of the
// combined list (polite first). With pace 0 each client sends its next
// request as soon as it has the last answer (a closed loop: the machine's
// saturation throughput); otherwise it sends one every pace, skipping
// slots it missed, so that latency is measured below saturation. The
// latency is from sending to having the whole answer.
func clientLoops(pace time.Duration, nPolite, nFlood int, do func(ctx context.Context, ip int, r *recorder) error) []loop {
	loops := make([]loop, httpClients)
	for g := range loops {
		loops[g] = func(ctx context.Context, deadline time.Time, r *recorder) {
			// Clients start spread over one pace, not all at once.
			next := time.Now().Add(pace * time.Duration(g) / httpClients)
			for i := 0; i < maxOpsPerGoroutine; i++ {
				if pace > 0 {
					if d := time.Until(next); d > 0 {
						time.Sleep(d)
					}
					if next = next.Add(pace); next.Before(time.Now()) {
						next = time.Now() // a missed slot is skipped, not made up
					}
				}
				ip := (i*httpClients + g) % nPolite
				if i%httpFloodEach == g%httpFloodEach {
					ip = nPolite + (g+i)%nFlood
				}
				t0 := time.Now()
				if !t0.Before(deadline) {
					return
				}
				err := do(ctx, ip, r)
				r.done(time.Since(t0), err)
				if err != nil && ctx.Err() != nil {
					return
				}
			}
		}
	}
	return loops
}

// httpLoops sends GET requests to url over hc, X-Forwarded-For set to the
// simulated client's address. Marks count the 200s.
func httpLoops(hc *http.Client, url string, pace time.Duration) []loop {
	polite, flooders := clientIPs()
	ips := slices.Concat(polite, flooders)
	return clientLoops(pace, len(polite), len(flooders), func(ctx context.Context, ip int, r *recorder) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		req.Header["X-Forwarded-For"] = ips[ip]
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch {
		case err != nil:
			return err
		case resp.StatusCode == http.StatusOK:
			r.marks++
		case resp.StatusCode != http.StatusTooManyRequests:
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
}

// allowLoopsFor calls l.Allow directly, for the keys the middleware would
// derive from the same addresses: the limiter's share of a request's
// latency, without HTTP. Marks count the allowed calls.
func allowLoopsFor(l *ratelimit.Limiter, pace time.Duration) []loop {
	keys, nPolite, nFlood := clientKeys("")
	return clientLoops(pace, nPolite, nFlood, func(ctx context.Context, ip int, r *recorder) error {
		res, err := l.Allow(ctx, keys[ip])
		if res.Allowed {
			r.marks++
		}
		return err
	})
}

// pingLoops sends PING through rueidis, as many at once and as often as
// the HTTP clients send requests: the Redis round trip in the same
// conditions.
func pingLoops(c rueidis.Client, pace time.Duration) []loop {
	return clientLoops(pace, 1, 1, func(ctx context.Context, _ int, _ *recorder) error {
		return c.Do(ctx, c.B().Ping().Build()).Error()
	})
}

// gcraLoops sends EVALSHA sha (the ratelimit_gcra script) through rueidis
// for the client IPs' keys under prefix, with the middleware's rate, at the
// HTTP clients' concurrency and pace: the limiter's script with nothing
// around it (no deny cache, no NOSCRIPT handling, no result type).
func gcraLoops(c rueidis.Client, sha, prefix string, pace time.Duration) []loop {
	keys, nPolite, nFlood := clientKeys(prefix)
	interval := strconv.FormatInt(time.Second.Microseconds()/httpRate, 10)
	burst := strconv.Itoa(httpRate)
	return clientLoops(pace, nPolite, nFlood, func(ctx context.Context, ip int, _ *recorder) error {
		return c.Do(ctx, c.B().Evalsha().Sha1(sha).Numkeys(1).Key(keys[ip]).Arg(interval, burst, "1").Build()).Error()
	})
}

// clientKeys returns the limiter keys of clientIPs' addresses under
// prefix, the polite ones first, and how many of each kind there are.
func clientKeys(prefix string) (keys []string, nPolite, nFlood int) {
	polite, flooders := clientIPs()
	for _, ip := range append(polite, flooders...) {
		keys = append(keys, prefix+ratelimit.IPKey(netip.MustParseAddr(ip[0]), 32, 64))
	}
	return keys, len(polite), len(flooders)
}

// oneLineScript is the cheapest script: its EVALSHA is the round trip
// every script call pays, whatever the script does.
const oneLineScript = "return 1"

// oneLine is oneLineScript's SHA1.
var oneLine = fmt.Sprintf("%x", sha1.Sum([]byte(oneLineScript)))

// scriptLoops sends EVALSHA sha (no keys) through rueidis at the HTTP
// clients' concurrency and pace, like pingLoops.
func scriptLoops(c rueidis.Client, sha string, pace time.Duration) []loop {
	return clientLoops(pace, 1, 1, func(ctx context.Context, _ int, _ *recorder) error {
		return c.Do(ctx, c.B().Evalsha().Sha1(sha).Numkeys(0).Build()).Error()
	})
}

// runHTTPLoad measures the bare handler, the middleware and the Redis round
// trip in interleaved rounds and reports each one's median round.
func runHTTPLoad(ctx context.Context, b *bench, name string, pace time.Duration) *httpLoad {
	load := "as fast as they get answers"
	if pace > 0 {
		load = fmt.Sprintf("each one request every %s (%.0f req/s in all)", pace, float64(httpClients)/pace.Seconds())
	}
	res := &httpLoad{Name: name, Title: fmt.Sprintf("%s: %d keep-alive clients %s, for %d IPv4 addresses and %d IPv6 /64s "+
		"(1 request in %d from %d flooders), GCRA %d/s per client IP, X-Forwarded-For from a trusted loopback proxy",
		name, httpClients, load, httpIPv4, httpIPv6, httpFloodEach, httpFlooders, httpRate)}
	bare := httptest.NewServer(http.HandlerFunc(okHandler))
	defer bare.Close()
	mw, err := openMiddlewareServer(ctx, b.srv, b.ns+"http:")
	if err != nil {
		res.Runs = append(res.Runs, httpRun{Impl: "sluice middleware", Err: err.Error()})
		return res
	}
	defer mw.close()
	ping, err := b.srv.rueidis()
	if err != nil {
		res.Runs = append(res.Runs, httpRun{Impl: "redis PING", Err: err.Error()})
		return res
	}
	defer ping.Close()

	// The limiter's script, loaded as the library loads it.
	cache, err := sluice.New(ctx, ping)
	var gcra *scriptcache.Script
	if err == nil {
		gcra, err = cache.Script("ratelimit_gcra")
	}
	if err != nil {
		res.Runs = append(res.Runs, httpRun{Impl: "redis EVALSHA GCRA", Err: err.Error()})
		return res
	}
	transport := &http.Transport{MaxIdleConnsPerHost: httpClients, MaxConnsPerHost: httpClients, DisableCompression: true}
	defer transport.CloseIdleConnections()
	hc := &http.Client{Transport: transport, Timeout: 10 * time.Second}
	type entry struct {
		run      httpRun
		loops    func() []loop
		target   *httpTarget
		samples  []sample
		scripts  []int64
		errCount []int64
	}
	entries := []*entry{
		{run: httpRun{Impl: "bare handler"}, loops: func() []loop { return httpLoops(hc, bare.URL, pace) }},
		{run: httpRun{Impl: mw.name}, loops: func() []loop { return httpLoops(hc, mw.url, pace) }, target: mw},
		{run: httpRun{Impl: "redis PING (rueidis)"}, loops: func() []loop { return pingLoops(ping, pace) }},
		{run: httpRun{Impl: "sluice Allow, no HTTP"}, loops: func() []loop { return allowLoopsFor(mw.limiter, pace) }},
		{run: httpRun{Impl: "handler calling Allow itself"}, loops: func() []loop { return httpLoops(hc, mw.inlineURL, pace) }},
		{run: httpRun{Impl: "redis EVALSHA 'return 1' (rueidis)"}, loops: func() []loop { return scriptLoops(ping, oneLine, pace) }},
		{run: httpRun{Impl: "redis EVALSHA GCRA, same keys"}, loops: func() []loop { return gcraLoops(ping, gcra.SHA1(), b.ns+"http-raw:", pace) }},
	}
	// Peer middlewares (-tags peers with -peers) come last, so that the
	// rows above keep their places; one that fails to open is listed after
	// them.
	var failed []httpRun
	defer func() { res.Runs = append(res.Runs, failed...) }()
	for _, open := range httpPeers {
		if !b.peers {
			break
		}
		pt, err := open(ctx, b.srv, b.ns+"http-peer:")
		if err != nil {
			failed = append(failed, httpRun{Impl: "peer middleware", Err: err.Error()})
			continue
		}
		defer pt.close()
		entries = append(entries, &entry{run: httpRun{Impl: pt.name}, loops: func() []loop { return httpLoops(hc, pt.url, pace) }})
	}
	if err := ping.Do(ctx, ping.B().ScriptLoad().Script(oneLineScript).Build()).Error(); err != nil {
		res.Runs = append(res.Runs, httpRun{Impl: "redis EVALSHA", Err: err.Error()})
		return res
	}
	if b.warmup > 0 {
		for _, e := range entries {
			b.prog.show(name, e.run.Impl, "warm-up")
			measure(ctx, b.warmup, e.loops(), b.srv.pids)
		}
	}
	for r := range b.rounds {
		for k := range entries {
			e := entries[(k+r)%len(entries)]
			if ctx.Err() != nil {
				break
			}
			b.prog.show(name, e.run.Impl, fmt.Sprintf("round %d/%d", r+1, b.rounds))
			var s0, e0 int64
			if e.target != nil {
				s0, e0 = e.target.scripts.Load(), e.target.errs.Load()
			}
			s := measure(ctx, b.duration, e.loops(), b.srv.pids)
			e.samples = append(e.samples, s)
			if e.target != nil {
				e.scripts = append(e.scripts, e.target.scripts.Load()-s0)
				e.errCount = append(e.errCount, e.target.errs.Load()-e0)
			}
		}
	}
	for _, e := range entries {
		if len(e.samples) == 0 {
			e.run.Err = "not measured"
			res.Runs = append(res.Runs, e.run)
			continue
		}
		for _, s := range e.samples {
			e.run.RoundsOpsPS = append(e.run.RoundsOpsPS, s.opsPerSec())
			e.run.RoundsP50 = append(e.run.RoundsP50, float64(s.lat.quantile(0.5)))
		}
		m := median(e.samples, byP50)
		i := 0
		for j := range e.samples {
			if &e.samples[j] == m {
				i = j
			}
		}
		e.run.Ops, e.run.Errors, e.run.OpsPerSec = m.ops, m.errs, m.opsPerSec()
		e.run.P50, e.run.P99 = m.lat.quantile(0.5), m.lat.quantile(0.99)
		if m.errs > 0 && m.err != nil {
			e.run.Err = m.err.Error()
		}
		if e.target != nil && m.ops+m.errs > 0 {
			total := float64(m.ops + m.errs)
			e.run.Allowed = float64(m.marks) / total
			e.run.ByRedis = float64(e.scripts[i]) / total
			e.run.RedisErrors = e.errCount[i]
		}
		res.Runs = append(res.Runs, e.run)
	}
	if len(res.Runs) == len(entries) && res.Runs[0].Ops > 0 && res.Runs[1].Ops > 0 && res.Runs[2].Ops > 0 && res.Runs[4].Ops > 0 {
		res.AddedP50 = res.Runs[1].P50 - res.Runs[0].P50
		res.AddedP99 = res.Runs[1].P99 - res.Runs[0].P99
		res.RTT = res.Runs[2].P50
		res.OwnP50 = res.Runs[1].P50 - res.Runs[4].P50
		res.Met = res.AddedP50 <= res.RTT+50*time.Microsecond
		if res.Runs[5].Ops > 0 {
			res.ScriptRTT = res.Runs[5].P50
			res.MetScript = res.AddedP50 <= res.ScriptRTT+50*time.Microsecond
		}
		if res.Runs[6].Ops > 0 {
			res.LimitRTT = res.Runs[6].P50
			res.MetLimit = res.AddedP50 <= res.LimitRTT+50*time.Microsecond
		}
	}
	return res
}

// spread is the range of a median's rounds as a share of the median:
// (max-min)/median.
func spread(xs []float64, mid float64) string {
	if len(xs) < 2 || mid == 0 {
		return "-"
	}
	return fmt.Sprintf("±%.0f%%", (slices.Max(xs)-slices.Min(xs))/2/mid*100)
}

// signedLat is latString for a difference that may be negative.
func signedLat(d time.Duration) string {
	if d < 0 {
		return "-" + latString(-d)
	}
	return latString(d)
}

// printHTTPLoad writes one HTTP section. Against the embedded server the
// latency targets are not judged: miniredis runs each script in Go in this
// process, so a script costs many PINGs and the targets cannot be met there
// by design; they are for a real Redis.
func printHTTPLoad(w io.Writer, h *httpLoad, rounds int, embedded bool) {
	fmt.Fprintf(w, "\n%s\n", h.Title)
	fmt.Fprintf(w, "  (%d round(s), median round by p50; spread: half the range of the rounds, as a share of the median)\n", rounds)
	fmt.Fprintf(w, "  %-34s %10s %7s %9s %9s %7s  %s\n", "impl", "req/s", "spread", "p50", "p99", "spread", "notes")
	for _, r := range h.Runs {
		if r.Ops == 0 {
			fmt.Fprintf(w, "  %-34s %10s %7s %9s %9s %7s  failed: %s\n", r.Impl, "-", "-", "-", "-", "-", r.Err)
			continue
		}
		var notes []string
		if r.ByRedis > 0 || r.Allowed > 0 {
			notes = append(notes, fmt.Sprintf("allowed %s; decided by Redis %s, locally (deny cache) %s",
				percent(r.Allowed), percent(r.ByRedis), percent(max(1-r.ByRedis, 0))))
		}
		if r.RedisErrors > 0 {
			notes = append(notes, fmt.Sprintf("%d Redis errors", r.RedisErrors))
		}
		if r.Errors > 0 {
			notes = append(notes, fmt.Sprintf("%d failed, first: %s", r.Errors, r.Err))
		}
		fmt.Fprintf(w, "  %-34s %10s %7s %9s %9s %7s  %s\n", r.Impl, rateString(r.OpsPerSec), spread(r.RoundsOpsPS, r.OpsPerSec),
			latString(r.P50), latString(r.P99), spread(r.RoundsP50, float64(r.P50)), strings.Join(notes, "; "))
	}
	if h.RTT > 0 {
		fmt.Fprintf(w, "  added by the middleware per request (its p50/p99 minus the bare handler's): p50 %s, p99 %s\n",
			signedLat(h.AddedP50), signedLat(h.AddedP99))
		fmt.Fprintf(w, "  the middleware's own work (its p50 minus the handler calling Allow itself): %s\n", signedLat(h.OwnP50))
		saturated := h.Name == "http.load"
		few := rounds < minJudgedRounds
		switch {
		case few:
			fmt.Fprintf(w, "  latency targets not judged in a run of %d round(s): a median needs at least %d\n", rounds, minJudgedRounds)
		case embedded:
			fmt.Fprintf(w, "  latency targets (p50 within 50µs of a Redis round trip) not judged here: the embedded server runs\n"+
				"  scripts in Go inside this process, far slower than Redis; they are judged with -redis ADDR\n")
		case saturated:
			fmt.Fprintf(w, "  latency targets not judged here: the clients saturate the machine, so latency is mostly queueing\n"+
				"  for CPU; they are judged on http.paced below\n")
		}
		for _, b := range []struct {
			what string
			rtt  time.Duration
			met  bool
		}{
			{"target p50 <= one Redis round trip (PING %s)", h.RTT, h.Met},
			{"the same against one script round trip (EVALSHA 'return 1' %s)", h.ScriptRTT, h.MetScript},
			{"the same against the bare GCRA script on the same keys (EVALSHA %s)", h.LimitRTT, h.MetLimit},
		} {
			if b.rtt <= 0 || embedded || saturated || few {
				continue
			}
			verdict := "met"
			if !b.met {
				verdict = "not met"
			}
			fmt.Fprintf(w, "  "+b.what+" + 50µs = %s: %s\n", latString(b.rtt), latString(b.rtt+50*time.Microsecond), verdict)
		}
	}
}

// httpLoads are the HTTP load runs: a closed loop for throughput, and a
// paced one below saturation for latency.
var httpLoads = []struct {
	name string
	pace time.Duration
}{
	{"http.load", 0},
	{"http.paced", 20 * time.Millisecond}, // 64 clients x 50/s = 3,200 req/s
}

// httpNotes are the caveats of the HTTP sections, for the notes under the
// tables.
func httpNotes(loads []httpLoad, a *attack) []string {
	var ns []string
	if len(loads) > 0 {
		ns = append(ns,
			"http.*: a request counts as decided by Redis when the middleware's own rueidis client sent an EVALSHA "+
				"(or EVAL) for it, counted by a wrapper around that client; the rest were decided in the process by the "+
				"deny cache (no Redis error happened, so FallbackLocal never decided any); PING and the direct Allow run "+
				"at the HTTP clients' concurrency and pace, in the same interleaved rounds",
			"http.*: the added latency is the middleware's p50 (p99) minus the bare handler's, a difference of "+
				"quantiles; in http.load the clients saturate the machine, so latency there is mostly queueing for CPU "+
				"(load generator, server and Redis share it) and the target is judged on http.paced",
			"http.*: ulule/limiter's middleware (a peer row, with -peers) is a fixed window that trusts "+
				"X-Forwarded-For from any peer and sends every request to Redis (no deny cache)",
			"ratelimit.policies has no peer row: no peer library decides several limits in one call")
	}
	if a != nil {
		ns = append(ns, "http.attack: Redis is slowed by a TCP proxy in this process that holds back every chunk "+
			"of Redis's replies; FallbackOpen's requests each wait the Timeout, so it sends far fewer in the same time")
	}
	return ns
}
