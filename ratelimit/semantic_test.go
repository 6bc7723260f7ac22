package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// Issue 22 item 6: only an outage may reach a fallback. These tests give
// each caller of Unavailable an error from a healthy Redis, or from its own
// configuration, and check that limiting stays on: 500 (or an error
// returned), OnError told, the observer told.

// wrongType stores a list where l counts key under its own Limit, so that
// its script fails with WRONGTYPE: Redis answers, with an error retrying
// cannot fix.
func wrongType(t *testing.T, addr string, l *Limiter, key string) {
	t.Helper()
	c := redistest.Client(t, addr)
	if err := c.Do(context.Background(), c.B().Rpush().Key(keyspace.Key(l.prefix, key, l.suffix)).Element("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// TestMiddlewareSemanticError: a key that holds another type of value gets
// 500 under every Fallback, twice (FallbackLocal does not take over), and
// is told to OnError and to the observer as refused. It used to be served
// unlimited (FallbackOpen) or decided locally (FallbackLocal).
func TestMiddlewareSemanticError(t *testing.T) {
	addr := redistest.Single(t).Addr()
	rec := &recorder{}
	l := newLimiter(t, observedCache(t, addr, rec), Options{Limit: PerHour(100)})
	const client = "192.0.2.30"
	wrongType(t, addr, l, client)
	for _, fb := range []Fallback{FallbackOpen, FallbackClosed, FallbackLocal} {
		var errs errRecorder
		h := MustNewMiddleware(l, MiddlewareOptions{Fallback: fb, OnError: errs.record})(okHandler)
		for i := range 2 {
			if w := serve(h, request(client+":1")); w.Code != http.StatusInternalServerError {
				t.Errorf("%v, request %d: status %d; want 500", fb, i+1, w.Code)
			}
		}
		got := errs.list()
		if len(got) != 2 || Unavailable(got[0]) || Unavailable(got[1]) {
			t.Errorf("%v: OnError told %v; want the two WRONGTYPE errors", fb, got)
		}
		ev := rec.take()
		checkEvents(t, ev,
			wantEvent{scriptcache.EventFallback, testPrefix(t), false, scriptcache.SourceFailClosed},
			wantEvent{scriptcache.EventFallback, testPrefix(t), false, scriptcache.SourceFailClosed})
		if ev[0].Err == nil || Unavailable(ev[0].Err) {
			t.Errorf("%v: event error %v; want the WRONGTYPE error", fb, ev[0].Err)
		}
	}
}

// TestCheckerSemanticError: Check returns a WRONGTYPE error, reported to
// the observer, instead of answering it with the local fallback.
func TestCheckerSemanticError(t *testing.T) {
	addr := redistest.Single(t).Addr()
	rec := &recorder{}
	l := newLimiter(t, observedCache(t, addr, rec), Options{Limit: PerHour(100)})
	wrongType(t, addr, l, "k")
	var local atomic.Int64
	c, err := NewChecker(l, CheckerOptions{FallbackLocal: true, OnLocal: func(context.Context, error) { local.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := c.Check(context.Background(), "k", nil); err == nil || Unavailable(err) {
		t.Errorf("Check: %+v, %v; want the WRONGTYPE error", d, err)
	}
	if n := local.Load(); n != 0 {
		t.Errorf("OnLocal told %d times; want 0 (no local fallback)", n)
	}
	checkEvents(t, rec.take(), wantEvent{scriptcache.EventFallback, testPrefix(t), false, scriptcache.SourceFailClosed})
}

// observedManager returns a Manager on addr whose Cache reports to rec.
func observedManager(t *testing.T, addr string, rec *recorder) *semaphore.Manager {
	t.Helper()
	mgr, err := semaphore.NewManager(observedCache(t, addr, rec), semaphore.Options{Prefix: testPrefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgr.Close)
	return mgr
}

// acquireFailed returns the semaphore's EventAcquireFailed events in ev.
func acquireFailed(ev []scriptcache.Event) []scriptcache.Event {
	var out []scriptcache.Event
	for _, e := range ev {
		if e.Kind == scriptcache.EventAcquireFailed && e.Primitive == scriptcache.PrimitiveSemaphore {
			out = append(out, e)
		}
	}
	return out
}

// TestConcurrencyCapacityMismatch: a semaphore of the middleware's name
// held under another capacity (by code other than the middleware) gives
// 500 and is observed; it used to be served unlimited by FallbackOpen.
func TestConcurrencyCapacityMismatch(t *testing.T) {
	rec := &recorder{}
	mgr := observedManager(t, redistest.Single(t).Addr(), rec)
	opts := ConcurrencyOptions{Limit: 1}
	const client = "192.0.2.31"
	sem, err := mgr.NewSemaphore(concurrencyPrefix(opts)+client, 2)
	if err != nil {
		t.Fatal(err)
	}
	p, err := sem.Acquire(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(context.Background())
	rec.take()
	var errs errRecorder
	opts.OnError = errs.record
	mw, err := NewConcurrencyMiddleware(mgr, opts)
	if err != nil {
		t.Fatal(err)
	}
	if w := serve(mw(okHandler), request(client+":1")); w.Code != http.StatusInternalServerError {
		t.Errorf("capacity mismatch: status %d; want 500", w.Code)
	}
	if got := errs.list(); len(got) != 1 || !errors.Is(got[0], semaphore.ErrCapacityMismatch) {
		t.Errorf("OnError told %v; want ErrCapacityMismatch", got)
	}
	if ev := acquireFailed(rec.take()); len(ev) != 1 || !errors.Is(ev[0].Err, semaphore.ErrCapacityMismatch) {
		t.Errorf("observed %+v; want one failed acquisition with ErrCapacityMismatch", ev)
	}
}

// TestConcurrencyClosedManager: a closed Manager gives 500 under both
// Fallbacks and is observed; it used to be served unlimited.
func TestConcurrencyClosedManager(t *testing.T) {
	rec := &recorder{}
	mgr := observedManager(t, redistest.Single(t).Addr(), rec)
	mgr.Close()
	for _, fb := range []Fallback{FallbackOpen, FallbackClosed} {
		var errs errRecorder
		mw, err := NewConcurrencyMiddleware(mgr, ConcurrencyOptions{Limit: 1, Fallback: fb, OnError: errs.record})
		if err != nil {
			t.Fatal(err)
		}
		if w := serve(mw(okHandler), request("192.0.2.32:1")); w.Code != http.StatusInternalServerError {
			t.Errorf("%v, closed Manager: status %d; want 500", fb, w.Code)
		}
		if got := errs.list(); len(got) != 1 || !errors.Is(got[0], semaphore.ErrClosed) {
			t.Errorf("%v: OnError told %v; want ErrClosed", fb, got)
		}
		if ev := acquireFailed(rec.take()); len(ev) != 1 || ev[0].Reason != scriptcache.ReasonClosed {
			t.Errorf("%v: observed %+v; want one failed acquisition, reason closed", fb, ev)
		}
	}
}

// TestConcurrencyTimeoutFallback: a Redis slower than the Timeout is an
// outage, answered by the Fallback. TryAcquire's timeout wraps
// ErrNotObtained, and the middleware used to answer it with 429 whatever
// the Fallback.
func TestConcurrencyTimeoutFallback(t *testing.T) {
	srv := redistest.NewServer(t)
	p, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	mgr, err := semaphore.NewManager(newCache(t, p.Addr()), semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	// No reply can come sooner than the latency, past the timeout.
	p.SetLatency(200*time.Millisecond, 0)
	for _, c := range []struct {
		fb   Fallback
		code int
	}{{FallbackOpen, http.StatusOK}, {FallbackClosed, http.StatusServiceUnavailable}} {
		var errs errRecorder
		mw, err := NewConcurrencyMiddleware(mgr, ConcurrencyOptions{Limit: 1, Fallback: c.fb, Timeout: 20 * time.Millisecond, OnError: errs.record})
		if err != nil {
			t.Fatal(err)
		}
		if w := serve(mw(okHandler), request("192.0.2.33:1")); w.Code != c.code {
			t.Errorf("%v, Redis slow: status %d; want %d", c.fb, w.Code, c.code)
		}
		if got := errs.list(); len(got) != 1 || !Unavailable(got[0]) {
			t.Errorf("%v: OnError told %v; want one timeout", c.fb, got)
		}
	}
}

// TestConcurrencyFixedLease: a Manager whose permits expire after a fixed
// Lease, however long the handler runs, is refused: a request running
// longer would stop counting.
func TestConcurrencyFixedLease(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	mgr, err := semaphore.NewManager(sc, semaphore.Options{Prefix: testPrefix(t), Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	if mw, err := NewConcurrencyMiddleware(mgr, ConcurrencyOptions{Limit: 1}); !errors.Is(err, ErrInvalidOptions) || mw != nil {
		t.Errorf("fixed Lease: %v; want ErrInvalidOptions", err)
	}
}
