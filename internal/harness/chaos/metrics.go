package chaos

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	sluiceotel "github.com/sluicekit/sluice/otel"
	"github.com/sluicekit/sluice/scriptcache"
)

// metricsCheck is the OpenTelemetry observer (Options.Names on) of the
// limits workload's script caches, read by an in-memory reader. The
// README: metric labels stay few, since a name is a lock, a semaphore or a
// limit (a Limiter's prefix, a set's policy names), never a client's key;
// so the series are bounded by the names configured, whatever the number
// of clients, which the workload makes in the hundreds.
//
// It also keeps when each limit's local fallback decided (an
// EventDecision from SourceLocal, by Event.Name): an answer decided then
// may be the local bucket's, not Redis's.
type metricsCheck struct {
	reader   *sdkmetric.ManualReader
	provider *sdkmetric.MeterProvider
	obs      *sluiceotel.Observer

	mu    sync.Mutex
	local map[string][]time.Time // local decisions by Event.Name
}

// Observe passes e to the OpenTelemetry observer and notes local
// decisions. It implements scriptcache.Observer.
func (m *metricsCheck) Observe(e scriptcache.Event) {
	m.obs.Observe(e)
	if e.Kind == scriptcache.EventDecision && e.Source == scriptcache.SourceLocal {
		m.mu.Lock()
		m.local[e.Name] = append(m.local[e.Name], time.Now())
		m.mu.Unlock()
	}
}

// localWithin reports whether a local fallback decided under name within
// [from, to].
func (m *metricsCheck) localWithin(name string, from, to time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	ts := m.local[name]
	i, _ := slices.BinarySearchFunc(ts, from, func(t, from time.Time) int { return t.Compare(from) })
	return i < len(ts) && !ts[i].After(to)
}

func newMetricsCheck() (*metricsCheck, error) {
	m := &metricsCheck{reader: sdkmetric.NewManualReader(), local: map[string][]time.Time{}}
	m.provider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(m.reader))
	var err error
	m.obs, err = sluiceotel.New(m.provider, sluiceotel.Options{Names: true})
	return m, err
}

// configuredNames is how many names the limits workload configures, the
// same on every node: the Limiters of the four routes, of the gRPC
// interceptors and of the Checker (their prefixes), the gold plan's set,
// and the concurrency middleware.
const configuredNames = 4 + 1 + 1 + 1 + 1

// check reads every series and reports a "name" attribute that holds a
// client's key, or more names than configured.
func (w *world) checkMetrics() {
	m := w.metrics
	defer func() { _ = m.provider.Shutdown(context.Background()) }()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		w.hist.violation("metrics: collect: %v", err)
		return
	}
	names := map[string]bool{}
	series := 0
	add := func(set attribute.Set) {
		series++
		if v, ok := set.Value("name"); ok {
			names[v.AsString()] = true
		}
	}
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			switch d := md.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					add(p.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					add(p.Attributes)
				}
			}
		}
	}
	var clients []string
	for n := range names {
		if strings.Contains(n, "ak-") || strings.Contains(n, "~#") || strings.Contains(n, "100.") || strings.Contains(n, "2001:db8") {
			clients = append(clients, n)
		}
	}
	slices.Sort(clients)
	w.cfg.Logf("metrics: %d series, %d names", series, len(names))
	if len(clients) > 0 || len(names) > configuredNames {
		sample := clients[:min(len(clients), 3)]
		w.hist.violation("metrics: %d series with %d names (configured: %d); %d name a client, such as %q: series must be bounded by names, not clients",
			series, len(names), configuredNames, len(clients), sample)
	}
}
