package semaphore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/internal/testkit/slowclient"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestLateGrantMessageIsNotAPermit: a fair release grants a waiting
// Acquire a permit whose message arrives after the permit's lease ended,
// and another process has the capacity by then. The keeper, late (held up
// here by another lease's loss callback, as a late timer would be), has not
// woken the waiter meanwhile. The grant is no permit: Acquire gives it back
// (leaving the other process's permit alone) and attempts again. Before,
// Acquire returned a permit Redis did not have.
func TestLateGrantMessageIsNotAPermit(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	sc0, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	c := &slowclient.Client{Client: sc0.Client(), Attempt: func(args []string) bool { return len(args) > 0 && args[0] == "a" }}
	sc, err := scriptcache.NewFrom(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := NewManager(sc, Options{Fair: true, WatchdogLease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mw.Close)
	mo := internalManager(t, srv.Addr(), Options{Fair: true})
	name := "late-grant:" + t.Name()
	sw, err := mw.NewSemaphore(name, 1)
	if err != nil {
		t.Fatal(err)
	}
	so, err := mo.NewSemaphore(name, 1)
	if err != nil {
		t.Fatal(err)
	}

	holder, err := so.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	queued := c.At(2) // its first attempt, and the one once subscribed
	wctx, cancel := context.WithTimeout(ctx, internalWait)
	defer cancel()
	type result struct {
		p   *Permit
		err error
	}
	got := make(chan result, 1)
	go func() {
		p, err := sw.Acquire(wctx, 1)
		got <- result{p, err}
	}()
	select {
	case <-queued:
	case <-time.After(internalWait):
		t.Fatal("W never queued")
	}
	stalled, unstall := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(unstall) }) // before the Manager's Close, which waits for it
	mw.keeper.Add(time.Now(), 30*time.Millisecond, nil, func(error) {
		close(stalled)
		<-unstall
	})
	<-stalled
	c.HoldGrants()
	if err := holder.Release(ctx); err != nil { // grants W the permit
		t.Fatal(err)
	}
	if h, err := so.Holders(ctx); err != nil || len(h) != 1 {
		t.Fatalf("Holders after the release = %v, %v; want W's permit", h, err)
	}
	if !redistest.WaitFor(ctx, internalWait, func() bool {
		h, err := so.Holders(ctx) // lists live permits only
		return err == nil && len(h) == 0
	}) {
		t.Fatal("W's granted permit never expired")
	}
	taker, err := so.TryAcquire(ctx, 1) // reclaims W's expired permit
	if err != nil {
		t.Fatalf("TryAcquire after W's grant expired: %v", err)
	}
	next := c.At(3)
	c.LetGrantsThrough()
	select {
	case r := <-got:
		t.Fatalf("W's Acquire took the late grant: (permit %t), %v; the other process holds the only permit", r.p != nil, r.err)
	case <-next: // W gave the grant back and asked Redis
	case <-time.After(internalWait):
		t.Fatal("W neither took the grant nor attempted")
	}
	cancel()
	if r := <-got; !errors.Is(r.err, ErrNotObtained) {
		t.Fatalf("W's Acquire = (permit %t), %v; want ErrNotObtained", r.p != nil, r.err)
	}
	if err := taker.Release(ctx); err != nil {
		t.Fatalf("the other process's Release = %v", err)
	}
}
