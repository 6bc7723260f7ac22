package scriptcache_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestRueidisSubscribeJoinsBusyChannel: a second subscription of a
// channel that a subscription of the same client already receives, made
// while messages of it keep coming, is confirmed, and the client's other
// calls go on.
//
// Each Subscribe used to run a Receive of its own on the connection all
// of the client's calls share. The second one's message buffer (16) took
// the channel's messages from the moment it was registered, but was read
// only once its SUBSCRIBE was answered: with more than 16 messages ahead
// of that answer the connection's reader blocked, and the answer never
// came (the chaos harness, issue 32: a node's calls stalled for seconds
// after a lag, where Lockers and Managers of one client wait on the same
// names). Its UNSUBSCRIBE, at its end, also unsubscribed the connection
// under the first one. The bounds, 3 s each, are for a confirmation and a
// call that take milliseconds.
func TestRueidisSubscribeJoinsBusyChannel(t *testing.T) {
	srv := redistest.Single(t)
	sc, err := scriptcache.New(context.Background(), redistest.Client(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	pub := redistest.Client(t, srv.Addr())
	const channel, rounds = "busy", 20
	subscribe := func(ctx context.Context) (chan struct{}, chan error) {
		ok, done := make(chan struct{}), make(chan error, 1)
		go func() {
			done <- sc.Client().Subscribe(ctx, channel, false, func() {
				select {
				case <-ok:
				default:
					close(ok)
				}
			}, func(string) {})
		}()
		return ok, done
	}
	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	okA, doneA := subscribe(ctxA)
	<-okA
	// Messages of the channel, without a pause, until the end.
	defer publishAll(pub, channel)()
	for round := range rounds {
		ctxB, cancelB := context.WithCancel(context.Background())
		okB, doneB := subscribe(ctxB)
		select {
		case <-okB:
		case <-time.After(3 * time.Second):
			t.Errorf("round %d: the second subscription was not confirmed within 3s", round)
		}
		ectx, ecancel := context.WithTimeout(context.Background(), 3*time.Second)
		got, err := sc.Client().Eval(ectx, "", "return 7", nil, nil).AsInt64()
		ecancel()
		cancelB()
		<-doneB
		if err != nil || got != 7 {
			t.Fatalf("round %d: Eval while a second subscription of a busy channel joined: %d, %v", round, got, err)
		}
		// The first subscription is still in place on the server: the
		// second's end did not unsubscribe the connection under it.
		if n, err := pub.Do(context.Background(), pub.B().PubsubNumsub().Channel(channel).Build()).AsIntMap(); err != nil || n[channel] != 1 {
			t.Fatalf("round %d: PUBSUB NUMSUB once the second subscription ended: %v, %v; want the first's connection", round, n, err)
		}
		if t.Failed() {
			break
		}
	}
	cancelA()
	<-doneA
}

// TestRueidisSubscribeAfterLateUnsubscribe: a channel's next subscription,
// made while the UNSUBSCRIBE of the one before is still on its way and
// messages of the channel keep coming, neither stalls the client's other
// calls nor loses the channel.
//
// The first subscription's end waits a second for its UNSUBSCRIBE, which
// a latency of 1.5 s each way holds longer. The next Receive used to start
// then, on a connection still subscribed: rueidis drops every local
// subscription of a channel when an UNSUBSCRIBE of it is confirmed, so the
// late answer ended the new Receive too, and the server kept sending the
// channel to the connection with no one reading it. The Receive after
// that took the channel's messages from the moment it was registered but
// read them only once its own SUBSCRIBE was answered, behind more than 16
// of them: the connection's reader blocked for good, and every call of
// the client with it (the chaos harness: a node stalled from five seconds
// after a latency fault to the end of its run). The bounds, 3 s for a
// call and 10 s for a confirmation that follows the late answer, are for
// what takes milliseconds once the latency is gone.
func TestRueidisSubscribeAfterLateUnsubscribe(t *testing.T) {
	srv := redistest.Single(t)
	p, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{p.Addr()},
		DisableCache:      true,
		PipelineMultiplex: -1, // one connection: the calls and the subscriptions share it
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	sc, err := scriptcache.New(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	pub := redistest.Client(t, srv.Addr())
	const channel = "late"

	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	okA, doneA := make(chan struct{}), make(chan error, 1)
	go func() {
		doneA <- sc.Client().Subscribe(ctxA, channel, false, func() { close(okA) }, func(string) {})
	}()
	select {
	case <-okA:
	case <-time.After(10 * time.Second):
		t.Fatal("the first subscription was not confirmed within 10s")
	}

	// Messages of the channel, without a pause, until the end.
	defer publishAll(pub, channel)()

	p.SetLatency(1500*time.Millisecond, 0)
	cancelA()
	<-doneA // after a second: its UNSUBSCRIBE is still on its way
	p.SetLatency(0, 0)

	// The channel's next subscriptions, one after another, as the notify
	// hub makes them while it has waiters.
	ctxB, cancelB := context.WithCancel(context.Background())
	got := make(chan struct{}, 1)
	doneB := make(chan struct{})
	go func() {
		defer close(doneB)
		for ctxB.Err() == nil {
			confirmed := false
			sc.Client().Subscribe(ctxB, channel, false, func() { confirmed = true }, func(string) {
				if confirmed {
					select {
					case got <- struct{}{}:
					default:
					}
				}
			})
			time.Sleep(10 * time.Millisecond) // the hub's pause before it subscribes again
		}
	}()
	defer func() {
		cancelB()
		<-doneB
	}()
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Error("no message of the channel reached its next subscription within 10s")
	}
	for i := range 20 {
		ectx, ecancel := context.WithTimeout(context.Background(), 3*time.Second)
		v, err := sc.Client().Eval(ectx, "", "return 7", nil, nil).AsInt64()
		ecancel()
		if err != nil || v != 7 {
			t.Fatalf("call %d after the late UNSUBSCRIBE: %d, %v", i, v, err)
		}
		time.Sleep(50 * time.Millisecond) // calls spread over a second, while the subscriptions go on
	}
}

// publishAll publishes messages of channel without a pause until the
// function it returns is called, which waits for the publisher to end.
func publishAll(pub rueidis.Client, channel string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			cmds := make(rueidis.Commands, 0, 50)
			for j := range 50 {
				cmds = append(cmds, pub.B().Publish().Channel(channel).Message(strconv.Itoa(i*50+j)).Build())
			}
			pub.DoMulti(ctx, cmds...)
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
