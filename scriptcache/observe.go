package scriptcache

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Observer is told what the primitives built on a Cache do: acquisitions
// with their wait, releases with their hold time, losses with their reason,
// script reloads, subscription trouble, rate-limit decisions and fallbacks.
// Set one with WithObserver; every mutex.Locker, semaphore.Manager and
// ratelimit.Limiter made from the Cache reports to it.
//
// Observe is called synchronously, on the goroutine that did the work (a
// Lock, a renewal, a subscription), sometimes while sluice holds a lock of
// its own. It must be fast, must not block and must not call back into
// sluice; an observer that needs to do more hands the Event to its own
// goroutine. It may be called concurrently. Events are passed by value and
// the Observer may keep them.
//
// Without an observer and a logger, the primitives do not build events at
// all: the cost is one nil check.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to an Observer.
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }

// EventKind says what an Event reports.
type EventKind uint8

// Event kinds. The fields each kind sets are listed; others are zero.
const (
	// EventAcquired: a lock or permits were acquired (outermost
	// acquisitions only, not nested ones). Wait is the time from the call
	// to the grant; Handoff is true when a fair release handed it over
	// directly; Weight is the permits taken (1 for locks).
	EventAcquired EventKind = iota + 1
	// EventAcquireFailed: an acquisition gave up or failed. Wait is the
	// time spent; Reason is one of ReasonTimeout, ReasonCanceled, ReasonBusy
	// (a TryLock or TryAcquire found it taken), ReasonClosed,
	// ReasonRefused, ReasonNotReplicated or ReasonError; Err is the error
	// returned (nil for ReasonBusy).
	EventAcquireFailed
	// EventReleased: a hold ended by its final release. Hold is the time
	// since the acquisition (counted from when its request was sent);
	// Weight as for EventAcquired.
	EventReleased
	// EventLost: a hold was lost before it was released. Reason is one of
	// ReasonExpired, ReasonGone, ReasonClosed or ReasonNotHeld; Err is the
	// error the holder sees (wrapping the primitive's ErrLost); Hold is how
	// long it had been held.
	EventLost
	// EventScriptReload: Redis answered NOSCRIPT (restart, SCRIPT FLUSH,
	// failover) and the script was loaded again. Name is the script's
	// name; Err is set if the load failed (the call then fell back to
	// EVAL).
	EventScriptReload
	// EventSubscription: trouble with the pub/sub subscription waiters
	// rely on. Name is the channel; Reason is ReasonRefused (the server
	// refused it, Err says why: waiters fail), ReasonDropped (the
	// connection failed, Err says why; it is retried with backoff; a
	// client that re-subscribes by itself, as rueidis does, reports no
	// drop) or ReasonResubscribed (back after a drop: waiters try again).
	EventSubscription
	// EventDecision: a rate limiter decided a request. Allowed, Weight (the
	// cost), and Source (SourceRedis, SourceDenyCache or SourceLocal).
	EventDecision
	// EventFallback: Redis could not decide a request in time and a
	// fallback did. Source is SourceLocal (the local limiter took over
	// after this error; its decisions follow as EventDecision),
	// SourceFailOpen (passed unlimited) or SourceFailClosed (refused);
	// Err is Redis's error.
	EventFallback
)

var kindNames = [...]string{
	EventAcquired:      "acquired",
	EventAcquireFailed: "acquire_failed",
	EventReleased:      "released",
	EventLost:          "lost",
	EventScriptReload:  "script_reload",
	EventSubscription:  "subscription",
	EventDecision:      "decision",
	EventFallback:      "fallback",
}

// String returns the kind's name, such as "acquired".
func (k EventKind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return "unknown"
}

// Source says who decided a rate-limited request.
type Source uint8

// Sources of decisions and fallbacks.
const (
	SourceNone       Source = iota
	SourceRedis             // the limiter's script
	SourceDenyCache         // the limiter's local cache of recent denials
	SourceLocal             // the in-process fallback limiter (FallbackLocal)
	SourceFailOpen          // Redis failed, the request passed unlimited
	SourceFailClosed        // Redis failed, the request was refused
)

var sourceNames = [...]string{
	SourceNone:       "",
	SourceRedis:      "redis",
	SourceDenyCache:  "deny_cache",
	SourceLocal:      "local",
	SourceFailOpen:   "fail_open",
	SourceFailClosed: "fail_closed",
}

// String returns the source's name, such as "deny_cache".
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "unknown"
}

// Primitives, as Event.Primitive names them.
const (
	PrimitiveMutex      = "mutex"
	PrimitiveRWMutex    = "rwmutex"
	PrimitiveMultiMutex = "multimutex"
	PrimitiveSemaphore  = "semaphore"
	PrimitiveRateLimit  = "ratelimit"
	PrimitiveScript     = "script"
)

// Reasons, as Event.Reason names them. They are few, so they suit a metric
// label; Err carries the details.
const (
	ReasonTimeout       = "timeout"        // the context's deadline passed
	ReasonCanceled      = "canceled"       // the context was cancelled
	ReasonBusy          = "busy"           // a single try found it taken
	ReasonClosed        = "closed"         // the Locker or Manager was closed
	ReasonRefused       = "refused"        // Redis refused the subscription
	ReasonNotReplicated = "not_replicated" // too few replicas acknowledged
	ReasonError         = "error"          // any other error (Redis down)
	ReasonExpired       = "expired"        // renewals failed for a whole lease
	ReasonGone          = "gone"           // deleted, expired on the server or taken over
	ReasonNotHeld       = "not_held"       // a call found it no longer held
	ReasonDropped       = "dropped"        // the subscription's connection failed
	ReasonResubscribed  = "resubscribed"   // subscribed again after a drop
)

// Event is one thing a primitive reports to an Observer.
//
// Name is the name the application chose for a lock or semaphore, so a
// metric labelled with it has as many series as the application has
// names; adapters should make that label optional. A semaphore made with
// semaphore.WithEventName reports under that name instead. For a rate
// limiter it is never the per-client key (that would make one series per
// client): it is the Limiter's key prefix for Allow and AllowN, and the
// comma-separated policy names for AllowPolicies; the concurrency
// middleware's semaphores, one per client, report under the prefix their
// names share.
type Event struct {
	Kind      EventKind
	Primitive string // PrimitiveMutex, ...; see the constants
	Name      string
	Wait      time.Duration // EventAcquired, EventAcquireFailed
	Hold      time.Duration // EventReleased, EventLost
	Weight    int64         // permits or cost
	Handoff   bool          // EventAcquired: handed over by a fair release
	Allowed   bool          // EventDecision
	Source    Source        // EventDecision, EventFallback
	Reason    string        // see the Reason constants
	Err       error
}

// WithObserver makes every primitive built on the Cache report to o.
func WithObserver(o Observer) Option {
	return func(opts *options) { opts.observer = o }
}

// WithLogger makes sluice log notable events to l through log/slog: losses
// (Warn), refused subscriptions (Error), dropped ones (Warn), resubscriptions
// and script reloads (Info), and fallbacks (Warn). Decisions,
// acquisitions and releases are not logged. Records are sampled per kind:
// at most one a second for fallbacks, refusals and drops, which can come
// with every request during an outage, and ten a second for the others;
// the next record logged says how many were suppressed ("suppressed").
// Without WithLogger nothing is logged.
func WithLogger(l *slog.Logger) Option {
	return func(opts *options) { opts.logger = l }
}

// Observer returns what primitives built on c report to: the Observer of
// WithObserver and the logger of WithLogger together, or nil when neither
// was given. Primitives check for nil before building an Event.
func (c *Cache) Observer() Observer { return c.observer }

// newObserver combines o and l; nil if both are nil.
func newObserver(o Observer, l *slog.Logger) Observer {
	if l == nil {
		return o
	}
	return &logObserver{next: o, log: l, now: time.Now}
}

// logObserver passes events to next and logs the notable ones.
type logObserver struct {
	next Observer // may be nil
	log  *slog.Logger
	now  func() time.Time

	mu      sync.Mutex
	samples [len(kindNames) * 4]sample // by kind and reason slot; guarded by mu
}

// sample counts the records of one kind in the current second.
type sample struct {
	window     time.Time // start of the current one-second window
	logged     int       // records logged in it
	suppressed int       // records dropped since the last one logged
}

func (lo *logObserver) Observe(e Event) {
	if lo.next != nil {
		lo.next.Observe(e)
	}
	var level slog.Level
	var msg string
	burst, slot := 10, 0
	switch e.Kind {
	case EventLost:
		level, msg = slog.LevelWarn, "sluice: hold lost"
	case EventScriptReload:
		level, msg = slog.LevelInfo, "sluice: script reloaded after NOSCRIPT"
		if e.Err != nil {
			level, msg, slot = slog.LevelWarn, "sluice: script reload failed", 1
		}
	case EventSubscription:
		switch e.Reason {
		case ReasonRefused:
			level, msg, burst, slot = slog.LevelError, "sluice: subscription refused", 1, 1
		case ReasonDropped:
			level, msg, burst, slot = slog.LevelWarn, "sluice: subscription dropped", 1, 2
		default:
			level, msg = slog.LevelInfo, "sluice: resubscribed"
		}
	case EventFallback:
		level, msg, burst, slot = slog.LevelWarn, "sluice: rate limit fallback", 1, int(e.Source)%4
	default:
		return
	}
	ctx := context.Background()
	if !lo.log.Enabled(ctx, level) {
		return
	}
	suppressed, ok := lo.admit(int(e.Kind)*4+slot, burst)
	if !ok {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	if e.Primitive != "" {
		attrs = append(attrs, slog.String("primitive", e.Primitive))
	}
	if e.Name != "" {
		attrs = append(attrs, slog.String("name", e.Name))
	}
	if e.Reason != "" {
		attrs = append(attrs, slog.String("reason", e.Reason))
	}
	if e.Source != SourceNone {
		attrs = append(attrs, slog.String("source", e.Source.String()))
	}
	if e.Kind == EventLost {
		attrs = append(attrs, slog.Duration("held", e.Hold))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.Any("err", e.Err))
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	lo.log.LogAttrs(ctx, level, msg, attrs...)
}

// admit reports whether a record of slot may be logged now, at most burst
// a second, and how many were suppressed since the last one logged.
func (lo *logObserver) admit(slot, burst int) (int, bool) {
	now := lo.now()
	lo.mu.Lock()
	defer lo.mu.Unlock()
	s := &lo.samples[slot]
	if now.Sub(s.window) >= time.Second || now.Before(s.window) {
		s.window, s.logged = now, 0
	}
	if s.logged >= burst {
		s.suppressed++
		return 0, false
	}
	s.logged++
	n := s.suppressed
	s.suppressed = 0
	return n, true
}
