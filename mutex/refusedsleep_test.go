package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// TestRefusedLockSleepsOnTheLease: a Lock refused by a holder waits for a
// wake-up, or for the end of the lease the refusal gave it (the holder's
// PTTL), not in a loop of attempts. While a holder keeps the lock for a
// minute, a waiter that gives up after half a second makes a handful of
// calls (its attempt, one more once its subscription is confirmed, its
// give-back), whatever the machine's load; one that took the refusal's
// milliseconds for nanoseconds (or any wait of about nothing) would try
// hundreds of times. The other way, the wait is not too long: the
// waiter's Lock returns when its context ends.
func TestRefusedLockSleepsOnTheLease(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	name := "refusedsleep"
	holders := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{Lease: time.Minute})
	waiters := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{Lease: time.Minute})
	holder := newMutex(t, holders, name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	calls := func() int64 {
		c := commandCalls(t, srv)
		return c["evalsha"] + c["eval"]
	}
	before := calls()
	wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	err := newMutex(t, waiters, name).Lock(wctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock under a holder's minute-long lease = %v, want its context's deadline", err)
	}
	if n := calls() - before; n > 8 {
		t.Fatalf("a waiter refused under a minute-long lease made %d script calls in half a second, want a few", n)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
