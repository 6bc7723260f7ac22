package main

import (
	"context"
	"time"
)

// The interfaces below are all a workload knows about an implementation.
// Each adapter file (sluice_*.go, peer_*.go, raw_*.go) wraps one library in
// one of them and registers itself from init.
//
// Lockers and semaphores hand out per-name handles that one goroutine uses
// for its whole run, the way a program keeps its mutex value; creating the
// handle is setup, not part of the measured operation, and adapters need no
// per-operation closures that would pollute the allocation count.

// locker makes mutex handles.
type locker interface {
	Mutex(name string) (mutex, error)
}

// mutex is one goroutine's handle on a named lock.
type mutex interface {
	Lock(ctx context.Context) error
	Unlock(ctx context.Context) error
}

// semaphores makes semaphore handles.
type semaphores interface {
	Semaphore(name string, capacity int) (semaphore, error)
}

// semaphore is one goroutine's handle on a named counting semaphore; it
// holds at most one permit at a time.
type semaphore interface {
	Acquire(ctx context.Context) error
	Release(ctx context.Context) error
}

// limiter answers whether a request under key is allowed by the rate it was
// opened with.
type limiter interface {
	Allow(ctx context.Context, key string) (bool, error)
}

// rate is limit requests per window.
type rate struct {
	limit  int
	window time.Duration
}

// kind says what role an implementation plays in the comparison.
type kind string

const (
	ours      kind = "sluice"
	peer      kind = "peer"
	reference kind = "raw" // the same script without a library around it
)

// impl is one implementation of T.
type impl[T any] struct {
	name string
	kind kind
	// script is the Lua script (lua/NAME.lua) a limiter's Allow runs, so its
	// rate can be set against the server's ceiling for that script.
	script string
	// only, if set, says in which workloads (by name) it takes part; nil:
	// in every one of its group.
	only func(workload string) bool
	// open makes a new instance with its own clients, as one more program
	// would, and returns the function that closes them. r is only used by
	// limiters.
	open func(ctx context.Context, s *server, r rate) (T, func(), error)
}

// The registries, filled by the adapter files' init functions.
var (
	lockImpls      []impl[locker]
	semaphoreImpls []impl[semaphores]
	limiterImpls   []impl[limiter]
)
