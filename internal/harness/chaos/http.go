package chaos

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicekit/sluice/ratelimit"
)

// httpClientKey is the rate route's one client key; the fixed-window
// Limiter's RedisKey of it is the route's counter.
const httpClientKey = "client"

// Two concurrency middlewares with different limits share each node's
// semaphore Manager (as the docs ask: one Manager per process), and a
// rate-limit middleware runs on the fixed-window Limiter; every request
// comes from one client key.
var concLimits = [2]int{1, 2}

type httpRoutes struct {
	conc [2]http.Handler
	rate http.Handler
}

// inflight counts, fleet-wide, the requests each concurrency route is
// serving.
type inflight [2]atomic.Int64

// concOutages holds when a concurrency route's OnError was told of an
// outage: the middleware's FallbackOpen (its default) then serves the
// request without a permit, as documented, with no fault injected (a
// call's deadline passing on a loaded machine, in the deadlines lanes).
type concOutages struct {
	mu sync.Mutex
	at []time.Time
}

func (o *concOutages) told(err error) {
	if outageErr(err) {
		o.mu.Lock()
		o.at = append(o.at, time.Now())
		o.mu.Unlock()
	}
}

func (w *world) newRoutes(t testing.TB, n *node) {
	key := func(*http.Request) (string, error) { return httpClientKey, nil }
	quiet := func(*http.Request, error) {}
	for i, limit := range concLimits {
		mw, err := ratelimit.NewConcurrencyMiddleware(n.sems, ratelimit.ConcurrencyOptions{Limit: limit, KeyFunc: key,
			OnError: func(_ *http.Request, err error) { w.concOut.told(err) }})
		if err != nil {
			t.Fatal(err)
		}
		n.routes.conc[i] = mw(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { w.serveConc(r.Context(), i) }))
	}
	mw, err := ratelimit.NewMiddleware(n.limiters[0], ratelimit.MiddlewareOptions{KeyFunc: key, OnError: quiet})
	if err != nil {
		t.Fatal(err)
	}
	n.routes.rate = mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
}

// serveConc is the handler behind concurrency route i: it checks the
// route's limit while it runs. Over the limit is allowed only as the
// fallback of a Redis that a fault made unavailable.
func (w *world) serveConc(ctx context.Context, i int) {
	n := w.inflight[i].Add(1)
	defer w.inflight[i].Add(-1)
	now := time.Now()
	if n > int64(concLimits[i]) && !w.hist.faultNear(now.Add(-w.cfg.Lease), now, 0) && !timedOut(&w.concOut.mu, &w.concOut.at, now.Add(-w.cfg.Lease), now) {
		w.hist.violation("concurrency middleware (Limit %d) serving %d requests of one key at once, with no fault in force and no outage told", concLimits[i], n)
	}
	select {
	case <-ctx.Done():
	case <-time.After(w.cfg.Lease / 16):
	}
}

func (w *world) httpOp(ctx context.Context, n *node, rng *rand.Rand) {
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	rec := httptest.NewRecorder()
	if rng.IntN(3) == 0 {
		w.count("http.rate")
		call := time.Now()
		n.routes.rate.ServeHTTP(rec, req)
		ret := time.Now()
		if clientGone(ctx) {
			return
		}
		w.answered("rate", rec.Code, call, n.i)
		// An answer that took the middleware's Timeout may be its
		// fallback for a Redis too slow to answer (soak seed ...850, load
		// 8: 201 ms): "unavailable" is the library's rule for a call over
		// Timeout, whatever the key holds.
		timedOut := ret.Sub(call) >= ratelimit.DefaultTimeout
		if rec.Code != http.StatusInternalServerError && rec.Code != http.StatusTooManyRequests && !timedOut && w.hist.limitKeyWrong(call, ret, n.i) {
			w.hist.violation("rate middleware answered %d while its limiter's key held a string (called %s): a semantic error must be a 500, never the fallback",
				rec.Code, w.hist.since(call))
		}
		// Served requests count against the limiter's bound, but not
		// those that a fault may have let through (the fallback).
		if rec.Code == http.StatusOK && !w.hist.faultNear(call, ret, w.cfg.Lease) {
			w.lim.add("fixed/http", decision{call: call, ret: ret, cost: 1})
		}
		return
	}
	i := rng.IntN(len(concLimits))
	w.count("http.concurrency")
	call := time.Now()
	n.routes.conc[i].ServeHTTP(rec, req)
	if clientGone(ctx) {
		return
	}
	w.answered("concurrency", rec.Code, call, n.i)
}

// answered checks a middleware's status code on node: served (200) or
// refused over the limit (429); any other answer (a 500 for an error, a
// 503 of the fallback) only with a fault of node's network or of the
// server around the call, or an operator's string over the rate route's
// counter.
func (w *world) answered(route string, code int, call time.Time, node int) {
	if code == http.StatusOK || code == http.StatusTooManyRequests {
		return
	}
	if w.hist.unavailableNear(call, time.Now(), node) || route == "rate" && w.hist.operatorNear("limit:http", call, time.Now()) {
		return
	}
	w.hist.violation("%s middleware answered %d on node %d with no fault of its network or the server in force", route, code, node)
}

// httpClient sends requests through node n's middlewares, one after
// another with short pauses, so that requests of the two concurrency
// routes (and of several nodes) overlap.
func (w *world) httpClient(ctx context.Context, n *node, rng *rand.Rand) {
	for ctx.Err() == nil && !n.closed.Load() {
		w.httpOp(ctx, n, rng)
		sleep(ctx, time.Duration(rng.Float64()*float64(w.cfg.Lease)/16))
	}
}
