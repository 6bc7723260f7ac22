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
	pctx, stopPub := context.WithCancel(context.Background())
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := 0; pctx.Err() == nil; i++ {
			cmds := make(rueidis.Commands, 0, 50)
			for j := range 50 {
				cmds = append(cmds, pub.B().Publish().Channel(channel).Message(strconv.Itoa(i*50+j)).Build())
			}
			pub.DoMulti(pctx, cmds...)
		}
	}()
	defer func() {
		stopPub()
		<-pubDone
	}()
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
