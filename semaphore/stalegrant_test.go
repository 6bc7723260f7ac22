package semaphore_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/internal/testkit/slowclient"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

func waitChan(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(signalWait):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestStaleGrantAfterRequeue: a fair waiter W is granted a permit while its
// network is slow: the grant's message and W's calls are held up. W's entry
// refreshes fail, so W attempts again, and that attempt reaches Redis only
// after the granted permit expired (and another process took the capacity
// it freed): it queues W again. The grant's message arrives after that
// attempt's answer. Before, W took it as live, with a lease counted from
// that attempt, and Acquire returned a permit Redis did not have while the
// other process held the only one. An attempt answered after the lease
// counted from the entry's last known write may have found such a grant
// expired, so the messages after it are not trusted: W attempts instead.
func TestStaleGrantAfterRequeue(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	base := redistest.Client(t, srv.Addr())
	sc0, err := scriptcache.New(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	// W's fair attempts are the queue script's calls in mode "a".
	c := &slowclient.Client{Client: sc0.Client(), Attempt: func(args []string) bool { return len(args) > 0 && args[0] == "a" }}
	sc, err := scriptcache.NewFrom(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	mgrW, err := semaphore.NewManager(sc, semaphore.Options{Fair: true, WatchdogLease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgrW.Close)
	other := newEnv(t, []string{srv.Addr()}, semaphore.Options{Fair: true})
	name := uniqueName(t)
	sW, err := mgrW.NewSemaphore(name, 1)
	if err != nil {
		t.Fatal(err)
	}
	sO := other.sem(t, name, 1)

	holder, err := sO.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	// W queues: its first attempt, and the one after its subscription is
	// confirmed; then it waits.
	queued := c.At(2)
	wctx, cancel := context.WithTimeout(ctx, signalWait)
	defer cancel()
	type result struct {
		p   *semaphore.Permit
		err error
	}
	got := make(chan result, 1)
	go func() {
		p, err := sW.Acquire(wctx, 1)
		got <- result{p, err}
	}()
	waitChan(t, queued, "W queued")

	sent := c.Hold()
	if err := holder.Release(ctx); err != nil { // grants W the permit
		t.Fatal(err)
	}
	expiry := permitExpiry(t, other, name)
	// W's refreshes are held; when they have failed for its entry's lease
	// W attempts again, and that attempt is held too.
	waitChan(t, sent, "W's attempt after its refreshes failed")
	if !redistest.WaitFor(ctx, signalWait, func() bool { return serverMs(t, other) > expiry }) {
		t.Fatal("W's granted permit never expired")
	}
	taker, err := sO.TryAcquire(ctx, 1) // reclaims W's expired permit
	if err != nil {
		t.Fatalf("TryAcquire after W's grant expired: %v", err)
	}
	answered := c.At(3)
	next := c.At(4)
	c.LetCallsThrough()
	waitChan(t, answered, "W's held attempt answered") // it queued W again
	c.LetGrantsThrough()
	select {
	case r := <-got:
		t.Fatalf("W's Acquire took the expired grant: (permit %t), %v; the other process holds the only permit", r.p != nil, r.err)
	case <-next: // W did not trust the message and asked Redis
	case <-time.After(signalWait):
		t.Fatal("W neither took the grant nor attempted")
	}
	cancel()
	if r := <-got; !errors.Is(r.err, semaphore.ErrNotObtained) {
		t.Fatalf("W's Acquire = (permit %t), %v; want ErrNotObtained", r.p != nil, r.err)
	}
	if err := taker.Release(ctx); err != nil {
		t.Fatalf("the other process's Release = %v", err)
	}
}

// permitExpiry returns the expiry (server ms) of the one permit of name.
func permitExpiry(t *testing.T, e *env, name string) int64 {
	t.Helper()
	key := keyspace.Key(e.prefix, name, ":e")
	vals, err := e.client.Do(context.Background(), e.client.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
	if err != nil || len(vals) != 1 {
		t.Fatalf("permits of %s: %v, %v; want one", name, vals, err)
	}
	return int64(vals[0].Score)
}

// serverMs returns the server's clock in milliseconds.
func serverMs(t *testing.T, e *env) int64 {
	t.Helper()
	v, err := e.client.Do(context.Background(), e.client.B().Time().Build()).AsStrSlice()
	if err != nil || len(v) != 2 {
		t.Fatalf("TIME: %v, %v", v, err)
	}
	s, err1 := strconv.ParseInt(v[0], 10, 64)
	us, err2 := strconv.ParseInt(v[1], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("TIME: %v", v)
	}
	return s*1000 + us/1000
}
