package rls

import (
	"context"
	"errors"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the instruments NewMetrics
// makes.
const ScopeName = "github.com/sluicekit/sluice/envoy/rls"

// Metrics is a Recorder on OpenTelemetry:
//
//	sluice.envoy.requests     counter  requests answered  {domain, code}
//	sluice.envoy.descriptors  counter  descriptors with a rule  {domain, rule, outcome}
//	sluice.envoy.reloads      counter  configuration loads  {result}
//
// code is ok, over_limit or error; outcome is the Outcome's name; rule is
// the rule's name, or its path of configured keys and values,
// never a value from a request (values are user data, without bound).
// domain is the request's domain, which Envoy's configuration sets.
type Metrics struct {
	requests, descriptors, reloads metric.Int64Counter

	mu   sync.RWMutex
	sets map[attrKey]metric.AddOption // guarded by mu
}

// ErrNilMeterProvider is returned by NewMetrics for a nil MeterProvider.
var ErrNilMeterProvider = errors.New("rls: nil MeterProvider")

// NewMetrics makes the instruments on mp.
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	if mp == nil {
		return nil, ErrNilMeterProvider
	}
	m := mp.Meter(ScopeName)
	r := &Metrics{sets: make(map[attrKey]metric.AddOption)}
	var err, e error
	if r.requests, e = m.Int64Counter("sluice.envoy.requests", metric.WithUnit("{request}"), metric.WithDescription("ShouldRateLimit requests answered")); e != nil {
		err = errors.Join(err, e)
	}
	if r.descriptors, e = m.Int64Counter("sluice.envoy.descriptors", metric.WithUnit("{descriptor}"), metric.WithDescription("descriptors with a rule, by outcome")); e != nil {
		err = errors.Join(err, e)
	}
	if r.reloads, e = m.Int64Counter("sluice.envoy.reloads", metric.WithUnit("{reload}"), metric.WithDescription("configuration loads, by result")); e != nil {
		err = errors.Join(err, e)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Request records a request's code.
func (r *Metrics) Request(domain string, code Code) {
	r.requests.Add(context.Background(), 1, r.attrs(attrKey{'q', domain, code.String(), ""}))
}

// Descriptor records a descriptor's outcome under its rule.
func (r *Metrics) Descriptor(domain, rule string, o Outcome) {
	r.descriptors.Add(context.Background(), 1, r.attrs(attrKey{'d', domain, rule, o.String()}))
}

// Reload records a configuration load: ok, or failed (the last good
// configuration stayed).
func (r *Metrics) Reload(ok bool) {
	result := "failed"
	if ok {
		result = "ok"
	}
	r.reloads.Add(context.Background(), 1, r.attrs(attrKey{'l', result, "", ""}))
}

// attrKey names an attribute set: its instrument ('q' requests, 'd'
// descriptors, 'l' loads) and values.
type attrKey struct {
	kind    byte
	a, b, c string
}

// attrs returns the attribute set of k, made once.
func (r *Metrics) attrs(k attrKey) metric.AddOption {
	r.mu.RLock()
	o, ok := r.sets[k]
	r.mu.RUnlock()
	if ok {
		return o
	}
	var set attribute.Set
	switch k.kind {
	case 'l':
		set = attribute.NewSet(attribute.String("result", k.a))
	case 'q':
		set = attribute.NewSet(attribute.String("domain", k.a), attribute.String("code", k.b))
	default:
		set = attribute.NewSet(attribute.String("domain", k.a), attribute.String("rule", k.b), attribute.String("outcome", k.c))
	}
	o = metric.WithAttributeSet(set)
	r.mu.Lock()
	r.sets[k] = o
	r.mu.Unlock()
	return o
}
