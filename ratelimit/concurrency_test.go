package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

func newManager(t *testing.T) *semaphore.Manager {
	t.Helper()
	sc := newCache(t, redistest.Single(t).Addr())
	mgr, err := semaphore.NewManager(sc, semaphore.Options{Prefix: testPrefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgr.Close)
	return mgr
}

// blockingHandler holds every request until release is closed, and says on
// entered when one is in.
type blockingHandler struct {
	entered chan struct{}
	release chan struct{}
}

func (h *blockingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.entered <- struct{}{}
	select {
	case <-h.release:
	case <-r.Context().Done(): // the client went away
	}
}

// TestConcurrencyMiddleware lets 2 requests of a client in at once: the
// third gets 429 with the concurrent-requests headers while the others
// run, another client is not affected, and once one returns the next
// request of the first client is let in.
func TestConcurrencyMiddleware(t *testing.T) {
	mgr := newManager(t)
	var errs errRecorder
	mw, err := NewConcurrencyMiddleware(mgr, ConcurrencyOptions{Limit: 2, OnError: errs.record, ProblemDetails: true})
	if err != nil {
		t.Fatal(err)
	}
	bh := &blockingHandler{entered: make(chan struct{}), release: make(chan struct{})}
	h := mw(bh)
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range 2 {
		wg.Go(func() { codes[i] = serve(h, request("192.0.2.10:1")).Code })
		<-bh.entered
	}
	w := serve(h, request("192.0.2.10:1"))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" ||
		w.Header().Get("RateLimit-Policy") != `"concurrency";q=2;qu="concurrent-requests"` ||
		w.Header().Get("RateLimit") != `"concurrency";r=0` ||
		!strings.Contains(w.Body.String(), `"violated-policies":["concurrency"]`) {
		t.Errorf("third request in flight: %d %v %q; want 429 with the concurrency headers and problem", w.Code, w.Header(), w.Body)
	}
	// Another client has its own limit.
	done := make(chan int)
	go func() { done <- serve(h, request("192.0.2.11:1")).Code }()
	<-bh.entered
	close(bh.release)
	if code := <-done; code != http.StatusOK {
		t.Errorf("other client: %d; want 200", code)
	}
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusOK {
			t.Errorf("request %d: %d; want 200", i+1, c)
		}
	}
	// Both permits are back: two more fit at once again.
	bh.release = make(chan struct{})
	for range 2 {
		wg.Go(func() { serve(h, request("192.0.2.10:1")) })
		<-bh.entered
	}
	close(bh.release)
	wg.Wait()
	if got := errs.list(); len(got) != 0 {
		t.Errorf("errors %v; want none", got)
	}
}

// TestConcurrencyClientGone checks that a request whose client goes away
// gives its permit back: the handler returns on the cancelled context.
func TestConcurrencyClientGone(t *testing.T) {
	mgr := newManager(t)
	h := concurrencyMiddleware(t, mgr, 1)
	bh := &blockingHandler{entered: make(chan struct{}), release: make(chan struct{})}
	hh := h(bh)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() { done <- serve(hh, request("192.0.2.12:1").WithContext(ctx)).Code }()
	<-bh.entered
	if w := serve(hh, request("192.0.2.12:1")); w.Code != http.StatusTooManyRequests {
		t.Fatalf("second request while the first runs: %d; want 429", w.Code)
	}
	cancel()
	<-done
	go func() { done <- serve(hh, request("192.0.2.12:1")).Code }()
	<-bh.entered
	close(bh.release)
	if code := <-done; code != http.StatusOK {
		t.Errorf("request after the client went away: %d; want 200 (permit given back)", code)
	}
}

// concurrencyMiddleware is NewConcurrencyMiddleware with limit, failing t on an error.
func concurrencyMiddleware(t *testing.T, mgr *semaphore.Manager, limit int) func(http.Handler) http.Handler {
	t.Helper()
	mw, err := NewConcurrencyMiddleware(mgr, ConcurrencyOptions{Limit: limit, OnError: func(_ *http.Request, err error) { t.Errorf("OnError: %v", err) }})
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

// TestConcurrencyRedisDown checks the fallbacks: open serves, closed and a
// client that is gone get 503.
func TestConcurrencyRedisDown(t *testing.T) {
	srv := redistest.NewServer(t)
	sc := newCache(t, srv.Addr())
	mgr, err := semaphore.NewManager(sc, semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	srv.Kill()
	var errs errRecorder
	open, _ := NewConcurrencyMiddleware(mgr, ConcurrencyOptions{Limit: 1, OnError: errs.record})
	closed, _ := NewConcurrencyMiddleware(mgr, ConcurrencyOptions{Limit: 1, OnError: errs.record, Fallback: FallbackClosed})
	if w := serve(open(okHandler), request("192.0.2.13:1")); w.Code != http.StatusOK {
		t.Errorf("open: %d; want 200", w.Code)
	}
	if w := serve(closed(okHandler), request("192.0.2.13:1")); w.Code != http.StatusServiceUnavailable {
		t.Errorf("closed: %d; want 503", w.Code)
	}
	if n := len(errs.list()); n != 2 {
		t.Errorf("%d errors; want 2", n)
	}
}

func TestNewConcurrencyMiddlewareValidation(t *testing.T) {
	mgr := newManager(t)
	for _, tt := range []struct {
		name string
		mgr  *semaphore.Manager
		opts ConcurrencyOptions
	}{
		{"nil manager", nil, ConcurrencyOptions{Limit: 1}},
		{"no limit", mgr, ConcurrencyOptions{}},
		{"negative limit", mgr, ConcurrencyOptions{Limit: -1}},
		{"negative timeout", mgr, ConcurrencyOptions{Limit: 1, Timeout: -1}},
		{"negative retry-after", mgr, ConcurrencyOptions{Limit: 1, RetryAfter: -1}},
		{"local fallback", mgr, ConcurrencyOptions{Limit: 1, Fallback: FallbackLocal}},
		{"bad ipv6 prefix", mgr, ConcurrencyOptions{Limit: 1, IPv6PrefixLen: 129}},
		{"limit above the semaphore's", mgr, ConcurrencyOptions{Limit: semaphore.MaxCapacity + 1}},
		{"long name", mgr, ConcurrencyOptions{Limit: 1, Name: strings.Repeat("n", 257)}},
	} {
		if mw, err := NewConcurrencyMiddleware(tt.mgr, tt.opts); !errors.Is(err, ErrInvalidOptions) || mw != nil {
			t.Errorf("%s: %v; want ErrInvalidOptions", tt.name, err)
		}
	}
}

// TestConcurrencyLimitsShareManager is issue 22 item 5: two concurrency
// middlewares on one Manager with different Limits. A client holds one
// request in flight on the route limited to 5; the route limited to 1
// must still let only one of its requests in at once. Both used to count
// under one semaphore name: the Limit 1 route got ErrCapacityMismatch,
// which FallbackOpen served unlimited.
func TestConcurrencyLimitsShareManager(t *testing.T) {
	mgr := newManager(t)
	five := concurrencyMiddleware(t, mgr, 5)
	one := concurrencyMiddleware(t, mgr, 1)
	wide := &blockingHandler{entered: make(chan struct{}), release: make(chan struct{})}
	narrow := &blockingHandler{entered: make(chan struct{}), release: make(chan struct{})}
	releaseNarrow := sync.OnceFunc(func() { close(narrow.release) })
	var wg sync.WaitGroup
	codes := make([]int, 2)
	wg.Go(func() { codes[0] = serve(five(wide), request("192.0.2.20:1")).Code })
	<-wide.entered
	wg.Go(func() { codes[1] = serve(one(narrow), request("192.0.2.20:1")).Code })
	<-narrow.entered
	// The Limit 1 route has its one request in flight: the next waits.
	// Served unlimited, it would block in the handler; it must not get
	// there.
	got := make(chan int, 1)
	go func() { got <- serve(one(narrow), request("192.0.2.20:1")).Code }()
	select {
	case code := <-got:
		if code != http.StatusTooManyRequests {
			t.Errorf("second request on the Limit 1 route: %d; want 429", code)
		}
	case <-narrow.entered:
		t.Errorf("second request on the Limit 1 route was served while the first runs; want 429")
		releaseNarrow()
		<-got
	}
	close(wide.release)
	releaseNarrow()
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusOK {
			t.Errorf("request %d in flight: %d; want 200", i+1, c)
		}
	}
}

// TestConcurrencyName: middlewares with the same Name and Limit share one
// count per key; another Name counts on its own, and so does the
// PolicyName, which the Name defaults to.
func TestConcurrencyName(t *testing.T) {
	mgr := newManager(t)
	mws := make(map[string]func(http.Handler) http.Handler)
	for label, opts := range map[string]ConcurrencyOptions{
		"default": {}, "default again": {}, "named": {Name: "uploads"}, "policy": {PolicyName: "search"},
	} {
		opts.Limit = 1
		opts.OnError = func(_ *http.Request, err error) { t.Errorf("OnError: %v", err) }
		mw, err := NewConcurrencyMiddleware(mgr, opts)
		if err != nil {
			t.Fatal(err)
		}
		mws[label] = mw
	}
	bh := &blockingHandler{entered: make(chan struct{}), release: make(chan struct{})}
	var wg sync.WaitGroup
	for _, label := range []string{"default", "named", "policy"} {
		wg.Go(func() {
			if code := serve(mws[label](bh), request("192.0.2.21:1")).Code; code != http.StatusOK {
				t.Errorf("%s: %d; want 200 (a count of its own)", label, code)
			}
		})
		<-bh.entered
	}
	if code := serve(mws["default again"](okHandler), request("192.0.2.21:1")).Code; code != http.StatusTooManyRequests {
		t.Errorf("same Name and Limit as one in flight: %d; want 429 (one count)", code)
	}
	close(bh.release)
	wg.Wait()
}

// TestConcurrencyEventNames serves 50 clients through the concurrency
// middleware with an observer on the Manager's cache: every event must be
// named after the middleware's configuration, never after a client's key
// (issue 31, item 6: with the otel observer's Names on, each client made
// series of its own, named with its IP, and a permanent entry in the
// observer's map).
func TestConcurrencyEventNames(t *testing.T) {
	rec := &recorder{}
	sc := observedCache(t, redistest.Single(t).Addr(), rec)
	mgr, err := semaphore.NewManager(sc, semaphore.Options{Prefix: testPrefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgr.Close)
	for _, tc := range []struct {
		opts ConcurrencyOptions
		want string
	}{
		{ConcurrencyOptions{Limit: 2}, "rl-conc:11:concurrency:2:"},
		{ConcurrencyOptions{Limit: 3, Name: "uploads"}, "rl-conc:7:uploads:3:"},
	} {
		mw, err := NewConcurrencyMiddleware(mgr, tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		h := mw(okHandler)
		const clients = 50
		for i := range clients {
			if w := serve(h, request(fmt.Sprintf("192.0.2.%d:1", i+1))); w.Code != http.StatusOK {
				t.Fatalf("client %d: %d; want 200", i+1, w.Code)
			}
		}
		names := map[string]int{}
		for _, e := range rec.take() {
			names[e.Name]++
		}
		if len(names) != 1 || names[tc.want] != 2*clients {
			t.Errorf("%+v: event names %v; want only %q, %d times (an acquisition and a release per client)", tc.opts, names, tc.want, 2*clients)
		}
	}
}
