package semaphore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicekit/sluice/semaphore"
)

// TestFairQueueKeysGoWithLastWaiter: the queue keys are deleted when the
// queue empties (semaphore_queue.lua, README). A waiter that was the
// blocked head (too heavy for the permits free, so the grant pass wrote its
// ':b' mark into the entries hash) gives up; its leaving call finds no
// permit free and runs no pass. Before dequeue deleted the entries hash
// with the last entry, ':b' kept it alive, after the last permit had gone
// too, for a lease and a sixteenth.
func TestFairQueueKeysGoWithLastWaiter(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		ctx := context.Background()
		e := newEnv(t, addrs, semaphore.Options{Fair: true})
		name := uniqueName(t)
		s := e.sem(t, name, 2)
		holder := acquire(t, s, 1)

		// 1 of 2 free: Acquire(2) queues as the blocked head.
		qctx, cancel := context.WithCancel(ctx)
		heavy := acquireAsync(qctx, s, 2)
		e.waitQueued(t, name, 1)
		cancel()
		if r := <-heavy; !errors.Is(r.err, semaphore.ErrNotObtained) {
			t.Fatalf("cancelled Acquire(2) = %v, %v; want ErrNotObtained", r.p, r.err)
		}
		e.waitQueued(t, name, 0) // it left the queue (in the background)
		release(t, holder)
		wantAvailable(t, s, 2)

		if left := e.keysLeft(t, name); left != 0 {
			qe := e.key(name, ":qe")
			fields, _ := e.client.Do(ctx, e.client.B().Hgetall().Key(qe).Build()).AsStrMap()
			pttl, _ := e.client.Do(ctx, e.client.B().Pttl().Key(qe).Build()).AsInt64()
			t.Fatalf("%d keys left after the queue emptied and the last permit went; %s = %v (PTTL %d ms)",
				left, qe, fields, pttl)
		}
	})
}
