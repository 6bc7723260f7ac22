package semaphore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/redistest"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// slowGrants is a scriptcache.Client for one process whose grant messages
// and script calls the test delays, as a slow network would: it counts the
// fair attempts answered (tell says when the count reaches a number), can
// hold script calls until they are let through (a call held this way has
// been sent, from the caller's view, and runs on the server only later),
// and can hold grant messages back until they are let through.
type slowGrants struct {
	scriptcache.Client

	mu       sync.Mutex
	answered int                   // fair attempts ("a") answered
	tell     map[int]chan struct{} // closed when answered reaches the key
	gate     chan struct{}         // non-nil: calls wait until it closes
	sentHeld chan struct{}         // closed when a fair attempt waits at the gate
	holding  bool
	held     []string // grant messages held back
	deliver  func(string)
}

func (c *slowGrants) at(n int) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tell == nil {
		c.tell = make(map[int]chan struct{})
	}
	ch := make(chan struct{})
	c.tell[n] = ch
	return ch
}

func (c *slowGrants) Eval(ctx context.Context, sha, body string, keys, args []string) scriptcache.Reply {
	attempt := len(keys) > 0 && len(args) > 0 && args[0] == "a"
	c.mu.Lock()
	gate := c.gate
	if gate != nil && attempt && c.sentHeld != nil {
		close(c.sentHeld)
		c.sentHeld = nil
	}
	c.mu.Unlock()
	if gate != nil && len(keys) > 0 {
		select {
		case <-gate:
		case <-ctx.Done():
			return scriptcache.ErrorReply(ctx.Err())
		}
	}
	r := c.Client.Eval(ctx, sha, body, keys, args)
	if attempt {
		c.mu.Lock()
		c.answered++
		if ch := c.tell[c.answered]; ch != nil {
			close(ch)
		}
		c.mu.Unlock()
	}
	return r
}

func (c *slowGrants) Subscribe(ctx context.Context, channel string, sharded bool, subscribed func(), message func(string)) error {
	return c.Client.Subscribe(ctx, channel, sharded, subscribed, func(payload string) {
		c.mu.Lock()
		if c.holding && strings.HasPrefix(payload, "g ") {
			c.held, c.deliver = append(c.held, payload), message
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		message(payload)
	})
}

// hold holds back script calls and grant messages from now on; sent is
// closed when a fair attempt is held.
func (c *slowGrants) hold() (sent <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gate, c.holding = make(chan struct{}), true
	c.sentHeld = make(chan struct{})
	return c.sentHeld
}

// letCallsThrough lets the held script calls run.
func (c *slowGrants) letCallsThrough() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.gate)
	c.gate = nil
}

// letGrantsThrough delivers the held grant messages.
func (c *slowGrants) letGrantsThrough() {
	c.mu.Lock()
	held, deliver := c.held, c.deliver
	c.held, c.holding = nil, false
	c.mu.Unlock()
	for _, p := range held {
		deliver(p)
	}
}

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
	c := &slowGrants{Client: sc0.Client()}
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
	queued := c.at(2)
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

	sent := c.hold()
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
	answered := c.at(3)
	next := c.at(4)
	c.letCallsThrough()
	waitChan(t, answered, "W's held attempt answered") // it queued W again
	c.letGrantsThrough()
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
