package sluiceotel_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	sluiceotel "github.com/sluicekit/sluice/otel"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/semaphore"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// signal bounds the wait for something that must happen; generous for a
// loaded two-core machine running -race.
const signal = 10 * time.Second

// value returns the count of the histogram, or the value of the counter,
// called name at the data point whose attributes include want.
func value(t *testing.T, rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	match := func(set attribute.Set) bool {
		for _, kv := range want {
			if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
				return false
			}
		}
		return true
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != sluiceotel.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						n += int64(p.Count)
					}
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						n += p.Value
					}
				}
			default:
				t.Fatalf("%s: unexpected data %T", name, m.Data)
			}
		}
	}
	return n
}

func TestMetrics(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	client := redistest.Client(t, srv.Addr())

	reader := sdkmetric.NewManualReader()
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithReader(exporter))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := sluiceotel.New(mp, sluiceotel.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := sluice.New(ctx, client, sluice.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}

	// A lock taken and released: one wait, one hold.
	locks, err := mutex.NewLocker(sc, mutex.Options{WatchdogLease: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	m, err := locks.NewMutex("otel-test")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Taken again and forced free by someone else: the watchdog finds it
	// gone and the holder loses it.
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	other, err := locks.NewMutex("otel-test")
	if err != nil {
		t.Fatal(err)
	}
	if held, err := other.ForceUnlock(ctx); err != nil || !held {
		t.Fatalf("ForceUnlock = %v, %v", held, err)
	}
	select {
	case <-m.Lost():
	case <-time.After(signal):
		t.Fatal("the forced unlock was not noticed")
	}
	// The loss is reported until the Unlock that acknowledges it; a TryLock
	// before that would return the loss, not find the lock taken.
	if err := m.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Fatalf("Unlock after the loss = %v; want ErrNotHeld", err)
	}
	// A try that finds the lock taken.
	if err := other.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.TryLock(ctx); err == nil {
		t.Fatal("TryLock took a held lock")
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// Decisions: allowed by Redis, denied by Redis, then by the deny cache.
	lim, err := ratelimit.New(sc, ratelimit.Options{Limit: ratelimit.PerMinute(1)})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false} {
		res, err := lim.Allow(ctx, "client-1")
		if err != nil || res.Allowed != want {
			t.Fatalf("call %d: Allow = %+v, %v; want allowed %v", i, res, err, want)
		}
	}
	// Scripts flushed: the next call reloads its script.
	if err := srv.FlushScripts(); err != nil {
		t.Fatal(err)
	}
	if res, err := lim.Allow(ctx, "client-2"); err != nil || !res.Allowed {
		t.Fatalf("Allow after SCRIPT FLUSH = %+v, %v", res, err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	mtx := attribute.String("primitive", "mutex")
	for _, c := range []struct {
		name string
		want int64
		kv   []attribute.KeyValue
	}{
		{"sluice.lock.wait", 3, []attribute.KeyValue{mtx}},
		{"sluice.lock.hold", 2, []attribute.KeyValue{mtx}},
		{"sluice.lock.losses", 1, []attribute.KeyValue{mtx, attribute.String("reason", "gone")}},
		{"sluice.lock.failures", 1, []attribute.KeyValue{mtx, attribute.String("reason", "busy")}},
		{"sluice.lock.handoffs", 0, nil},
		{"sluice.ratelimit.decisions", 2, []attribute.KeyValue{attribute.Bool("allowed", true), attribute.String("source", "redis")}},
		{"sluice.ratelimit.decisions", 1, []attribute.KeyValue{attribute.Bool("allowed", false), attribute.String("source", "redis")}},
		{"sluice.ratelimit.decisions", 1, []attribute.KeyValue{attribute.Bool("allowed", false), attribute.String("source", "deny_cache")}},
		{"sluice.script.reloads", 1, []attribute.KeyValue{attribute.String("script", "ratelimit_gcra"), attribute.Bool("failed", false)}},
	} {
		if got := value(t, rm, c.name, c.kv...); got != c.want {
			t.Errorf("%s %v = %d, want %d", c.name, c.kv, got, c.want)
		}
	}
	// Names stay out of the attributes unless asked for.
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if s, ok := mt.Data.(metricdata.Sum[int64]); ok {
				for _, p := range s.DataPoints {
					if _, ok := p.Attributes.Value("name"); ok {
						t.Errorf("%s has a name attribute: %v", mt.Name, p.Attributes)
					}
				}
			}
		}
	}

	// The same, as Prometheus scrapes it.
	hs := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer hs.Close()
	resp, err := http.Get(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	text := string(body)
	for _, want := range []string{
		`sluice_lock_wait_seconds_count{otel_scope_name="github.com/sluicekit/sluice/otel",otel_scope_schema_url="",otel_scope_version="",primitive="mutex"} 3`,
		`sluice_lock_hold_seconds_count{otel_scope_name="github.com/sluicekit/sluice/otel",otel_scope_schema_url="",otel_scope_version="",primitive="mutex"} 2`,
		`sluice_lock_losses_total{otel_scope_name="github.com/sluicekit/sluice/otel",otel_scope_schema_url="",otel_scope_version="",primitive="mutex",reason="gone"} 1`,
		`sluice_ratelimit_decisions_total{allowed="false",otel_scope_name="github.com/sluicekit/sluice/otel",otel_scope_schema_url="",otel_scope_version="",source="deny_cache"} 1`,
		`sluice_script_reloads_total{failed="false",otel_scope_name="github.com/sluicekit/sluice/otel",otel_scope_schema_url="",otel_scope_version="",script="ratelimit_gcra"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the Prometheus text lacks\n\t%s", want)
		}
	}
	if t.Failed() {
		t.Logf("Prometheus text:\n%s", text)
	}
}

func TestNames(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := sluiceotel.New(mp, sluiceotel.Options{Names: true})
	if err != nil {
		t.Fatal(err)
	}
	obs.Observe(sluice.Event{Kind: sluice.EventAcquired, Primitive: sluice.PrimitiveSemaphore, Name: "pool", Wait: time.Millisecond, Weight: 2, Handoff: true})
	obs.Observe(sluice.Event{Kind: sluice.EventFallback, Primitive: sluice.PrimitiveRateLimit, Name: "api", Source: sluice.SourceFailOpen})
	obs.Observe(sluice.Event{Kind: sluice.EventSubscription, Primitive: sluice.PrimitiveMutex, Name: "ch", Reason: sluice.ReasonRefused})
	obs.Observe(sluice.Event{Kind: sluice.EventSubscription, Primitive: sluice.PrimitiveMutex, Name: "ch", Reason: sluice.ReasonResubscribed})
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	pool := attribute.String("name", "pool")
	for _, c := range []struct {
		name string
		kv   []attribute.KeyValue
	}{
		{"sluice.semaphore.wait", []attribute.KeyValue{pool}},
		{"sluice.semaphore.handoffs", []attribute.KeyValue{pool}},
		{"sluice.ratelimit.fallbacks", []attribute.KeyValue{attribute.String("mode", "fail_open"), attribute.String("name", "api")}},
		{"sluice.subscription.errors", []attribute.KeyValue{attribute.String("reason", "refused"), attribute.String("primitive", "mutex")}},
		{"sluice.subscription.resubscribes", []attribute.KeyValue{attribute.String("primitive", "mutex")}},
	} {
		if got := value(t, rm, c.name, c.kv...); got != 1 {
			t.Errorf("%s %v = %d, want 1", c.name, c.kv, got)
		}
	}
	if _, err := sluiceotel.New(nil, sluiceotel.Options{}); err == nil {
		t.Error("New(nil) succeeded")
	}
}

// TestNamesConcurrencyMiddleware serves 50 clients through the
// concurrency middleware with Names on: the name attribute of every
// series must come from the configuration, never from a client's key, so
// there is one series per instrument and attribute set, not one per
// client (issue 31, item 6: 50 clients made 50 series of
// sluice.semaphore.*, each with an IP).
func TestNamesConcurrencyMiddleware(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := sluiceotel.New(mp, sluiceotel.Options{Names: true})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := sluice.New(ctx, redistest.Client(t, redistest.Single(t).Addr()), sluice.WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := semaphore.NewManager(sc, semaphore.Options{Prefix: fmt.Sprintf("otel-test-%d:", time.Now().UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	mw, err := ratelimit.NewConcurrencyMiddleware(mgr, ratelimit.ConcurrencyOptions{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	const clients = 50
	for i := range clients {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = fmt.Sprintf("192.0.2.%d:1", i+1)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Fatalf("client %d: %d; want 200", i+1, w.Code)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	const want = "rl-conc:11:concurrency:2:"
	series := map[string][]string{} // instrument: names of its data points
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			var sets []attribute.Set
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			}
			for _, set := range sets {
				name, _ := set.Value("name")
				series[m.Name] = append(series[m.Name], name.AsString())
			}
		}
	}
	for _, inst := range []string{"sluice.semaphore.wait", "sluice.semaphore.hold"} {
		if got := series[inst]; len(got) != 1 || got[0] != want {
			t.Errorf("%s: series named %q; want one, named %q", inst, got, want)
		}
	}
	if got := value(t, rm, "sluice.semaphore.wait", attribute.String("name", want)); got != clients {
		t.Errorf("sluice.semaphore.wait{name=%q} = %d; want %d", want, got, clients)
	}
}
