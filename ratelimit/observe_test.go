package ratelimit

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// recorder keeps the events an Observer is told.
type recorder struct {
	mu     sync.Mutex
	events []scriptcache.Event
}

func (r *recorder) Observe(e scriptcache.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) take() []scriptcache.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}

// observedCache returns a cache on addr that reports to rec.
func observedCache(t *testing.T, addr string, rec *recorder) *scriptcache.Cache {
	t.Helper()
	sc, err := scriptcache.New(context.Background(), redistest.Client(t, addr), scriptcache.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

type wantEvent struct {
	kind    scriptcache.EventKind
	name    string
	allowed bool
	source  scriptcache.Source
}

func checkEvents(t *testing.T, got []scriptcache.Event, want ...wantEvent) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("events %+v; want %d", got, len(want))
	}
	for i, e := range got {
		w := want[i]
		if e.Kind != w.kind || e.Name != w.name || e.Allowed != w.allowed || e.Source != w.source || e.Primitive != "ratelimit" {
			t.Errorf("event %d = %+v; want %+v", i, e, w)
		}
	}
}

func TestObserveDecisions(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	sc := observedCache(t, redistest.Single(t).Addr(), rec)
	l := newLimiter(t, sc, Options{Limit: PerHour(1)})
	prefix := testPrefix(t)
	for range 3 {
		if _, err := l.Allow(ctx, "client"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.AllowN(ctx, "client", 0); err != nil { // a peek is no decision
		t.Fatal(err)
	}
	checkEvents(t, rec.take(),
		wantEvent{scriptcache.EventDecision, prefix, true, scriptcache.SourceRedis},
		wantEvent{scriptcache.EventDecision, prefix, false, scriptcache.SourceRedis},
		wantEvent{scriptcache.EventDecision, prefix, false, scriptcache.SourceDenyCache})

	ps, err := NewPolicies(Policy{Name: "second", Limit: PerSecond(100)}, Policy{Name: "hour", Algorithm: FixedWindow, Limit: PerHour(1)})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := l.AllowPolicies(ctx, "client", 1, ps); err != nil {
			t.Fatal(err)
		}
	}
	checkEvents(t, rec.take(),
		wantEvent{scriptcache.EventDecision, "second,hour", true, scriptcache.SourceRedis},
		wantEvent{scriptcache.EventDecision, "second,hour", false, scriptcache.SourceRedis},
		wantEvent{scriptcache.EventDecision, "second,hour", false, scriptcache.SourceDenyCache})
}

func TestObserveFallbacks(t *testing.T) {
	rec := &recorder{}
	srv := redistest.NewServer(t)
	p, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	sc := observedCache(t, p.Addr(), rec)
	l := newLimiter(t, sc, Options{Limit: PerHour(1)})
	prefix := testPrefix(t)
	// No reply can come sooner than the latency, past every timeout.
	p.SetLatency(200*time.Millisecond, 0)
	quiet := func(*http.Request, error) {}
	for _, c := range []struct {
		fallback Fallback
		code     int
		want     []wantEvent
	}{
		{FallbackOpen, http.StatusOK, []wantEvent{{scriptcache.EventFallback, prefix, false, scriptcache.SourceFailOpen}}},
		{FallbackClosed, http.StatusServiceUnavailable, []wantEvent{{scriptcache.EventFallback, prefix, false, scriptcache.SourceFailClosed}}},
		{FallbackLocal, http.StatusOK, []wantEvent{
			{scriptcache.EventFallback, prefix, false, scriptcache.SourceLocal},
			{scriptcache.EventDecision, prefix, true, scriptcache.SourceLocal},
		}},
	} {
		opts := MiddlewareOptions{Fallback: c.fallback, Timeout: 20 * time.Millisecond, OnError: quiet}
		if c.fallback == FallbackLocal {
			opts.LocalHold = time.Hour
		}
		m := testMiddleware(t, l, opts)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(okHandler, w, r) })
		if w := serve(h, request("192.0.2.1:1")); w.Code != c.code {
			t.Fatalf("%v: status %d, want %d", c.fallback, w.Code, c.code)
		}
		ev := rec.take()
		checkEvents(t, ev, c.want...)
		if ev[0].Err == nil {
			t.Errorf("%v: fallback event %+v without Redis's error", c.fallback, ev[0])
		}
	}
}
