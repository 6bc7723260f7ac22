package semaphore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// gatedClient is a scriptcache.Client that holds back SUBSCRIBE until
// subGate is closed (a slow pub/sub connection: a dial, a busy node), and
// can hold back the script call numbered holdEval (counting only calls
// with keys) until evalGate is closed. It tells, on evalBack, when that
// held call has returned.
type gatedClient struct {
	scriptcache.Client
	subGate chan struct{}

	mu       sync.Mutex
	evals    int
	holdEval int
	held     chan struct{} // closed when call holdEval arrives
	evalGate chan struct{}
	evalBack chan struct{} // closed when call holdEval has returned
}

func (g *gatedClient) Eval(ctx context.Context, sha, body string, keys, args []string) scriptcache.Reply {
	if len(keys) == 0 {
		return g.Client.Eval(ctx, sha, body, keys, args)
	}
	g.mu.Lock()
	g.evals++
	mine := g.evals == g.holdEval
	g.mu.Unlock()
	if !mine {
		return g.Client.Eval(ctx, sha, body, keys, args)
	}
	close(g.held)
	<-g.evalGate
	r := g.Client.Eval(ctx, sha, body, keys, args)
	close(g.evalBack)
	return r
}

func (g *gatedClient) Subscribe(ctx context.Context, channel string, sharded bool, subscribed func(), message func(string)) error {
	select {
	case <-g.subGate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Client.Subscribe(ctx, channel, sharded, subscribed, message)
}

// TestWakeupAfterUnconfirmedSubscription: a (non-fair) waiting Acquire
// waits for its subscription to be confirmed only as long as the first
// attempt's hint (the earliest permit expiry). When the subscription is
// slower than that, the second attempt runs unsubscribed and the waiter
// then sleeps on the second attempt's hint, which can be a whole lease. A
// release published before the subscription is confirmed never reaches the
// process, so the confirmation must wake the waiter (notify.Waiter.Ready);
// before it did, the waiter slept on although a permit was free.
func TestWakeupAfterUnconfirmedSubscription(t *testing.T) {
	addrs := []string{redistest.Single(t).Addr()}
	ctx := context.Background()

	// The waiter's process: its pub/sub is slow, and its second script
	// call is held until the test has arranged the semaphore.
	base := redistest.Client(t, addrs...)
	sc0, err := scriptcache.New(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedClient{Client: sc0.Client(), subGate: make(chan struct{}), holdEval: 2,
		held: make(chan struct{}), evalGate: make(chan struct{}), evalBack: make(chan struct{})}
	var openSub sync.Once
	t.Cleanup(func() { openSub.Do(func() { close(g.subGate) }) })
	sc, err := scriptcache.NewFrom(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	mgrW, err := semaphore.NewManager(sc, semaphore.Options{}) // 30 s watchdog lease
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgrW.Close)

	holders := newEnv(t, addrs, semaphore.Options{})                     // watchdog lease
	short := newEnv(t, addrs, semaphore.Options{Lease: 2 * time.Second}) // fixed, short
	name := uniqueName(t)
	sH := holders.sem(t, name, 2)
	sS := short.sem(t, name, 2)
	sW, err := mgrW.NewSemaphore(name, 2)
	if err != nil {
		t.Fatal(err)
	}

	b := acquire(t, sH, 1)
	a := acquire(t, sS, 1) // expires in 2 s: the first attempt's hint

	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	type result struct {
		p   *semaphore.Permit
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := sW.Acquire(wctx, 1)
		done <- result{p, err}
	}()

	// The waiter's first attempt failed (hint ~2 s), its subscription
	// is pending and Ready timed out on that hint: the second attempt is
	// here.
	select {
	case <-g.held:
	case r := <-done:
		t.Fatalf("Acquire returned (%v, %v) before its second attempt", r.p, r.err)
	case <-time.After(signalWait):
		t.Fatal("no second attempt")
	}
	// a's slot goes to a long-lived holder, so the second attempt fails
	// and hints at b's expiry, about 30 s away.
	if err := a.Release(ctx); err != nil && !errors.Is(err, semaphore.ErrNotHeld) {
		t.Fatal(err)
	}
	c := acquire(t, sH, 1)
	close(g.evalGate)
	select {
	case <-g.evalBack:
	case <-time.After(signalWait):
		t.Fatal("second attempt did not return")
	}
	// A permit is freed while the subscription is still unconfirmed, then
	// the subscription is confirmed.
	release(t, b)
	openSub.Do(func() { close(g.subGate) })

	// b's slot is free now and nothing else will publish: a waiter that
	// missed nothing takes it at once, not when a lease-sized timer fires.
	start := time.Now()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("Acquire: %v", r.err)
		}
		release(t, r.p)
	case <-time.After(signalWait):
		free, _ := sH.Available(ctx)
		ch := keyspace.Key(semaphore.DefaultPrefix, name, ":w")
		subs, _ := base.Do(ctx, base.B().PubsubNumsub().Channel(ch).Build()).AsIntMap()
		cancel()
		r := <-done
		t.Fatalf("lost wake-up: a permit was free (Available = %d) and the waiter's subscription confirmed "+
			"(NUMSUB = %d), but the waiting Acquire slept on; it returned (%v, %v) only when cancelled after %v",
			free, subs[ch], r.p, r.err, time.Since(start).Round(time.Millisecond))
	}
	release(t, c)
}
