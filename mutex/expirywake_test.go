package mutex_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// TestExpiryOfWokenHoldWakesNextLocalWaiter: a release wakes one waiter
// per process; when the one woken takes the lock and its hold then runs
// out (no release, so nothing is published), the next waiter of its
// process must try when that lease ends, not sleep on the lease it saw
// at its own last attempt, the earlier holder's. Issue 32's soak (seed
// 1795930124742903205): a MultiMutex waiter served 1.6 s after the set
// that took the lock before it was left to expire.
func TestExpiryOfWokenHoldWakesNextLocalWaiter(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	name := "expirywake:" + t.Name()
	channel := mutex.DefaultPrefix + "{" + name + "}:w"
	// The holder is another process; the two waiters share one Locker.
	holderL := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{Lease: time.Minute})
	waiters := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{Lease: time.Minute})
	holder := newMutex(t, holderL, name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// first waits first, so the release wakes it; it holds for 300 ms
	// and is left to expire.
	first := newMutex(t, waiters, name, mutex.WithLease(300*time.Millisecond))
	firstErr := make(chan error, 1)
	go func() { firstErr <- first.Lock(ctx) }()
	if !redistest.WaitFor(ctx, signal, func() bool {
		out, _ := srv.Do("PUBSUB", "NUMSUB", channel)
		return out != "" && !strings.HasSuffix(out, "\n0")
	}) {
		t.Fatal("the first waiter never subscribed")
	}
	second := newMutex(t, waiters, name)
	before := commandCalls(t, srv)["evalsha"]
	// A deadline far shorter than the holder's minute: a second waiter
	// that sleeps on the holder's lease fails.
	sctx, cancel := context.WithTimeout(ctx, signal)
	defer cancel()
	secondErr := make(chan error, 1)
	go func() { secondErr <- second.Lock(sctx) }()
	if !redistest.WaitFor(ctx, signal, func() bool {
		return commandCalls(t, srv)["evalsha"] > before
	}) {
		t.Fatal("the second waiter made no attempt")
	}
	// Both refused (the second registered behind the first before its
	// attempt, the subscription being up): release.
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-firstErr; err != nil {
		t.Fatalf("the first waiter: %v", err)
	}
	released := time.Now()
	if err := <-secondErr; err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the second waiter was not served %v after the first's 300 ms lease began (the holder's lease was a minute): %v", time.Since(released).Round(time.Millisecond), err)
		}
		t.Fatal(err)
	}
	t.Logf("the second waiter got the lock %v after the first's grant", time.Since(released).Round(time.Millisecond))
	if err := second.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
