// Package sluice is where a program using sluice starts: New connects the
// scripts of every primitive to a Redis deployment, and the Client it
// returns is what the primitives are made from:
//
//	client, err := sluice.New(ctx, rdb) // rdb: a rueidis.Client
//	locks, err := mutex.NewLocker(client, mutex.Options{})
//	permits, err := semaphore.NewManager(client, semaphore.Options{})
//	limiter, err := ratelimit.New(client, ratelimit.Options{Limit: ratelimit.PerSecond(10)})
//
// On go-redis, goredis.New (module github.com/sluicekit/sluice/goredis)
// returns the same Client. WithObserver and WithLogger, given here, make
// every primitive built on the Client report what it does; module
// github.com/sluicekit/sluice/otel turns the reports into metrics.
//
// This package shows only what such a program needs. The machinery under
// the Client (loading the scripts, calling them with EVALSHA, the interface
// an adapter for another Redis client implements) is package scriptcache,
// for adapter authors and for running scripts of one's own.
package sluice

import (
	"context"
	"io/fs"
	"log/slog"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/scriptcache"
)

// Client runs sluice's scripts on one Redis deployment (a server, a
// cluster, or a primary behind Sentinel, as the underlying client is
// configured): every mutex.Locker, semaphore.Manager and ratelimit.Limiter
// is made from one. It is safe for concurrent use, holds no goroutine and
// needs no Close: closing the underlying client is the end of it.
//
// It is the type scriptcache calls Cache, under the name users hold;
// (*Client).Script runs a script of one's own given with WithScripts.
type Client = scriptcache.Cache

// New loads sluice's scripts into every node of client, a rueidis client,
// and returns the Client the primitives are made from. A rueidis client
// for sluice needs no special options (against miniredis, DisableCache and
// AlwaysRESP2). See scriptcache.New for how calls share its connections.
func New(ctx context.Context, client rueidis.Client, opts ...Option) (*Client, error) {
	return scriptcache.New(ctx, client, opts...)
}

// Option configures New (and goredis.New).
type Option = scriptcache.Option

// WithObserver makes every primitive built on the Client report to o.
func WithObserver(o Observer) Option { return scriptcache.WithObserver(o) }

// WithLogger makes sluice log notable events to l: losses, refused and
// dropped subscriptions, script reloads and fallbacks, sampled per kind
// (see scriptcache.WithLogger). Without it nothing is logged.
func WithLogger(l *slog.Logger) Option { return scriptcache.WithLogger(l) }

// WithScripts makes New read the scripts (NAME.lua) from fsys instead of
// sluice's package lua: fsys must hold sluice's scripts (lua.FS()) beside
// any of one's own, and a file named as one of sluice's replaces it. A
// program uses it to run scripts of its own with (*Client).Script on the
// same connections; tests use it to run a changed script.
func WithScripts(fsys fs.FS) Option { return scriptcache.WithFS(fsys) }

// Observer is told what the primitives built on a Client do; see
// scriptcache.Observer for when and how it is called (synchronously: it
// must be fast and must not block).
type Observer = scriptcache.Observer

// ObserverFunc adapts a function to an Observer.
type ObserverFunc = scriptcache.ObserverFunc

// Event is one thing a primitive reports to an Observer; its Kind says
// which fields are set (see scriptcache.EventKind's constants).
type Event = scriptcache.Event

// EventKind says what an Event reports.
type EventKind = scriptcache.EventKind

// The kinds of Event.
const (
	EventAcquired      = scriptcache.EventAcquired      // a lock or permits were acquired
	EventAcquireFailed = scriptcache.EventAcquireFailed // an acquisition gave up or failed
	EventReleased      = scriptcache.EventReleased      // a hold ended by its final release
	EventLost          = scriptcache.EventLost          // a hold was lost before its release
	EventScriptReload  = scriptcache.EventScriptReload  // NOSCRIPT: a script was loaded again
	EventSubscription  = scriptcache.EventSubscription  // pub/sub trouble for waiters
	EventDecision      = scriptcache.EventDecision      // a rate limiter decided a request
	EventFallback      = scriptcache.EventFallback      // Redis failed and a fallback decided
)

// Source says who decided a rate-limited request (Event.Source).
type Source = scriptcache.Source

// The sources of decisions and fallbacks.
const (
	SourceNone       = scriptcache.SourceNone
	SourceRedis      = scriptcache.SourceRedis      // the limiter's script
	SourceDenyCache  = scriptcache.SourceDenyCache  // the limiter's local cache of recent denials
	SourceLocal      = scriptcache.SourceLocal      // the in-process fallback limiter
	SourceFailOpen   = scriptcache.SourceFailOpen   // Redis failed, the request passed unlimited
	SourceFailClosed = scriptcache.SourceFailClosed // Redis failed, the request was refused
)

// The primitives an Event comes from (Event.Primitive).
const (
	PrimitiveMutex      = scriptcache.PrimitiveMutex
	PrimitiveRWMutex    = scriptcache.PrimitiveRWMutex
	PrimitiveMultiMutex = scriptcache.PrimitiveMultiMutex
	PrimitiveSemaphore  = scriptcache.PrimitiveSemaphore
	PrimitiveRateLimit  = scriptcache.PrimitiveRateLimit
	PrimitiveScript     = scriptcache.PrimitiveScript
)

// The reasons an Event gives (Event.Reason).
const (
	ReasonTimeout       = scriptcache.ReasonTimeout       // the context's deadline passed
	ReasonCanceled      = scriptcache.ReasonCanceled      // the context was cancelled
	ReasonBusy          = scriptcache.ReasonBusy          // a single try found it taken
	ReasonClosed        = scriptcache.ReasonClosed        // the Locker or Manager was closed
	ReasonRefused       = scriptcache.ReasonRefused       // Redis refused the subscription
	ReasonNotReplicated = scriptcache.ReasonNotReplicated // too few replicas acknowledged
	ReasonError         = scriptcache.ReasonError         // any other error (Redis down)
	ReasonExpired       = scriptcache.ReasonExpired       // renewals failed for a whole lease
	ReasonGone          = scriptcache.ReasonGone          // deleted, expired on the server or taken over
	ReasonNotHeld       = scriptcache.ReasonNotHeld       // a call found it no longer held
	ReasonDropped       = scriptcache.ReasonDropped       // the subscription's connection failed
	ReasonResubscribed  = scriptcache.ReasonResubscribed  // subscribed again after a drop
)
