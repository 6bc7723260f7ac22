package ratelimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

const (
	ratePolicy = `"default";q=2;w=60`
	concPolicy = `"concurrency";q=1;qu="concurrent-requests"`
)

// stack is a rate middleware (2 a minute per IP) and a concurrency
// middleware (1 in flight per IP) on a handler that holds a request with
// an X-Hold header until release, and answers others at once; the order
// is rate outside concurrency when rateOuter.
type stack struct {
	h       http.Handler
	mgr     *semaphore.Manager
	entered chan struct{}
	release chan struct{}
}

func newStack(t *testing.T, rateOuter bool) stack {
	t.Helper()
	s := stack{mgr: newManager(t), entered: make(chan struct{}), release: make(chan struct{})}
	l := newLimiter(t, newCache(t, redistest.Single(t).Addr()), Options{Algorithm: FixedWindow, Limit: PerMinute(2)})
	fail := func(_ *http.Request, err error) { t.Errorf("OnError: %v", err) }
	rate := MustNewMiddleware(l, MiddlewareOptions{OnError: fail, Timeout: answerTimeout})
	conc, err := NewConcurrencyMiddleware(s.mgr, ConcurrencyOptions{Limit: 1, OnError: fail, Timeout: answerTimeout})
	if err != nil {
		t.Fatal(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			s.entered <- struct{}{}
			<-s.release
		}
	})
	if rateOuter {
		s.h = rate(conc(handler))
	} else {
		s.h = conc(rate(handler))
	}
	return s
}

// hold starts a request that the handler holds until s.release is closed,
// and returns a channel with its response.
func (s stack) hold(t *testing.T, remote string) <-chan *httptest.ResponseRecorder {
	t.Helper()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- serve(s.h, request(remote, "X-Hold", "1")) }()
	select {
	case <-s.entered:
	case w := <-done:
		t.Fatalf("held request: %d %v; want it in the handler", w.Code, w.Header())
	}
	return done
}

// available returns the free permits of the concurrency middleware's
// semaphore for ip.
func (s stack) available(t *testing.T, ip string) int64 {
	t.Helper()
	sem, err := s.mgr.NewSemaphore(concurrencyPrefix(ConcurrencyOptions{Limit: 1})+ip, 1)
	if err != nil {
		t.Fatal(err)
	}
	n, err := sem.Available(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

type wantHeaders struct {
	code                      int
	policy, limit, retryAfter string
}

func checkHeaders(t *testing.T, what string, w *httptest.ResponseRecorder, want wantHeaders) {
	t.Helper()
	hd := w.Header()
	got := wantHeaders{w.Code, hd.Get("RateLimit-Policy"), hd.Get("RateLimit"), hd.Get("Retry-After")}
	if got != want {
		t.Errorf("%s: got %+v; want %+v", what, got, want)
	}
	if n, m := len(hd.Values("RateLimit-Policy")), len(hd.Values("RateLimit")); n > 1 || m > 1 {
		t.Errorf("%s: %d RateLimit-Policy and %d RateLimit lines; want one list each", what, n, m)
	}
}

// TestStackedMiddlewaresRateOuter stacks the rate middleware outside the
// concurrency middleware: each response lists both policies (only the rate
// policy when the rate limit refused), a concurrency 429 keeps the
// client's rate figures, a request refused for concurrency was counted by
// the rate limit, and one refused by the rate limit never takes a permit.
func TestStackedMiddlewaresRateOuter(t *testing.T) {
	s := newStack(t, true)
	const ip = "192.0.2.20"
	first := s.hold(t, ip+":1")
	// Rate: room (1 left); concurrency: the permit is taken.
	checkHeaders(t, "concurrency 429", serve(s.h, request(ip+":1")), wantHeaders{429,
		ratePolicy + ", " + concPolicy, `"default";r=0;t=60, "concurrency";r=0`, "1"})
	// The concurrency 429 was counted: the next request is over the rate,
	// and is refused before the concurrency middleware (no concurrency
	// policy, the rate's Retry-After) even with the permit taken.
	checkHeaders(t, "rate 429 in flight", serve(s.h, request(ip+":1")), wantHeaders{429,
		ratePolicy, `"default";r=0;t=60`, "60"})
	close(s.release)
	checkHeaders(t, "held request", <-first, wantHeaders{200,
		ratePolicy + ", " + concPolicy, `"default";r=1;t=60`, ""})
	// With the permit free, a request over the rate does not take it
	// either.
	checkHeaders(t, "rate 429", serve(s.h, request(ip+":1", "X-Hold", "1")), wantHeaders{429,
		ratePolicy, `"default";r=0;t=60`, "60"})
	if n := s.available(t, ip); n != 1 {
		t.Errorf("available permits after the requests: %d; want 1", n)
	}
}

// TestStackedMiddlewaresConcurrencyOuter stacks them the other way round:
// a concurrency 429 lists the concurrency policy alone and is not counted
// by the rate limit; 200 and a rate 429 list both, and a rate 429 held
// its permit only while the rate limit was asked.
func TestStackedMiddlewaresConcurrencyOuter(t *testing.T) {
	s := newStack(t, false)
	const ip = "192.0.2.21"
	first := s.hold(t, ip+":1")
	checkHeaders(t, "concurrency 429", serve(s.h, request(ip+":1")), wantHeaders{429,
		concPolicy, `"concurrency";r=0`, "1"})
	close(s.release)
	checkHeaders(t, "held request", <-first, wantHeaders{200,
		concPolicy + ", " + ratePolicy, `"default";r=1;t=60`, ""})
	// Not counted: the rate limit still has room for one.
	checkHeaders(t, "second 200", serve(s.h, request(ip+":1")), wantHeaders{200,
		concPolicy + ", " + ratePolicy, `"default";r=0;t=60`, ""})
	checkHeaders(t, "rate 429", serve(s.h, request(ip+":1")), wantHeaders{429,
		concPolicy + ", " + ratePolicy, `"default";r=0;t=60`, "60"})
	if n := s.available(t, ip); n != 1 {
		t.Errorf("available permits after the requests: %d; want 1", n)
	}
}

// TestStackedSameName stacks two middlewares that name their policies
// alike: the name is listed once, and its RateLimit member comes from the
// middleware whose RateLimit-Policy member is listed (the inner one).
func TestStackedSameName(t *testing.T) {
	mgr := newManager(t)
	l := newLimiter(t, newCache(t, redistest.Single(t).Addr()), Options{Algorithm: FixedWindow, Limit: PerMinute(5)})
	fail := func(_ *http.Request, err error) { t.Errorf("OnError: %v", err) }
	rate := MustNewMiddleware(l, MiddlewareOptions{OnError: fail, PolicyName: "api", Timeout: answerTimeout})
	conc, err := NewConcurrencyMiddleware(mgr, ConcurrencyOptions{Limit: 3, OnError: fail, PolicyName: "api", Timeout: answerTimeout})
	if err != nil {
		t.Fatal(err)
	}
	w := serve(rate(conc(okHandler)), request("192.0.2.22:1"))
	checkHeaders(t, "rate outer", w, wantHeaders{200, `"api";q=3;qu="concurrent-requests"`, "", ""})
	w = serve(conc(rate(okHandler)), request("192.0.2.22:1"))
	checkHeaders(t, "concurrency outer", w, wantHeaders{200, `"api";q=5;w=60`, `"api";r=3;t=60`, ""})
}

// TestMergeMembers checks the list merging the middlewares compose with.
func TestMergeMembers(t *testing.T) {
	for _, tc := range []struct {
		old   []string
		names []string
		add   string
		want  []string
	}{
		{nil, []string{`"a"`}, "", nil},
		{nil, []string{`"a"`}, `"a";r=1`, []string{`"a";r=1`}},
		{[]string{`"b";q=1`}, []string{`"a"`}, `"a";q=2`, []string{`"b";q=1, "a";q=2`}},
		{[]string{`"a";q=1, "b";q=1`}, []string{`"a"`}, `"a";q=2`, []string{`"b";q=1, "a";q=2`}},
		{[]string{`"a";q=1`}, []string{`"a"`}, "", nil},
		// Two field lines are one list; commas and semicolons in quoted
		// strings split nothing.
		{[]string{`"x,y";q=1`, ` "p;\"q,";q=2 ,,`}, []string{`"a"`}, `"a";q=3`, []string{`"x,y";q=1, "p;\"q,";q=2, "a";q=3`}},
		{[]string{`"x,y";q=1, "p;\"q,";q=2`}, []string{`"p;\"q,"`, `"z"`}, `"p;\"q,";q=4, "z";q=5`, []string{`"x,y";q=1, "p;\"q,";q=4, "z";q=5`}},
		{[]string{`"c";q=1;qu="concurrent-requests"`}, []string{`"d"`}, `"d";q=2`, []string{`"c";q=1;qu="concurrent-requests", "d";q=2`}},
		// A member without parameters (another server's, or a bare
		// token) is its whole name: kept unless named, replaced if named.
		// (A mutant that read one byte past the member's end panicked on
		// it: every member above has a ';'.)
		{[]string{`"b", "a", tok`}, []string{`"a"`}, `"a";q=2`, []string{`"b", tok, "a";q=2`}},
		{[]string{`"a"`}, []string{`"a"`}, "", nil},
		{[]string{`"a\"`}, []string{`"b"`}, `"b";q=1`, []string{`"a\", "b";q=1`}},
	} {
		if got := mergeMembers(tc.old, tc.names, tc.add); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("mergeMembers(%q, %q, %q) = %q; want %q", tc.old, tc.names, tc.add, got, tc.want)
		}
	}
}
