package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/semaphore"
)

// Examples run on miniredis so that their output is deterministic; use a
// real Redis server or cluster in production.
// Its clock is stopped, as if every call came at the same instant.
func newScriptCache() (*sluice.Client, func()) {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	mr.SetTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true})
	if err != nil {
		panic(err)
	}
	sc, err := sluice.New(context.Background(), client)
	if err != nil {
		panic(err)
	}
	return sc, func() { client.Close(); mr.Close() }
}

// Per-IP rate limiting of a net/http server: two requests per minute per
// client address, then 429 with Retry-After.
func ExampleNewMiddleware() {
	sc, done := newScriptCache()
	defer done()

	limiter, err := ratelimit.New(sc, ratelimit.Options{
		Algorithm: ratelimit.FixedWindow,
		Limit:     ratelimit.PerMinute(2),
	})
	if err != nil {
		panic(err)
	}
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})
	// Behind a proxy, list it in TrustedProxies and name the header it
	// writes in ClientIPHeader; here clients connect directly.
	limit, err := ratelimit.NewMiddleware(limiter, ratelimit.MiddlewareOptions{})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", limit(hello))

	srv := httptest.NewServer(mux)
	defer srv.Close()
	for range 3 {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Printf("%s, RateLimit: %s, Retry-After: %q\n", resp.Status, resp.Header.Get("RateLimit"), resp.Header.Get("Retry-After"))
	}
	// Output:
	// 200 OK, RateLimit: "default";r=1;t=60, Retry-After: ""
	// 200 OK, RateLimit: "default";r=0;t=60, Retry-After: ""
	// 429 Too Many Requests, RateLimit: "default";r=0;t=60, Retry-After: "60"
}

// A GCRA limiter of 10 requests per second with bursts of 3, and a weighted
// request.
func ExampleLimiter_AllowN() {
	sc, done := newScriptCache()
	defer done()

	limiter, err := ratelimit.New(sc, ratelimit.Options{
		Algorithm: ratelimit.GCRA,
		Limit:     ratelimit.Limit{Rate: 10, Period: time.Second, Burst: 3},
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	res, err := limiter.AllowN(ctx, "user:42", 2)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Allowed, res.Remaining, res.ResetAfter)
	res, err = limiter.AllowN(ctx, "user:42", 2)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Allowed, res.Remaining, res.RetryAfter)
	// Output:
	// true 1 200ms
	// false 1 100ms
}

// Two limits on one key, decided together: a request is counted in both
// only when both have room.
func ExampleLimiter_AllowPolicies() {
	sc, done := newScriptCache()
	defer done()

	limiter, err := ratelimit.New(sc, ratelimit.Options{Limit: ratelimit.PerSecond(10)})
	if err != nil {
		panic(err)
	}
	// One set per plan, built once and passed with each call.
	free, err := ratelimit.NewPolicies(
		ratelimit.Policy{Name: "burst", Limit: ratelimit.PerSecond(2)},
		ratelimit.Policy{Name: "daily", Algorithm: ratelimit.FixedWindow, Limit: ratelimit.Limit{Rate: 1000, Period: 24 * time.Hour}},
	)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for range 3 {
		d, err := limiter.AllowPolicies(ctx, "tenant-42", 1, free)
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v burst=%d daily=%d retry=%v\n", d.Allowed, d.Results[0].Remaining, d.Results[1].Remaining, d.RetryAfter)
	}
	// Output:
	// allowed=true burst=1 daily=999 retry=0s
	// allowed=true burst=0 daily=998 retry=0s
	// allowed=false burst=0 daily=998 retry=500ms
}

// Wait blocks until the request is allowed, sleeping the time the server
// says, or gives up at once when the context's deadline comes first.
func ExampleLimiter_Wait() {
	sc, done := newScriptCache()
	defer done()

	limiter, err := ratelimit.New(sc, ratelimit.Options{Limit: ratelimit.PerMinute(1)})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := limiter.Wait(ctx, "job", 1)
	fmt.Println(res.Allowed, err)
	// The next one needs a minute: more than the deadline allows.
	res, err = limiter.Wait(ctx, "job", 1)
	fmt.Println(res.Allowed, res.RetryAfter, errors.Is(err, ratelimit.ErrNotAllowed))
	// Output:
	// true <nil>
	// false 1m0s true
}

// A per-client-IP rate limit in front of a server-wide limit of requests
// in flight. A KeyFunc that returns the same key for every request makes
// one count for all clients (the default key is the client IP); the key
// must not be empty, since an empty key lets a request through unlimited.
// The rate middleware is the outer one, so a client over its rate is
// refused before it can take one of the server's slots, and each response
// lists both policies.
func ExampleNewConcurrencyMiddleware_serverWide() {
	sc, done := newScriptCache()
	defer done()

	mgr, err := semaphore.NewManager(sc, semaphore.Options{})
	if err != nil {
		panic(err)
	}
	defer mgr.Close()
	limiter, err := ratelimit.New(sc, ratelimit.Options{
		Algorithm: ratelimit.FixedWindow,
		Limit:     ratelimit.PerMinute(100),
	})
	if err != nil {
		panic(err)
	}
	perIP, err := ratelimit.NewMiddleware(limiter, ratelimit.MiddlewareOptions{PolicyName: "per-ip"})
	if err != nil {
		panic(err)
	}
	inFlight, err := ratelimit.NewConcurrencyMiddleware(mgr, ratelimit.ConcurrencyOptions{
		Limit:      1, // a real server would allow more
		PolicyName: "server",
		KeyFunc:    func(*http.Request) (string, error) { return "all", nil },
	})
	if err != nil {
		panic(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	})
	h := perIP(inFlight(slow))

	send := func(ip string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = ip + ":1234"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	show := func(w *httptest.ResponseRecorder) {
		fmt.Println(w.Code)
		fmt.Println("  RateLimit-Policy:", w.Header().Get("RateLimit-Policy"))
		fmt.Println("  RateLimit:", w.Header().Get("RateLimit"))
	}
	first := make(chan *httptest.ResponseRecorder)
	go func() { first <- send("192.0.2.1") }()
	<-entered
	// Another client: the server's one slot is taken.
	show(send("198.51.100.7"))
	close(release)
	show(<-first)
	// Output:
	// 429
	//   RateLimit-Policy: "per-ip";q=100;w=60, "server";q=1;qu="concurrent-requests"
	//   RateLimit: "per-ip";r=99;t=60, "server";r=0
	// 200
	//   RateLimit-Policy: "per-ip";q=100;w=60, "server";q=1;qu="concurrent-requests"
	//   RateLimit: "per-ip";r=99;t=60
}
