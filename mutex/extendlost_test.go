package mutex_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/internal/testkit/slowclient"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestExtendAnsweredAfterLossGivesBack: an Extend is on its way while the
// hold's fixed lease runs out on this client's clock (the loss is declared
// a margin before the server's end), and reaches Redis while the server
// still has the hold: the server takes the new lease. Extend returns
// ErrLost, and nobody holds the lock any more; before, the new lease was
// left on the server for the next Unlock to give back, and a holder told
// of the loss that never called one kept everyone out for all of it (the
// fault harness: a hold of "le" left to expire after such an Extend, still
// held on the server 293 ms after the end its lease had set, for the
// 1.4 s the Extend asked).
func TestExtendAnsweredAfterLossGivesBack(t *testing.T) {
	const lease, d = 3 * time.Second, 30 * time.Second // a margin of 300 ms
	ctx := context.Background()
	srv := redistest.Single(t)
	sc0, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	// The Extend is mutex_renew's call with ARGV[3] = d in ms.
	dMs := strconv.FormatInt(d.Milliseconds(), 10)
	c := &slowclient.Client{Client: sc0.Client(), Attempt: func(args []string) bool { return len(args) == 4 && args[2] == dMs }}
	sc, err := scriptcache.NewFrom(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	l, err := mutex.NewLocker(sc, mutex.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	other := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{})
	name := "extend-after-loss:" + t.Name()
	m := newMutex(t, l, name, mutex.WithLease(lease))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}

	sent := c.Hold()
	got := make(chan error, 1)
	go func() {
		_, err := m.Extend(ctx, d)
		got <- err
	}()
	waitChan(t, sent, "the Extend sent")
	waitChan(t, m.Lost(), "the loss declared by the client's clock")
	pttl, err := srv.Do("PTTL", keyspace.Key(mutex.DefaultPrefix, name, ""))
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := strconv.Atoi(strings.TrimSpace(pttl)); n < 50 {
		t.Fatalf("the server's lease ended (PTTL %s) before the Extend could reach it: the margin is too short for this machine", pttl)
	}
	c.LetCallsThrough() // the server takes the new lease
	select {
	case err = <-got:
	case <-time.After(signal):
		t.Fatal("Extend did not return")
	}
	if !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("Extend = %v, want ErrLost", err)
	}
	o := newMutex(t, other, name)
	if err := o.TryLock(ctx); err != nil {
		t.Fatalf("TryLock by another owner after Extend returned ErrLost: %v (the new lease was left on the server)", err)
	}
	if err := o.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
