package mutex

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/redistest"
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
	defer l.Close()
	m, err := l.NewMutex("late-nested:"+t.Name(), WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	stalled, unstall := make(chan struct{}), make(chan struct{})
	defer close(unstall)
	l.keeper.Add(time.Now(), 30*time.Millisecond, nil, func(error) {
		close(stalled)
		<-unstall
	})
	<-stalled
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
			defer l.Close()
			rw, err := l.NewRWMutex("late-nested:"+t.Name(), WithLease(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			lock := rw.Lock
			if !write {
				lock = rw.RLock
			}
			stalled, unstall := make(chan struct{}), make(chan struct{})
			defer close(unstall)
			l.keeper.Add(time.Now(), 30*time.Millisecond, nil, func(error) {
				close(stalled)
				<-unstall
			})
			<-stalled
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
