package mutex

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/internal/testkit/slowclient"
	"github.com/sluicekit/sluice/scriptcache"
)

// lateClient is a scriptcache.Client that, once armed, holds back the
// reply of the next script call: the call runs on the server at once, and
// its answer reaches the caller only when gate is closed, as a reply slowed
// down on its way back would.
type lateClient struct {
	scriptcache.Client
	mu    sync.Mutex
	armed bool
	ran   chan struct{} // closed when the held call has run on the server
	gate  chan struct{}
}

func (c *lateClient) Eval(ctx context.Context, sha, body string, keys, args []string) scriptcache.Reply {
	c.mu.Lock()
	mine := c.armed && len(keys) > 0
	c.armed = c.armed && !mine
	c.mu.Unlock()
	r := c.Client.Eval(ctx, sha, body, keys, args)
	if mine {
		close(c.ran)
		<-c.gate
	}
	return r
}

// TestLateNestedLockIsLoss: a nested Lock leaves the lease alone, so its
// answer extends nothing. One that comes after the outer hold's lease ended
// on the client must report the loss, even if the keeper, late (a loaded
// machine), has not declared it yet: otherwise Lock returns nil for a hold
// the server may already have given to someone else. The keeper is held up
// here by another lease's loss callback, as a late timer would hold it up;
// the nested Lock runs on the server while the hold lives, and its answer
// is held back until the client's deadline of the hold has passed.
func TestLateNestedLockIsLoss(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	sc0, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	c := &lateClient{Client: sc0.Client(), ran: make(chan struct{}), gate: make(chan struct{})}
	sc, err := scriptcache.NewFrom(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLocker(sc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	m, err := l.NewMutex("late-nested:"+t.Name(), WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	stallKeeper(t, func(f func(error)) { l.keeper.Add(time.Now(), 30*time.Millisecond, nil, f) })
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	deadline := m.lse.Deadline()
	m.mu.Unlock()
	c.mu.Lock()
	c.armed = true
	c.mu.Unlock()
	got := make(chan error, 1)
	go func() { got <- m.Lock(ctx) }()
	<-c.ran
	time.Sleep(time.Until(deadline) + time.Millisecond) // the scenario: the answer comes after it
	close(c.gate)
	if err := <-got; !errors.Is(err, ErrLost) {
		t.Fatalf("nested Lock answered after the hold's lease = %v, want ErrLost", err)
	}
	select {
	case <-m.Lost():
	default:
		t.Fatal("Lost not closed")
	}
	if h := m.Holds(); h != 0 {
		t.Fatalf("Holds() = %d, want 0", h)
	}
	if err := m.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("Unlock after the loss = %v, want ErrNotHeld", err)
	}
	if info, err := m.Info(ctx); err != nil || info.Held {
		t.Fatalf("Info = %+v, %v; want the orphan given back", info, err)
	}
}

// TestLateNestedRWLockIsLoss is TestLateNestedLockIsLoss for the write
// and read holds of an RWMutex.
func TestLateNestedRWLockIsLoss(t *testing.T) {
	for _, write := range []bool{true, false} {
		t.Run(kind(write), func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Single(t)
			sc0, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()))
			if err != nil {
				t.Fatal(err)
			}
			c := &lateClient{Client: sc0.Client(), ran: make(chan struct{}), gate: make(chan struct{})}
			sc, err := scriptcache.NewFrom(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			l, err := NewLocker(sc, Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			rw, err := l.NewRWMutex("late-nested:"+t.Name(), WithLease(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			lock := rw.Lock
			if !write {
				lock = rw.RLock
			}
			stallKeeper(t, func(f func(error)) { l.keeper.Add(time.Now(), 30*time.Millisecond, nil, f) })
			if err := lock(ctx); err != nil {
				t.Fatal(err)
			}
			rw.mu.Lock()
			deadline := rw.side(write).lse.Deadline()
			rw.mu.Unlock()
			c.mu.Lock()
			c.armed = true
			c.mu.Unlock()
			got := make(chan error, 1)
			go func() { got <- lock(ctx) }()
			<-c.ran
			time.Sleep(time.Until(deadline) + time.Millisecond) // the scenario: the answer comes after it
			close(c.gate)
			if err := <-got; !errors.Is(err, ErrLost) {
				t.Fatalf("nested lock answered after the hold's lease = %v, want ErrLost", err)
			}
			if w, r := rw.Holds(); w != 0 || r != 0 {
				t.Fatalf("Holds() = %d, %d, want 0, 0", w, r)
			}
		})
	}
}

// stallKeeper holds up a keeper's scheduler, as a late timer on a loaded
// machine would, until the test ends: add gives the keeper a short lease
// whose loss callback blocks it.
func stallKeeper(t *testing.T, add func(onLost func(error))) {
	t.Helper()
	stalled, unstall := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(unstall) }) // before the Locker's Close, which waits for it
	add(func(error) {
		close(stalled)
		<-unstall
	})
	<-stalled
}

// TestLateHandOffMessageIsNotAHold: a fair release hands the lock to a
// waiting Lock whose message arrives after the hand-off's lease ended, and
// another owner has the lock by then. The keeper, late, has not woken the
// waiter meanwhile. The grant is no hold: the Lock gives it back (leaving
// the other owner's hold alone) and attempts again. Before, Lock returned
// nil with a token Redis had dropped.
func TestLateHandOffMessageIsNotAHold(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	sc0, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	c := &slowclient.Client{Client: sc0.Client(), Attempt: func(args []string) bool { return len(args) == 4 && args[3] == "f" }}
	sc, err := scriptcache.NewFrom(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	lw, err := NewLocker(sc, Options{Fair: true, WatchdogLease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lw.Close)
	lo, _ := reviewLocker(t, Options{Fair: true})
	name := "late-handoff:" + t.Name()
	w := reviewMutex(t, lw, name)
	holder, taker := reviewMutex(t, lo, name), reviewMutex(t, lo, name)

	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	queued := c.At(2)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() { got <- w.Lock(wctx) }()
	select {
	case <-queued:
	case <-time.After(10 * time.Second):
		t.Fatal("W never queued")
	}
	stallKeeper(t, func(f func(error)) { lw.keeper.Add(time.Now(), 30*time.Millisecond, nil, f) })
	c.HoldGrants()
	if err := holder.Unlock(ctx); err != nil { // hands the lock to W
		t.Fatal(err)
	}
	if in, err := holder.Info(ctx); err != nil || in.Owner != w.Owner() {
		t.Fatalf("Info after the release = %+v, %v; want it handed to W", in, err)
	}
	if !redistest.WaitFor(ctx, 10*time.Second, func() bool {
		in, err := holder.Info(ctx)
		return err == nil && !in.Held
	}) {
		t.Fatal("the hand-off's lease never ended")
	}
	if err := taker.TryLock(ctx); err != nil {
		t.Fatalf("TryLock after the hand-off ended: %v", err)
	}
	next := c.At(3)
	c.LetGrantsThrough()
	select {
	case err := <-got:
		t.Fatalf("W's Lock took the late hand-off: %v (token %d); the other owner holds the lock", err, w.Token())
	case <-next: // W gave the grant back and asked Redis
	case <-time.After(10 * time.Second):
		t.Fatal("W neither took the hand-off nor attempted")
	}
	cancel()
	if err := <-got; !errors.Is(err, ErrNotObtained) {
		t.Fatalf("W's Lock = %v; want ErrNotObtained", err)
	}
	if err := taker.Unlock(ctx); err != nil {
		t.Fatalf("the other owner's Unlock = %v", err)
	}
}
