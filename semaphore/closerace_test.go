package semaphore_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// closeRaceClient holds the first script call on a name made after arm until fail
// is closed, then answers it with a reset connection, and holds the end
// of its subscriptions (after their contexts ended) until unsub is
// closed: a Manager's Close then waits for its subscriptions while the
// call fails on its own.
type closeRaceClient struct {
	scriptcache.Client
	mu       sync.Mutex
	armed    string        // hold the next call with a key that contains it
	sent     chan struct{} // closed when the held call is sent
	fail     chan struct{} // close to fail the held call
	subUp    chan struct{} // closed when a subscription is confirmed
	subEnded chan struct{} // closed when a subscription's context has ended
	unsub    chan struct{} // close to let subscriptions return
	upOnce   sync.Once
	endOnce  sync.Once
}

func newCloseRaceClient(c scriptcache.Client) *closeRaceClient {
	return &closeRaceClient{Client: c, sent: make(chan struct{}), fail: make(chan struct{}),
		subUp: make(chan struct{}), subEnded: make(chan struct{}), unsub: make(chan struct{})}
}

func (c *closeRaceClient) arm(name string) {
	c.mu.Lock()
	c.armed = name
	c.mu.Unlock()
}

func (c *closeRaceClient) Eval(ctx context.Context, sha, body string, keys, args []string) scriptcache.Reply {
	c.mu.Lock()
	hold := c.armed != "" && slices.ContainsFunc(keys, func(k string) bool { return strings.Contains(k, c.armed) })
	if hold {
		c.armed = ""
	}
	c.mu.Unlock()
	if !hold {
		return c.Client.Eval(ctx, sha, body, keys, args)
	}
	close(c.sent)
	<-c.fail
	return scriptcache.ErrorReply(&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET})
}

func (c *closeRaceClient) Subscribe(ctx context.Context, channel string, sharded bool, subscribed func(), message func(string)) error {
	err := c.Client.Subscribe(ctx, channel, sharded, func() {
		c.upOnce.Do(func() { close(c.subUp) })
		subscribed()
	}, message)
	if ctx.Err() != nil {
		c.endOnce.Do(func() { close(c.subEnded) })
		<-c.unsub
	}
	return err
}

// TestAcquireFailingDuringCloseReturnsErrClosed: an Acquire whose call is
// on its way when its Manager's Close begins, and then fails on its own (a
// reset connection, or the client's timeout against a stopped server)
// before Close gives it up, was waiting when the Manager closed: it must
// return ErrClosed, as Close promises. Before, it returned the call's
// error (the fault harness: "an Acquire in flight to a stopped server
// returned ... context deadline exceeded at its Manager's Close, not
// ErrClosed"): Close stops the subscriptions and the leases before it
// gives up the calls in flight, and a call failing meanwhile was reported
// as it failed.
func TestAcquireFailingDuringCloseReturnsErrClosed(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	sc0, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	c := newCloseRaceClient(sc0.Client())
	sc, err := scriptcache.NewFrom(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := semaphore.NewManager(sc, semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgr.Close)
	other := newEnv(t, []string{srv.Addr()}, semaphore.Options{})

	// B waits on a semaphore another process holds: mgr subscribes.
	busy := uniqueName(t) + ".busy"
	holder, err := other.sem(t, busy, 1).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	sB, err := mgr.NewSemaphore(busy, 1)
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, signalWait)
	defer cancel()
	bDone := make(chan error, 1)
	go func() {
		_, err := sB.Acquire(actx, 1)
		bDone <- err
	}()
	waitChan(t, c.subUp, "B's subscription")

	// A's first call is on its way when Close begins.
	nameA := uniqueName(t) + ".a"
	sA, err := mgr.NewSemaphore(nameA, 1)
	if err != nil {
		t.Fatal(err)
	}
	c.arm(nameA)
	aDone := make(chan error, 1)
	go func() {
		_, err := sA.Acquire(actx, 1)
		aDone <- err
	}()
	waitChan(t, c.sent, "A's call")
	closed := make(chan struct{})
	go func() {
		mgr.Close()
		close(closed)
	}()
	waitChan(t, c.subEnded, "Close to end the subscription")
	close(c.fail) // A's call fails on its own while Close waits
	var errA error
	select {
	case errA = <-aDone:
	case <-time.After(signalWait):
		close(c.unsub)
		t.Fatal("A's Acquire did not return")
	}
	close(c.unsub)
	waitChan(t, closed, "Close")
	if err := <-bDone; !errors.Is(err, semaphore.ErrClosed) {
		t.Errorf("B's Acquire = %v, want ErrClosed", err)
	}
	if !errors.Is(errA, semaphore.ErrClosed) {
		t.Errorf("A's Acquire = %v, want ErrClosed", errA)
	}
}
