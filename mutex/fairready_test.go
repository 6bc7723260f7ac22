package mutex_test

import (
	"context"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// mutedSubs is a scriptcache.Client whose subscriptions are never
// confirmed while the test runs: a pub/sub connection slow to come up (a
// dial, a busy node) while script calls go through.
type mutedSubs struct{ scriptcache.Client }

func (mutedSubs) Subscribe(ctx context.Context, _ string, _ bool, _ func(), _ func(string)) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestFairWaiterUnconfirmedSubscription: a fair Lock that a holder
// refused subscribes after its first attempt, and tries again once the
// subscription is confirmed. While the confirmation is late, a release
// hands it the lock with a message it cannot hear. The Locker's refresh
// of its queue entry finds the entry gone and wakes it, but a wake-up does
// not end the wait for the confirmation. So that wait must be short (a
// re-check, as a fair Acquire's is), not the fair waiter's backstop of ten
// leases: the waiter finds the hand-off by its own attempt and holds the
// lock while its subscription is still unconfirmed. Before, it waited out
// ten leases (here, its context) while the lock it had been handed sat
// idle until that grant's lease ran out.
func TestFairWaiterUnconfirmedSubscription(t *testing.T) {
	ctx := context.Background()
	addrs := []string{redistest.Single(t).Addr()}
	client := redistest.Client(t, addrs...)
	holders := newLocker(t, client, mutex.Options{Fair: true}) // 30 s lease, re-check every second
	muted := wrappedLocker(t, addrs, mutex.Options{Fair: true}, func(c scriptcache.Client) scriptcache.Client {
		return mutedSubs{c}
	})
	name := "unconfirmed"
	holder, waiter := newMutex(t, holders, name), newMutex(t, muted, name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, signal)
	defer cancel()
	got := make(chan error, 1)
	go func() { got <- waiter.Lock(wctx) }()
	waitQueued(t, client, name, 1)
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter never found the lock handed to it while its subscription was unconfirmed: %v", err)
	}
	if info, err := waiter.Info(ctx); err != nil || info.Owner != waiter.Owner() || info.Token != waiter.Token() {
		t.Fatalf("Info = %+v, %v; want held by the waiter with token %d", info, err, waiter.Token())
	}
	if err := waiter.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
