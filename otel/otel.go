// Package sluiceotel records what sluice's primitives do as OpenTelemetry
// metrics. It is a sluice.Observer:
//
//	obs, err := sluiceotel.New(otel.GetMeterProvider(), sluiceotel.Options{})
//	client, err := sluice.New(ctx, rdb, sluice.WithObserver(obs))
//
// and every mutex.Locker, semaphore.Manager and ratelimit.Limiter made from
// client reports through it. The instruments (seconds for durations):
//
//	sluice.lock.wait                histogram  time from Lock to the grant  {primitive}
//	sluice.lock.hold                histogram  time from the grant to the release  {primitive}
//	sluice.lock.handoffs            counter    grants handed over by a fair release  {primitive}
//	sluice.lock.failures            counter    acquisitions that failed  {primitive, reason}
//	sluice.lock.losses              counter    holds lost before release  {primitive, reason}
//	sluice.semaphore.wait           histogram  as sluice.lock.wait, for permits  {primitive}
//	sluice.semaphore.hold           histogram  {primitive}
//	sluice.semaphore.handoffs       counter    {primitive}
//	sluice.semaphore.failures       counter    {primitive, reason}
//	sluice.semaphore.losses         counter    {primitive, reason}
//	sluice.ratelimit.decisions      counter    requests decided  {allowed, source}
//	sluice.ratelimit.fallbacks      counter    requests Redis could not decide  {mode}
//	sluice.script.reloads           counter    scripts loaded again after NOSCRIPT  {script, failed}
//	sluice.subscription.errors      counter    pub/sub subscriptions refused or dropped  {primitive, reason}
//	sluice.subscription.resubscribes counter   subscriptions re-established after a drop  {primitive}
//
// Primitive is mutex, rwmutex or multimutex for locks, semaphore for
// permits. A decision counts one request whatever its cost. Reasons are the
// scriptcache Reason constants, sources and modes the names of
// sluice.Source (redis, deny_cache, local; fail_open, fail_closed,
// local). Every attribute takes a handful of values, so the number of
// series is fixed, unless Options.Names adds the lock, semaphore or limit
// name, which makes one series per name. Those names come from the
// configuration, never from a request: a rate limiter reports its key
// prefix or policy names, never a client's key, and the concurrency
// middleware's per-client semaphores the prefix their names share (see
// semaphore.WithEventName for semaphores of your own named after request
// data).
package sluiceotel

import (
	"context"
	"errors"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicekit/sluice"
)

// ScopeName is the instrumentation scope of the instruments.
const ScopeName = "github.com/sluicekit/sluice/otel"

// Options configures New. The zero value is the default.
type Options struct {
	// Names adds attribute "name": the lock or semaphore name (or its
	// semaphore.WithEventName), or for a rate limiter its key prefix
	// (Allow) or policy names (AllowPolicies), for the concurrency
	// middleware the prefix of its semaphores. Use it only when names are
	// few: each makes its own series, and an entry in the Observer's
	// memory for as long as it lives.
	Names bool
	// Buckets are the histogram bucket boundaries, in seconds. Default
	// DefaultBuckets().
	Buckets []float64
}

// DefaultBuckets returns the histogram boundaries, in seconds, from half a
// millisecond to a minute, in a new slice on each call (a variable could be
// changed by any importer, for every other).
func DefaultBuckets() []float64 {
	return []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
}

// ErrNilMeterProvider is returned by New for a nil MeterProvider.
var ErrNilMeterProvider = errors.New("sluiceotel: nil MeterProvider")

// Observer records sluice's events as metrics; it implements
// sluice.Observer. It is safe for concurrent use.
type Observer struct {
	names bool

	lockWait, lockHold, semWait, semHold            metric.Float64Histogram
	lockHandoffs, lockFailures, lockLosses          metric.Int64Counter
	semHandoffs, semFailures, semLosses             metric.Int64Counter
	decisions, fallbacks, reloads, subErrors, resub metric.Int64Counter

	mu   sync.RWMutex
	sets map[attrKey]metric.MeasurementOption // guarded by mu
}

// attrKey identifies one attribute set.
type attrKey struct {
	kind      sluice.EventKind
	primitive string
	name      string
	reason    string
	source    sluice.Source
	flag      bool // allowed, or a failed reload
}

// New returns an Observer whose instruments come from mp's meter
// ScopeName.
func New(mp metric.MeterProvider, opts Options) (*Observer, error) {
	if mp == nil {
		return nil, ErrNilMeterProvider
	}
	buckets := opts.Buckets
	if len(buckets) == 0 {
		buckets = DefaultBuckets()
	}
	m := mp.Meter(ScopeName)
	o := &Observer{names: opts.Names, sets: make(map[attrKey]metric.MeasurementOption)}
	var errs []error
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	counter := func(name, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit("{"+unitOf(name)+"}"), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	o.lockWait = hist("sluice.lock.wait", "Time from a Lock call to the grant.")
	o.lockHold = hist("sluice.lock.hold", "Time a lock was held, from its grant to its release.")
	o.lockHandoffs = counter("sluice.lock.handoffs", "Locks handed over directly by a fair release.")
	o.lockFailures = counter("sluice.lock.failures", "Lock acquisitions that failed, by reason.")
	o.lockLosses = counter("sluice.lock.losses", "Held locks lost before their release, by reason.")
	o.semWait = hist("sluice.semaphore.wait", "Time from an Acquire call to the grant.")
	o.semHold = hist("sluice.semaphore.hold", "Time permits were held, from their grant to their release.")
	o.semHandoffs = counter("sluice.semaphore.handoffs", "Permits handed over directly by a fair release.")
	o.semFailures = counter("sluice.semaphore.failures", "Permit acquisitions that failed, by reason.")
	o.semLosses = counter("sluice.semaphore.losses", "Held permits lost before their release, by reason.")
	o.decisions = counter("sluice.ratelimit.decisions", "Rate-limited requests decided, by outcome and source.")
	o.fallbacks = counter("sluice.ratelimit.fallbacks", "Requests Redis could not decide in time, by the fallback that did.")
	o.reloads = counter("sluice.script.reloads", "Scripts loaded again after NOSCRIPT.")
	o.subErrors = counter("sluice.subscription.errors", "Pub/sub subscriptions refused or dropped.")
	o.resub = counter("sluice.subscription.resubscribes", "Pub/sub subscriptions re-established after a drop.")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return o, nil
}

// unitOf is the annotation of a counter's unit: its last name part.
func unitOf(name string) string {
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '.' {
			return name[i+1:]
		}
	}
	return name
}

// Observe records e. It implements sluice.Observer.
func (o *Observer) Observe(e sluice.Event) {
	ctx := context.Background()
	sem := e.Primitive == sluice.PrimitiveSemaphore
	switch e.Kind {
	case sluice.EventAcquired:
		attrs := o.attrs(attrKey{kind: e.Kind, primitive: e.Primitive, name: e.Name})
		if sem {
			o.semWait.Record(ctx, e.Wait.Seconds(), attrs)
		} else {
			o.lockWait.Record(ctx, e.Wait.Seconds(), attrs)
		}
		if e.Handoff {
			if sem {
				o.semHandoffs.Add(ctx, 1, attrs)
			} else {
				o.lockHandoffs.Add(ctx, 1, attrs)
			}
		}
	case sluice.EventAcquireFailed:
		attrs := o.attrs(attrKey{kind: e.Kind, primitive: e.Primitive, name: e.Name, reason: e.Reason})
		if sem {
			o.semFailures.Add(ctx, 1, attrs)
		} else {
			o.lockFailures.Add(ctx, 1, attrs)
		}
	case sluice.EventReleased:
		attrs := o.attrs(attrKey{kind: e.Kind, primitive: e.Primitive, name: e.Name})
		if sem {
			o.semHold.Record(ctx, e.Hold.Seconds(), attrs)
		} else {
			o.lockHold.Record(ctx, e.Hold.Seconds(), attrs)
		}
	case sluice.EventLost:
		attrs := o.attrs(attrKey{kind: e.Kind, primitive: e.Primitive, name: e.Name, reason: e.Reason})
		if sem {
			o.semLosses.Add(ctx, 1, attrs)
		} else {
			o.lockLosses.Add(ctx, 1, attrs)
		}
	case sluice.EventDecision:
		o.decisions.Add(ctx, 1, o.attrs(attrKey{kind: e.Kind, name: e.Name, source: e.Source, flag: e.Allowed}))
	case sluice.EventFallback:
		o.fallbacks.Add(ctx, 1, o.attrs(attrKey{kind: e.Kind, name: e.Name, source: e.Source}))
	case sluice.EventScriptReload:
		o.reloads.Add(ctx, 1, o.attrs(attrKey{kind: e.Kind, name: e.Name, flag: e.Err != nil}))
	case sluice.EventSubscription:
		if e.Reason == sluice.ReasonResubscribed {
			o.resub.Add(ctx, 1, o.attrs(attrKey{kind: e.Kind, primitive: e.Primitive, reason: e.Reason}))
		} else {
			o.subErrors.Add(ctx, 1, o.attrs(attrKey{kind: e.Kind, primitive: e.Primitive, reason: e.Reason}))
		}
	}
}

// attrs returns the attribute option of k, made once per distinct k.
func (o *Observer) attrs(k attrKey) metric.MeasurementOption {
	if !o.names && k.kind != sluice.EventScriptReload {
		k.name = ""
	}
	o.mu.RLock()
	opt, ok := o.sets[k]
	o.mu.RUnlock()
	if ok {
		return opt
	}
	var kv []attribute.KeyValue
	switch k.kind {
	case sluice.EventScriptReload:
		kv = append(kv, attribute.String("script", k.name), attribute.Bool("failed", k.flag))
	case sluice.EventDecision:
		kv = append(kv, attribute.Bool("allowed", k.flag), attribute.String("source", k.source.String()))
	case sluice.EventFallback:
		kv = append(kv, attribute.String("mode", k.source.String()))
	default:
		if k.primitive != "" {
			kv = append(kv, attribute.String("primitive", k.primitive))
		}
		if k.reason != "" {
			kv = append(kv, attribute.String("reason", k.reason))
		}
	}
	if o.names && k.name != "" && k.kind != sluice.EventScriptReload {
		kv = append(kv, attribute.String("name", k.name))
	}
	opt = metric.WithAttributeSet(attribute.NewSet(kv...))
	o.mu.Lock()
	o.sets[k] = opt
	o.mu.Unlock()
	return opt
}
