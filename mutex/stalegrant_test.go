package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/internal/testkit/slowclient"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

func waitChan(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(signal):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestStaleHandOffAfterRequeue: a fair waiter W is handed the lock while
// its network is slow: the hand-off's message and W's calls are held up.
// W's entry refreshes fail, so W attempts again, and that attempt reaches
// Redis only after the hand-off's lease ended there and another owner took
// the lock: it queues W again. The hand-off's message arrives after that
// attempt's answer. Before, W took it as live, with a lease counted from
// that attempt, and Lock returned nil with a token Redis had dropped while
// the other owner held the lock. (The fair semaphore had the same flaw;
// see semaphore's TestStaleGrantAfterRequeue.) An attempt answered after
// the lease counted from the entry's last known write may have found such
// a hand-off over, so the messages after it are not trusted: W attempts
// instead.
func TestStaleHandOffAfterRequeue(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	sc0, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	// W's fair attempts are mutex_lock's calls with ARGV[6] = "f".
	c := &slowclient.Client{Client: sc0.Client(), Attempt: func(args []string) bool { return len(args) == 4 && args[3] == "f" }}
	sc, err := scriptcache.NewFrom(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	lw, err := mutex.NewLocker(sc, mutex.Options{Fair: true, WatchdogLease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lw.Close)
	lo := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{Fair: true})
	name := "stale-handoff:" + t.Name()
	w := newMutex(t, lw, name)
	holder, taker := newMutex(t, lo, name), newMutex(t, lo, name)

	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// W queues: its first attempt, and the one after its subscription is
	// confirmed; then it waits.
	queued := c.At(2)
	wctx, cancel := context.WithTimeout(ctx, signal)
	defer cancel()
	got := make(chan error, 1)
	go func() { got <- w.Lock(wctx) }()
	waitChan(t, queued, "W queued")

	sent := c.Hold()
	if err := holder.Unlock(ctx); err != nil { // hands the lock to W
		t.Fatal(err)
	}
	if in, err := holder.Info(ctx); err != nil || in.Owner != w.Owner() {
		t.Fatalf("Info after the release = %+v, %v; want it handed to W", in, err)
	}
	// W's refreshes are held; when they have failed for its entry's lease
	// W attempts again, and that attempt is held too.
	waitChan(t, sent, "W's attempt after its refreshes failed")
	if !redistest.WaitFor(ctx, signal, func() bool {
		in, err := holder.Info(ctx)
		return err == nil && !in.Held
	}) {
		t.Fatal("the hand-off's lease never ended")
	}
	if err := taker.TryLock(ctx); err != nil {
		t.Fatalf("TryLock after the hand-off ended: %v", err)
	}
	answered := c.At(3)
	next := c.At(4)
	c.LetCallsThrough()
	waitChan(t, answered, "W's held attempt answered") // it queued W again
	c.LetGrantsThrough()
	select {
	case err := <-got:
		t.Fatalf("W's Lock took the stale hand-off: %v (token %d); the other owner holds the lock", err, w.Token())
	case <-next: // W did not trust the message and asked Redis
	case <-time.After(signal):
		t.Fatal("W neither took the hand-off nor attempted")
	}
	cancel()
	if err := <-got; !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("W's Lock = %v; want ErrNotObtained", err)
	}
	if err := taker.Unlock(ctx); err != nil {
		t.Fatalf("the other owner's Unlock = %v", err)
	}
}
