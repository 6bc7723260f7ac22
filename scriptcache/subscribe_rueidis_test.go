package scriptcache_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestRueidisSubscribeEndsUnderMessages: a subscription that ends while
// messages of its channel are still arriving returns at once, and leaves
// the connection it shares with every other call of the client free.
//
// rueidis hands a subscription's messages to a buffer of 16 that only its
// Receive loop reads. Subscribe unsubscribes when its context ends, after
// that loop has stopped; it used to wait for the UNSUBSCRIBE reply there,
// before rueidis drops the subscription's buffer. With more than 16
// messages ahead of that reply, the connection's reader blocked handing
// the 17th to the buffer nobody read, so the reply never came: every call
// on the connection (releases, renewals: all of a process's calls through
// one client) stalled until the unsubscription's own timeout of a second
// ran out (the chaos harness's node-wide stalls after its lag faults,
// issue 32: a release of 200 ms timing out, leases lost with no fault).
//
// Each round holds the subscription's handler until 200 messages have
// been published and the context cancelled, then lets it go: the Receive
// loop stops with the buffer full and most messages still unread. Before
// the fix each round took the second, from the cancellation to
// Subscribe's return; the bound, half of that for three rounds, is met in
// milliseconds on an idle machine.
func TestRueidisSubscribeEndsUnderMessages(t *testing.T) {
	srv := redistest.Single(t)
	sc, err := scriptcache.New(context.Background(), redistest.Client(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	pub := redistest.Client(t, srv.Addr())
	const rounds, burst = 3, 200
	var took time.Duration // from each cancellation to Subscribe's return
	for round := range rounds {
		channel := "sub-ends-" + strconv.Itoa(round)
		ctx, cancel := context.WithCancel(context.Background())
		subscribed, first, gate := make(chan struct{}), make(chan struct{}, 1), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- sc.Client().Subscribe(ctx, channel, false,
				func() {
					select {
					case <-subscribed:
					default:
						close(subscribed)
					}
				},
				func(string) {
					select {
					case first <- struct{}{}:
						<-gate // hold the loop: the messages pile up
					default:
					}
				})
		}()
		<-subscribed
		cmds := make(rueidis.Commands, 0, burst)
		for i := range burst {
			cmds = append(cmds, pub.B().Publish().Channel(channel).Message(strconv.Itoa(i)).Build())
		}
		for _, res := range pub.DoMulti(context.Background(), cmds...) {
			if n, err := res.AsInt64(); err != nil || n != 1 {
				t.Fatalf("round %d: PUBLISH reached %d subscribers (%v), want 1", round, n, err)
			}
		}
		<-first
		at := time.Now()
		cancel()
		close(gate)
		err := <-done
		took += time.Since(at)
		if err == nil {
			t.Fatalf("round %d: Subscribe returned nil after its context ended", round)
		}
		// Still unsubscribed on the server, as Subscribe documents.
		if n, err := pub.Do(context.Background(), pub.B().PubsubNumsub().Channel(channel).Build()).AsIntMap(); err != nil || n[channel] != 0 {
			t.Fatalf("round %d: PUBSUB NUMSUB after Subscribe returned: %v, %v; want no subscriber", round, n, err)
		}
		// The connection is free: a call on the client is answered.
		if got, err := sc.Client().Eval(context.Background(), "", "return 7", nil, nil).AsInt64(); err != nil || got != 7 {
			t.Fatalf("round %d: Eval after the unsubscription: %d, %v", round, got, err)
		}
	}
	if took >= 1500*time.Millisecond {
		t.Fatalf("%d subscriptions ended under %d messages each took %v from their cancellation to Subscribe's return: each unsubscription held the client's connection", rounds, burst, took)
	}
}
