package scriptcache

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// rueidisClient is the Client of a rueidis.Client.
type rueidisClient struct {
	c        rueidis.Client
	inflight *atomic.Int64  // Eval calls in progress
	subs     *subscriptions // one Receive per channel (see Subscribe)
}

// newRueidisClient returns the Client of c.
func newRueidisClient(c rueidis.Client) rueidisClient {
	return rueidisClient{c: c, inflight: new(atomic.Int64), subs: &subscriptions{byKey: map[subKey]*shared{}}}
}

func (r rueidisClient) Cluster() bool { return r.c.Mode() == rueidis.ClientModeCluster }

// Eval hides ctx's deadline from rueidis and retries calls that were never
// sent.
//
// rueidis sees ctx's cancellation but not its deadline. With a deadline it
// would set a socket deadline and close the connection other callers share
// when it passed mid-command; without one it queues the call on its
// pipelining connection and abandons only this call when ctx ends. One
// weakness remains: rueidis dials a connection lazily, under the context of
// the call that needs it first, and every call waiting on that dial fails
// if that context ends. Such a call was never sent, so Eval retries it (up to
// three times). The handshake of a new connection, though, is bounded by the
// client's dial timeout (ClientOption.Dialer.Timeout, 5 s by default), not by
// ctx: a call that must wait for one against a server that accepts
// connections but does not answer can outlive ctx by that much. Lower the
// dial timeout where that matters.
//
// A call alone in flight whose ctx has a deadline takes another way (see
// New): a pooled connection of its own, in this goroutine, with the
// deadline. It is never retried, since rueidis reports that connection's
// deadline as context.DeadlineExceeded even when ctx has not quite ended
// yet, and the call may have run. Calls without a deadline do not take it:
// rueidis sets no socket deadline for a blocking command, so a server that
// stopped answering would hold the call for ever.
//
// As a Client method it refuses keys of two cluster slots, on which the
// rueidis cluster client would panic; Cache.eval, which checked them
// already, calls evalChecked.
func (r rueidisClient) Eval(ctx context.Context, sha, body string, keys, args []string) Reply {
	if err := checkSlots(r.Cluster(), keys); err != nil {
		return ErrorReply(err)
	}
	return r.evalChecked(ctx, sha, body, keys, args)
}

// evalChecked is Eval for keys already known to share a slot.
func (r rueidisClient) evalChecked(ctx context.Context, sha, body string, keys, args []string) Reply {
	n := r.inflight.Add(1)
	defer r.inflight.Add(-1)
	_, hasDeadline := ctx.Deadline()
	if hasDeadline && n == 1 {
		res := r.c.Do(ctx, r.dedicated(sha, body, keys, args))
		if err := res.Error(); err == nil || !dialFailed(err) {
			return Reply{rr: res}
		}
		// The pool could not dial a connection in time (a short deadline,
		// or a server slow to accept): the call was never sent, and the
		// shared connection, already open, may still carry it.
	}
	var rctx context.Context
	switch {
	case ctx == context.Background():
		rctx = background // no allocation on the commonest path
	case ctx.Done() == nil:
		rctx = pipelined{ctx}
	default:
		if !hasDeadline {
			rctx = ctx // nothing to hide
			break
		}
		// A wrapper per call, never reused: rueidis may derive a context
		// from it (a dial's timeout) whose timer or goroutine reads it
		// after the call has returned.
		rctx = &cancelOnly{ctx}
	}
	res := r.do(rctx, sha, body, keys, args)
	for range 3 {
		if err := res.Error(); err == nil || ctx.Err() != nil || !neverSent(err) {
			break
		}
		res = r.do(rctx, sha, body, keys, args)
	}
	return Reply{rr: res}
}

func (r rueidisClient) eval(sha, body string, keys, args []string) rueidis.Completed {
	if body != "" {
		return r.c.B().Eval().Script(body).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
	}
	return r.c.B().Evalsha().Sha1(sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// dedicated is the call as a blocking command, which rueidis sends on a
// connection of its own from its pool, in the caller's goroutine, with
// ctx's deadline as the connection's (closed if it passes).
func (r rueidisClient) dedicated(sha, body string, keys, args []string) rueidis.Completed {
	cmd, script := "EVALSHA", sha
	if body != "" {
		cmd, script = "EVAL", body
	}
	return r.c.B().Arbitrary(cmd, script).Args(strconv.Itoa(len(keys))).Keys(keys...).Args(args...).Blocking()
}

func (r rueidisClient) do(ctx context.Context, sha, body string, keys, args []string) rueidis.RedisResult {
	return r.c.Do(ctx, r.eval(sha, body, keys, args))
}

// EvalWait sends the pair with DoMulti: rueidis runs a pipeline holding a
// blocking command (WAIT) on a dedicated connection, so the call does not
// hold up other callers, and when ctx ends mid-call (its deadline, or a
// cancellation) that connection is closed. rueidis is given ctx without
// its deadline: with one, it runs the pair in its synchronous mode, which
// sets a socket deadline and never looks at a cancellation, so a call
// whose caller was cancelled (or whose primitive closed) could not end
// before WAIT's timeout.
//
// On a cluster the pair goes to one node's connection, and redirections
// are followed for the pair, never for the script alone (see
// evalWaitCluster).
func (r rueidisClient) EvalWait(ctx context.Context, sha, body string, keys, args []string, replicas int64, timeout time.Duration) (Reply, int64, error) {
	if err := checkSlots(r.Cluster(), keys); err != nil {
		return ErrorReply(err), 0, err
	}
	if _, ok := ctx.Deadline(); ok {
		ctx = &cancelOnly{ctx}
	}
	var res []rueidis.RedisResult
	if r.Cluster() {
		res = r.evalWaitCluster(ctx, sha, body, keys, args, replicas, timeout)
	} else {
		res = r.c.DoMulti(ctx, r.eval(sha, body, keys, args), r.wait(replicas, timeout))
	}
	if err := res[0].Error(); err != nil {
		return Reply{rr: res[0]}, 0, err
	}
	acks, err := res[1].AsInt64()
	if err != nil {
		return Reply{rr: res[0]}, 0, fmt.Errorf("scriptcache: wait: %w", err)
	}
	return Reply{rr: res[0]}, acks, nil
}

// wait builds WAIT replicas timeout. WAIT takes whole milliseconds; 0
// would mean forever.
func (r rueidisClient) wait(replicas int64, timeout time.Duration) rueidis.Completed {
	return r.c.B().Wait().Numreplicas(replicas).Timeout(max(timeout.Milliseconds(), 1)).Build()
}

// maxRedirects bounds how many MOVED or ASK replies one EvalWait follows
// on a cluster.
const maxRedirects = 3

// evalWaitCluster runs the pair on a cluster. The cluster client's DoMulti
// will not do: it follows a MOVED or ASK reply for the script alone, on
// another node, while WAIT has already been answered by the node the
// client thought owned the slot, on a connection that wrote nothing there,
// counting that node's replicas for writes made elsewhere (issue 22, item
// 7). So the pair goes on a dedicated connection to the slot's owner as
// the client knows it, which never follows a redirection; a MOVED or ASK
// reply to the script means it did not run, and the pair is sent again,
// whole, to the node named (ASKING first for ASK), up to maxRedirects
// times. The script runs at most once: only a redirection, which the
// server sends instead of running it, is followed.
func (r rueidisClient) evalWaitCluster(ctx context.Context, sha, body string, keys, args []string, replicas int64, timeout time.Duration) []rueidis.RedisResult {
	dc, release := r.c.Dedicate()
	res := dc.DoMulti(ctx, r.eval(sha, body, keys, args), r.wait(replicas, timeout))
	if aborted(res) {
		dc.Close() // as the client does for its own blocking calls
	} else {
		release()
	}
	for range maxRedirects {
		re, ok := rueidis.IsRedisErr(res[0].Error())
		if !ok {
			return res
		}
		addr, moved := re.IsMoved()
		if !moved {
			if addr, ok = re.IsAsk(); !ok {
				return res
			}
		}
		node := r.c.Nodes()[addr]
		if node == nil {
			return res // a node the client does not know yet: the caller retries
		}
		// A node's own client runs a pipeline with a blocking command on
		// a dedicated connection, closed if the call is cut short. (Its
		// builder is the cluster client's.)
		eval, wait := r.eval(sha, body, keys, args), r.wait(replicas, timeout)
		if moved {
			res = node.DoMulti(ctx, eval, wait)
		} else {
			res = node.DoMulti(ctx, node.B().Asking().Build(), eval, wait)[1:]
		}
	}
	return res
}

// aborted reports whether a reply of res is not the server's: the call
// was cut short, and its connection may still carry a blocked command.
func aborted(res []rueidis.RedisResult) bool {
	for _, r := range res {
		if r.NonRedisError() != nil {
			return true
		}
	}
	return false
}

// LoadScripts pipelines the loads per node. Each node gets commands of
// its own: DoMulti returns when ctx ends, while a node that has not
// answered may still hold the commands it was given.
func (r rueidisClient) LoadScripts(ctx context.Context, bodies ...string) error {
	var errs []error
	for _, node := range r.c.Nodes() {
		cmds := make(rueidis.Commands, 0, len(bodies))
		for _, b := range bodies {
			cmds = append(cmds, node.B().ScriptLoad().Script(b).Build())
		}
		for _, res := range node.DoMulti(ctx, cmds...) {
			if err := res.Error(); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	return errors.Join(errs...)
}

// Subscribe shares one Receive of the channel among the Subscribe calls
// of the client that want it at once (several Lockers and Managers on one
// client wait on the same names), and starts a channel's Receive only
// once the one before it has ended, its UNSUBSCRIBE answered.
//
// rueidis hands a subscription's messages to a buffer of 16 that only its
// Receive loop reads, and its connection's reader, which reads the
// replies of every call of the client, waits for room there. So a
// subscription must never be registered where its loop does not read:
// a second Receive of a channel the connection already receives, which
// takes its messages from the moment it is registered but reads them
// only once its own SUBSCRIBE is answered, stalled the connection, the
// answer behind more than 16 messages, until the connection was closed
// (the chaos harness, issue 32: every call of a node stalled for seconds,
// leases lost, with no fault in force). Sharing also keeps one Receive's
// UNSUBSCRIBE from ending the subscription of another on the same
// connection: Redis counts subscriptions per connection, and rueidis
// drops every local subscription of the channel when one is confirmed.
func (r rueidisClient) Subscribe(ctx context.Context, channel string, sharded bool, subscribed func(), message func(string)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	me := &subscriber{subscribed: subscribed, message: message}
	sh := r.subs.join(r, subKey{channel, sharded}, me)
	select {
	case <-ctx.Done():
		r.subs.leave(sh, me)
		return ctx.Err()
	case <-sh.done:
		r.subs.leave(sh, me)
		if err := ctx.Err(); err != nil {
			return err
		}
		return sh.err
	}
}

// subscriptions are the channels a client receives, each shared by the
// Subscribe calls that want it.
type subscriptions struct {
	mu    sync.Mutex
	byKey map[subKey]*shared // the Receive a new Subscribe joins
}

type subKey struct {
	channel string
	sharded bool
}

// shared is one Receive of a channel and the Subscribe calls it serves.
// Its goroutine is owned by them: the last to leave ends it and waits
// for its Receive to return (done); the goroutine then lingers only until
// its UNSUBSCRIBE is answered (see run).
type shared struct {
	stop    context.CancelFunc
	done    chan struct{}   // closed when the Receive has returned
	err     error           // its error, set before done is closed
	settled <-chan struct{} // see receive; set before done is closed

	// mu is held while the callbacks run, so that none runs for a
	// subscriber once leave has returned.
	mu        sync.Mutex
	subs      map[*subscriber]struct{}
	confirmed bool // the server confirmed the subscription at least once
	ending    bool // its last subscriber left, or its Receive ended (guarded by subscriptions.mu)
}

type subscriber struct {
	subscribed func()
	message    func(string)
}

// join adds me to the channel's Receive, starting one if there is none
// (after the one that is ending, if any: see Subscribe).
func (s *subscriptions) join(r rueidisClient, k subKey, me *subscriber) *shared {
	s.mu.Lock()
	sh := s.byKey[k]
	if sh == nil || sh.ending {
		prev := sh
		ctx, stop := context.WithCancel(context.Background())
		sh = &shared{stop: stop, done: make(chan struct{}), subs: map[*subscriber]struct{}{}}
		s.byKey[k] = sh
		go s.run(ctx, r, k, sh, prev)
	}
	// Added under s.mu too, so that a leave that finds sh without
	// subscribers (and ends it) is never before this join and after its
	// choice of sh.
	sh.mu.Lock()
	s.mu.Unlock()
	sh.subs[me] = struct{}{}
	if sh.confirmed {
		me.subscribed() // subscribed already: as a confirmation would
	}
	sh.mu.Unlock()
	return sh
}

// leave removes me from sh; the last to leave ends sh's Receive and waits
// for it (its UNSUBSCRIBE included).
func (s *subscriptions) leave(sh *shared, me *subscriber) {
	sh.mu.Lock()
	delete(sh.subs, me)
	last := len(sh.subs) == 0
	sh.mu.Unlock()
	if !last {
		return
	}
	s.mu.Lock()
	sh.mu.Lock()
	last = len(sh.subs) == 0 // a join may have come meanwhile
	sh.mu.Unlock()
	if last {
		sh.ending = true
	}
	s.mu.Unlock()
	if last {
		sh.stop()
		<-sh.done
	}
}

// run is sh's Receive, after prev's has ended and its UNSUBSCRIBE has
// been answered (see receive).
//
// sh stays the channel's entry, ending, until its own UNSUBSCRIBE (or
// prev's, if it made none) is answered: a Subscribe meanwhile starts a
// new Receive with sh as its prev, which waits for that answer. Its
// subscribers wait only for done, so that none is held up by a stopped
// server for longer than receive's second; the goroutine lingers until
// the answer, or unsubscribeWait, or the client's Close.
func (s *subscriptions) run(ctx context.Context, r rueidisClient, k subKey, sh *shared, prev *shared) {
	sh.settled = settledChan
	if prev != nil {
		<-prev.done
		sh.settled = prev.settled
		select {
		case <-prev.settled:
		case <-ctx.Done():
		}
	}
	if err := ctx.Err(); err != nil {
		// Its subscribers left while it waited: no SUBSCRIBE, and no
		// UNSUBSCRIBE that a stopped server would hold for a second.
		sh.err = err
	} else {
		sh.settled, sh.err = r.receive(ctx, k.channel, k.sharded, func() {
			sh.mu.Lock()
			defer sh.mu.Unlock()
			sh.confirmed = true
			for sub := range sh.subs {
				sub.subscribed()
			}
		}, func(payload string) {
			sh.mu.Lock()
			defer sh.mu.Unlock()
			for sub := range sh.subs {
				sub.message(payload)
			}
		})
		sh.stop()
	}
	s.mu.Lock()
	sh.ending = true // a Subscribe from now on starts the next Receive
	s.mu.Unlock()
	close(sh.done)
	<-sh.settled
	s.forget(k, sh)
}

// unsubscribeWait bounds the wait for a Receive's UNSUBSCRIBE, which the
// channel's next Receive waits for (see receive).
const unsubscribeWait = 10 * time.Second

// settledChan is a closed channel: nothing to wait for.
var settledChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// forget removes sh, whose Receive has ended, from s: the next Subscribe
// of its channel starts afresh.
func (s *subscriptions) forget(k subKey, sh *shared) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byKey[k] == sh {
		delete(s.byKey, k)
	}
}

// receive runs Receive. Receive leaves the server-side subscription in
// place when it returns; receive unsubscribes on the same connection,
// whatever ended it, so a process that waited on many names does not stay
// subscribed to all, and so that the channel's next Receive starts on a
// connection that does not receive the channel.
//
// That is what keeps the next Receive from stalling the connection. It
// takes the channel's messages from the moment it is registered but reads
// them only once its own SUBSCRIBE is answered; on a connection still
// subscribed, more than 16 messages in between block the connection's
// reader, which every call of the client waits on, for as long as that
// Receive waits for its answer, which is behind them: for ever. A late
// UNSUBSCRIBE does it too: rueidis drops every local subscription of a
// channel when an UNSUBSCRIBE of it is confirmed, the next Receive's
// included, and that Receive then returns with the server still sending
// the channel (the chaos harness: a node's every call stalled from five
// seconds after a latency fault that held an UNSUBSCRIBE past its wait to
// the end of the run). So settled is closed once the UNSUBSCRIBE is
// answered, or failed with its connection, and run starts the next Receive
// only then.
//
// The UNSUBSCRIBE is sent from Receive's return hook but awaited only
// once Receive has returned. The hook runs before Receive lets go of the
// subscription's message buffer (16 messages, read only by its loop,
// which has stopped): awaited there, a reply behind more than 16 messages
// of the channel never came, since the connection's reader blocked
// handing the 17th to that buffer. receive waits for it a second at most,
// so that a Close is not held up by a stopped server; its goroutine goes
// on for up to unsubscribeWait, which a live connection answers in far
// less and a dead one does not outlast (rueidis closes a connection whose
// PING goes unanswered).
func (r rueidisClient) receive(ctx context.Context, channel string, sharded bool, subscribed func(), message func(string)) (settled <-chan struct{}, err error) {
	rctx := rueidis.WithOnSubscriptionHook(ctx, func(s rueidis.PubSubSubscription) {
		if s.Kind == "subscribe" || s.Kind == "ssubscribe" {
			subscribed()
		}
	})
	// The hook runs inside Receive, once per connection it tried.
	var unsubscribing sync.WaitGroup
	rctx = rueidis.WithOnReceiveReturnHook(rctx, func(err error, cc rueidis.CommandClient) error {
		unsubscribing.Go(func() {
			uctx, cancel := context.WithTimeout(context.Background(), unsubscribeWait)
			defer cancel()
			if sharded {
				cc.Do(uctx, cc.B().Sunsubscribe().Channel(channel).Build())
			} else {
				cc.Do(uctx, cc.B().Unsubscribe().Channel(channel).Build())
			}
		})
		return err
	})
	var sub rueidis.Completed
	if sharded {
		sub = r.c.B().Ssubscribe().Channel(channel).Build()
	} else {
		sub = r.c.B().Subscribe().Channel(channel).Build()
	}
	err = r.c.Receive(rctx, sub, func(m rueidis.PubSubMessage) { message(m.Message) })
	done := make(chan struct{})
	go func() {
		unsubscribing.Wait()
		close(done)
	}()
	t := time.NewTimer(time.Second)
	select {
	case <-done:
	case <-t.C:
	}
	t.Stop()
	if ctx.Err() != nil {
		return done, ctx.Err()
	}
	if re, ok := rueidis.IsRedisErr(err); ok && !re.IsNil() {
		if _, redirect := re.IsRedirect(); !redirect && !Retryable(re.Error()) {
			return done, fmt.Errorf("%w: %w", ErrRefused, err)
		}
	}
	return done, err
}

// cancelOnly is ctx without its deadline (see Eval). Each call gets its
// own: a pooled one was read, through a context rueidis derived from it,
// after the call had put it back (a data race, and a nil Context if the
// timing had been a little different).
type cancelOnly struct{ context.Context }

func (*cancelOnly) Deadline() (time.Time, bool) { return time.Time{}, false }

// dialFailed reports whether err is the failure to dial a connection. (A
// function of its own: the error variable errors.As fills would otherwise
// be allocated on every call, failed or not.)
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// neverSent reports whether err says a call failed before it was sent: the
// connection it waited for could not be dialled, possibly because another
// caller's context ended (the caller's own has not).
func neverSent(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || dialFailed(err)
}

// pipelined is a context that is never done but has a Done channel. Given
// one, rueidis queues the call on its pipelining connection instead of
// running it in its synchronous mode, which it uses when a call has no Done
// channel and no other call is in flight. In that mode a second call that
// starts meanwhile waits for the first one's reply before it is even sent:
// a watchdog renewal issued while the holder's own Lock or Acquire is in
// flight then takes two or three round trips instead of one, and on a link
// whose round trip is a quarter of the lease that is enough for the
// watchdog to declare a lease lost that the server still holds (found by
// internal/faulttest's latency scenario).
type pipelined struct{ context.Context }

var neverDone = make(chan struct{})

// background is pipelined{context.Background()}, made once.
var background context.Context = pipelined{context.Background()}

func (pipelined) Done() <-chan struct{} { return neverDone }
