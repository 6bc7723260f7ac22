// Package goredis runs sluice's primitives (mutex, semaphore, ratelimit) on
// a go-redis v9 client, so that an application already using go-redis does
// not need a second Redis client. It lives in a module of its own: the core
// module runs on rueidis and does not depend on go-redis.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	client, err := goredis.New(ctx, rdb) // a *sluice.Client, as sluice.New returns
//	locks, err := mutex.NewLocker(client, mutex.Options{})
//
// Wrap adapts a *redis.Client (including the Sentinel failover client of
// redis.NewFailoverClient) or a *redis.ClusterClient to scriptcache.Client;
// New wraps it and loads the scripts. A *redis.Ring is refused: it shards
// keys by consistent hashing on the client, so a lock's keys would move
// between servers whenever a shard is added or removed, and its pub/sub
// would not reach the shard that holds the keys.
//
// # How go-redis is driven
//
// Scripts are sent as commands go-redis never retries. go-redis retries a
// command whose connection broke after it was sent (MaxRetries, 3 by
// default); for a script that takes a lock or a permit, running it a second
// time is not harmless (a reentrant lock would count two holds), so the
// adapter marks its EVAL and EVALSHA calls as not retryable. MOVED and ASK
// redirections, which mean the script did not run, are still followed.
//
// go-redis sees a context's deadline only with Options.ContextTimeoutEnabled
// (ClusterOptions for a cluster), and never its cancellation: a read waits
// for the reply, for ReadTimeout (3 s by default) or, with that option, for
// the deadline. The primitives, though, must return when their context
// ends (Lock gives up when asked to). So:
//
//   - With ContextTimeoutEnabled, a call whose context has a deadline runs
//     in the caller's goroutine, and go-redis ends it at the deadline (the
//     connection is then closed: its reply may still come). This is the
//     cheap way: set the option where sluice runs. Such a call notices a
//     cancellation before its deadline only when its reply comes, as
//     rueidis's lone calls do (see scriptcache.New); the calls that a
//     Locker's or Manager's Close waits for (watchdog renewals, give-backs)
//     carry no deadline, so they never take this way.
//   - Otherwise, when ctx can end, Eval runs the call in a goroutine and
//     returns ctx.Err() as soon as ctx ends; the call itself goes on until
//     the reply comes or ReadTimeout ends it. That goroutine is the
//     adapter's: Close of a Locker or Manager does not wait for it (go-redis
//     offers no way to end the call sooner), so it may outlive Close by up
//     to ReadTimeout. A goroutine-leak check in tests must allow for it, or
//     use the rueidis client, or ContextTimeoutEnabled and deadlines.
//   - EvalWait (ReplicaAcks) always takes the second way when ctx can end,
//     with or without the option: its call may go on after Close until
//     WAIT's timeout plus 10 s (see Client.EvalWait).
//
// Either way the primitive treats a call cut short as of unknown outcome,
// as it does with rueidis, and no script call is sent twice.
//
// On a client of one server (not a cluster), script calls are coalesced:
// at most four are under way at once (fewer if PoolSize is smaller), and
// those that come meanwhile go out together, as one pipeline, when one of
// them ends. Under load that is one round trip for many calls; a queued
// call also returns when its context ends, and is never sent twice. A hook
// on the go-redis client sees those calls as a pipeline.
//
// go-redis's ErrPoolTimeout and ErrPoolExhausted, which mean that every
// pooled connection is busy (as they are while calls wait for a server
// that stopped answering), come back marked as scriptcache.ErrUnavailable,
// so that ratelimit.Unavailable counts them as an outage and a fallback
// answers; the text stays go-redis's. ErrClosed, a client its owner
// closed, is not marked.
//
// Keys and arguments go into go-redis commands as *string (no allocation
// per argument), so a hook that prints a command (cmd.String, tracing)
// shows them as addresses.
package goredis

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/scriptcache"
)

// Errors returned by Wrap and New; check them with errors.Is.
var (
	// ErrNilClient means Wrap was given a nil client.
	ErrNilClient = errors.New("goredis: nil client")
	// ErrRing means Wrap was given a *redis.Ring, whose client-side
	// sharding cannot keep a lock's keys and its wake-ups on one server.
	ErrRing = errors.New("goredis: *redis.Ring is not supported (use a *redis.Client or a *redis.ClusterClient)")
	// ErrUnsupported means Wrap was given a redis.UniversalClient that is
	// neither a *redis.Client nor a *redis.ClusterClient.
	ErrUnsupported = errors.New("goredis: unsupported client type")
)

// Client adapts a go-redis client to scriptcache.Client. It is safe for
// concurrent use. It does not own the go-redis client: closing that is the
// caller's business, after the primitives using it are closed.
type Client struct {
	single  *redis.Client        // set unless cluster
	cluster *redis.ClusterClient // set for a Redis Cluster
	cmd     interface {
		Process(ctx context.Context, cmd redis.Cmder) error
	} // whichever is set
	// deadlines: the client's ContextTimeoutEnabled, with which go-redis
	// puts a call's context deadline on its connection's reads and writes.
	deadlines bool
	co        coalescer // the calls waiting for a pipeline; not on a cluster
	// quiet: how long a subscription's connection may go without any
	// reply before Subscribe sends a PING, and then without the PONG
	// before it gives the connection up (see Subscribe).
	quiet time.Duration
	// now is time.Now; a test sets another clock (SetClock) to put a
	// reply's arrival past its call's deadline, an instant no real call
	// can pick.
	now func() time.Time
}

// subscriptionQuiet is Client.quiet's default: a connection that silently
// died (a NAT or a load balancer dropped it, a partition) is given up
// within 10 to 15 seconds, at the cost of a PING every 5 seconds on an
// idle subscription.
const subscriptionQuiet = 5 * time.Second

var _ scriptcache.Client = (*Client)(nil)

// Wrap adapts c, a *redis.Client (plain or a Sentinel failover client) or
// a *redis.ClusterClient.
func Wrap(c redis.UniversalClient) (*Client, error) {
	switch x := c.(type) {
	case nil:
		return nil, ErrNilClient
	case *redis.Client:
		if x == nil {
			return nil, ErrNilClient
		}
		return &Client{single: x, cmd: x, deadlines: x.Options().ContextTimeoutEnabled, co: coalescer{max: min(maxInFlight, x.Options().PoolSize)}, quiet: subscriptionQuiet, now: time.Now}, nil
	case *redis.ClusterClient:
		if x == nil {
			return nil, ErrNilClient
		}
		return &Client{cluster: x, cmd: x, deadlines: x.Options().ContextTimeoutEnabled, quiet: subscriptionQuiet, now: time.Now}, nil
	case *redis.Ring:
		return nil, ErrRing
	default:
		return nil, fmt.Errorf("%w: %T", ErrUnsupported, c)
	}
}

// New wraps c (see Wrap) and loads sluice's scripts into every node it
// knows: the *sluice.Client every primitive's constructor takes, as
// sluice.New returns for rueidis.
//
// If ctx ends before the server answers, the error wraps ctx.Err() and,
// when a connection to the server could not be opened, the reason
// (errors.As finds the *net.OpError of a refused connection): go-redis
// retries failed dials until ctx ends and only logs why they failed. To
// find it, New dials the server once itself if loading has not finished
// within 100 ms (or half the time left to ctx's deadline, if less).
func New(ctx context.Context, c redis.UniversalClient, opts ...sluice.Option) (*sluice.Client, error) {
	w, err := Wrap(c)
	if err != nil {
		return nil, err
	}
	p := w.startProbe(ctx)
	sc, err := scriptcache.NewFrom(ctx, w, opts...)
	if dialErr := p.stop(); err != nil && ctx.Err() != nil && dialErr != nil {
		return nil, fmt.Errorf("%w; goredis: cannot connect: %w", err, dialErr)
	}
	return sc, err
}

// probeAfter is how long New waits for the server before it dials the
// server itself to learn why it does not answer.
const probeAfter = 100 * time.Millisecond

// probe is New's own dial of the server: its error, if the dial failed.
type probe struct {
	timer  *time.Timer
	cancel context.CancelFunc
	done   chan struct{} // closed when the dial has ended, if it started
	err    error         // the dial's; read after done is closed
}

// startProbe dials the server in a goroutine after probeAfter (or half the
// time left to ctx's deadline), under ctx. A ctx that cannot end needs no
// probe: go-redis then returns the dial error itself.
func (c *Client) startProbe(ctx context.Context) *probe {
	if ctx.Done() == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &probe{cancel: cancel, done: make(chan struct{})}
	after := probeAfter
	if d, ok := ctx.Deadline(); ok {
		after = min(after, time.Until(d)/2)
	}
	p.timer = time.AfterFunc(after, func() {
		defer close(p.done)
		p.err = c.dial(ctx)
	})
	return p
}

// stop ends the probe and returns the error of its dial if that has failed
// by now; a dial still under way is cancelled, and waited for, but says
// nothing.
func (p *probe) stop() error {
	if p == nil {
		return nil
	}
	defer p.cancel()
	if p.timer.Stop() {
		return nil // never started
	}
	select {
	case <-p.done:
		return p.err
	default:
	}
	p.cancel()
	<-p.done
	return nil
}

// dial opens a connection to the server the client is configured for, as
// go-redis would (its Dialer: for a Sentinel failover client, through the
// sentinels), and closes it. For a cluster it tries each seed address and
// returns the first error if none connects.
func (c *Client) dial(ctx context.Context) error {
	var addrs []string
	var dialer func(ctx context.Context, network, addr string) (net.Conn, error)
	if c.cluster != nil {
		o := c.cluster.Options()
		addrs, dialer = o.Addrs, o.Dialer
	} else {
		o := c.single.Options()
		addrs, dialer = []string{o.Addr}, o.Dialer
	}
	if dialer == nil {
		var d net.Dialer
		dialer = d.DialContext
	}
	var first error
	for _, addr := range addrs {
		conn, err := dialer(ctx, "tcp", addr)
		if err == nil {
			conn.Close()
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// Cluster reports whether the wrapped client is a *redis.ClusterClient.
func (c *Client) Cluster() bool { return c.cluster != nil }

// noRetry is a command go-redis must not send twice: a script whose reply
// was lost may have run, and running it again would act twice. go-redis
// asks every command whether it may be retried after a network failure;
// embedding *redis.Cmd keeps everything else about it.
type noRetry struct{ *redis.Cmd }

func (noRetry) NoRetry() bool { return true }

// evalCmd builds EVALSHA sha (body empty) or EVAL body with keys and args.
// Keys and arguments go in as pointers to the elements of keys and args,
// which go-redis writes (and routes by) as the strings they point to: a
// string in an interface would cost an allocation each. So keys and args
// must not change while the command may still be sent; Eval's are its
// own (see scriptcache.Client). A hook that prints the command's
// arguments (cmd.String) shows those as addresses.
func evalCmd(ctx context.Context, sha, body string, keys, args []string) noRetry {
	a := make([]any, 0, 3+len(keys)+len(args))
	if body == "" {
		a = append(a, "evalsha", shaArg(sha))
	} else {
		a = append(a, "eval", body)
	}
	a = append(a, len(keys))
	for i := range keys {
		a = append(a, &keys[i])
	}
	for i := range args {
		a = append(a, &args[i])
	}
	cmd := redis.NewCmd(ctx, a...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3) // route by the first key on a cluster
	}
	return noRetry{cmd}
}

// shas holds each script digest evalCmd has sent as a *string, which goes
// into a command without an allocation (see evalCmd). A process sends a
// few dozen digests at most.
var shas sync.Map // string -> *string

// shaArg returns sha as a command argument.
func shaArg(sha string) any {
	if p, ok := shas.Load(sha); ok {
		return p
	}
	return storeSha(sha)
}

// storeSha is shaArg's first time for sha, apart so that sha escapes to
// the heap only then.
func storeSha(sha string) any {
	p, _ := shas.LoadOrStore(sha, &sha)
	return p
}

// Eval sends EVALSHA or EVAL. When ctx can end, the call runs in a
// goroutine of its own and Eval returns ctx.Err() once ctx ends, leaving
// the call to finish, unless go-redis bounds it by ctx's deadline itself
// (see the package doc). On a client of one server, a call that comes
// while maxInFlight others are under way waits for the next pipeline
// instead (see coalesce.go), and also returns when ctx ends.
func (c *Client) Eval(ctx context.Context, sha, body string, keys, args []string) scriptcache.Reply {
	if err := ctx.Err(); err != nil {
		return scriptcache.ErrorReply(err)
	}
	cmd := evalCmd(ctx, sha, body, keys, args)
	if q, now := c.co.enter(cmd); !now {
		rc, err := awaitQueued(ctx, q)
		if err != nil {
			return scriptcache.ErrorReply(err)
		}
		return reply(rc)
	}
	if c.deadlines {
		if d, ok := ctx.Deadline(); ok {
			// go-redis ends the call at the deadline, in this goroutine.
			_ = c.cmd.Process(ctx, cmd)
			c.leave()
			if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) && !isServerError(err) && !c.now().Before(d) {
				// Its connection's deadline passed, which may be a
				// moment before ctx's own timer fires: report it as
				// the deadline, as if ctx had ended during the call.
				return scriptcache.ErrorReply(context.DeadlineExceeded)
			}
			return reply(cmd.Cmd)
		}
	}
	if err := c.await(ctx, cmd); err != nil {
		return scriptcache.ErrorReply(err)
	}
	return reply(cmd.Cmd)
}

// call is a command of await that runs in a goroutine; done is buffered,
// so the goroutine never waits for the caller, and reused (calls) when
// the caller saw it through.
type call struct {
	ctx  context.Context
	cmd  redis.Cmder
	c    *Client
	done chan struct{}
}

var calls = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

func (cl *call) run() {
	_ = cl.c.cmd.Process(cl.ctx, cl.cmd)
	cl.c.leave()
	cl.done <- struct{}{}
}

// await runs cmd and returns when it has run, or, with ctx.Err(), when
// ctx ends first: then cmd runs on in a goroutine of its own until
// go-redis's own timeouts end it (see the package doc). A ctx that cannot
// end costs no goroutine.
func (c *Client) await(ctx context.Context, cmd redis.Cmder) error {
	if ctx.Done() == nil {
		_ = c.cmd.Process(ctx, cmd)
		c.leave()
		return nil
	}
	cl := calls.Get().(*call)
	cl.ctx, cl.cmd, cl.c = ctx, cmd, c
	go cl.run()
	select {
	case <-cl.done:
	case <-ctx.Done():
		select {
		case <-cl.done: // it came at the same moment
		default:
			return ctx.Err() // cl is the goroutine's now, never reused
		}
	}
	*cl = call{done: cl.done}
	calls.Put(cl)
	return nil
}

// awaitFunc runs f as await runs a command.
func awaitFunc(ctx context.Context, f func()) error {
	if ctx.Done() == nil {
		f()
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		select {
		case <-done: // it came at the same moment
			return nil
		default:
		}
		return ctx.Err()
	}
}

// reply maps a finished command to a Reply: redis.Nil is a nil value, an
// error reply from the server is a server error, anything else an error
// that leaves the outcome unknown.
func reply(cmd *redis.Cmd) scriptcache.Reply {
	v, err := cmd.Result()
	switch {
	case err == nil:
		return scriptcache.NewReply(value(v), nil, false)
	case errors.Is(err, redis.Nil):
		return scriptcache.NewReply(nil, nil, false)
	case isServerError(err):
		return scriptcache.NewReply(nil, err, true)
	default:
		return scriptcache.NewReply(nil, classify(err), false)
	}
}

// classify returns err, marked as scriptcache.ErrUnavailable if it is one
// of go-redis's own errors that mean the server cannot answer now (see
// scriptcache.ErrUnavailable): ErrPoolTimeout (every pooled connection
// stayed busy for PoolTimeout, as they do while calls wait for a server
// that stopped answering) and ErrPoolExhausted (MaxActiveConns reached,
// the same). Its text is err's. ErrClosed is not marked: a client its
// owner closed is a programming error, and no fallback answers for it.
// The standard library's errors (timeouts, failed connections) and the
// server's error replies need no mark.
func classify(err error) error {
	if errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) {
		return unavailableError{err}
	}
	return err
}

// unavailableError is err marked as scriptcache.ErrUnavailable.
type unavailableError struct{ error }

func (e unavailableError) Unwrap() []error { return []error{e.error, scriptcache.ErrUnavailable} }

// isServerError reports whether err is an error reply from the server.
func isServerError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil)
}

// value converts a reply value to the types of scriptcache.NewReply:
// int64, string, nil and []any. Under RESP2 (Protocol: 2) go-redis returns
// only those. Under RESP3, go-redis's default, Redis converts a Lua
// boolean to a RESP3 boolean and a table with a double, map or set field to
// the RESP3 type; value turns them back into what RESP2 gives (false is
// nil, true is 1, a double its decimal text, a map its flat array of keys
// and values), so the primitives read the same replies whatever the
// protocol. Arrays are converted in place: the command is ours.
func value(v any) any {
	switch x := v.(type) {
	case nil, int64, string:
		return v // as it is: x in a new interface would allocate again
	case []any:
		for i, e := range x {
			x[i] = value(e)
		}
		return v
	case bool:
		if x {
			return int64(1)
		}
		return nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case *big.Int:
		return x.String()
	case map[any]any:
		out := make([]any, 0, 2*len(x))
		for k, e := range x {
			out = append(out, value(k), value(e))
		}
		return out
	case map[string]any:
		out := make([]any, 0, 2*len(x))
		for k, e := range x {
			out = append(out, k, value(e))
		}
		return out
	default:
		// An error reply nested in an array, or a type go-redis may add:
		// kept, so reading it fails with an unexpected-type error.
		return x
	}
}

// EvalWait sends the script call and then WAIT replicas timeout on one
// connection taken from the pool for the pair (redis.Conn), so that WAIT
// counts the acknowledgements of the script's writes and of nothing else.
// On a cluster that connection is to the primary of keys[0]'s slot.
//
// The two are sent one after the other, not pipelined: go-redis reads a
// pipeline's replies under its ReadTimeout (3 s by default), which would
// cut off a WAIT whose timeout is longer, while a WAIT sent alone is read
// under its own timeout (plus 10 s). A MULTI/EXEC transaction is no way
// out either: inside it WAIT does not block. The cost is one more round
// trip, in a call that waits for replicas anyway.
//
// Neither call is retried on another connection: a WAIT on a fresh
// connection would count none of the script's writes and report every
// replica as acknowledging. A MOVED or ASK reply to the script, though,
// means it did not run: the pair is sent again, whole, on a connection to
// the primary named (ASKING first for ASK), up to maxRedirects times, as
// go-redis does for Eval; after MOVED the client reloads its slot map in
// the background.
//
// When ctx can end, the pair runs in a goroutine of its own and EvalWait
// returns as soon as ctx ends, as Eval does: with ctx.Err() alone if the
// script's reply has not come (its outcome is unknown), and with the
// script's reply if it has, the script having run, while WAIT blocks. A
// primitive's Close ends its calls in flight this way and waits for them,
// so a WAIT of ReplicaTimeout, or a server that stopped answering, does
// not hold Close up (issue 31, item 5). go-redis offers no way to close a
// connection another goroutine reads, so the call goes on, sending
// nothing more (no WAIT after a script whose reply came after ctx ended),
// until its reply comes or go-redis's timeouts end it: ReadTimeout for the
// script, WAIT's timeout plus 10 s for WAIT. Until then it holds its
// connection of the pool.
func (c *Client) EvalWait(ctx context.Context, sha, body string, keys, args []string, replicas int64, timeout time.Duration) (scriptcache.Reply, int64, error) {
	if ctx.Done() == nil {
		return c.evalWait(ctx, nil, sha, body, keys, args, replicas, timeout)
	}
	if err := ctx.Err(); err != nil {
		return scriptcache.ErrorReply(err), 0, err
	}
	ran := make(chan scriptcache.Reply, 1) // the script's reply, once it has run
	done := make(chan waitResult, 1)
	go func() {
		var res waitResult
		res.r, res.acks, res.err = c.evalWait(ctx, ran, sha, body, keys, args, replicas, timeout)
		done <- res
	}()
	select {
	case res := <-done:
		return res.r, res.acks, res.err
	case <-ctx.Done():
	}
	err := ctx.Err()
	select {
	case res := <-done: // it came at the same moment
		return res.r, res.acks, res.err
	default:
	}
	select {
	case r := <-ran:
		return r, 0, fmt.Errorf("goredis: wait: %w", err)
	default:
		return scriptcache.ErrorReply(err), 0, err
	}
}

// waitResult is what evalWait returns.
type waitResult struct {
	r    scriptcache.Reply
	acks int64
	err  error
}

// evalWait is EvalWait in the goroutine that runs it. It sends the
// script's reply to ran, if ran is not nil, once the script has run and
// before WAIT is sent.
func (c *Client) evalWait(ctx context.Context, ran chan<- scriptcache.Reply, sha, body string, keys, args []string, replicas int64, timeout time.Duration) (scriptcache.Reply, int64, error) {
	node := c.single
	if c.cluster != nil {
		key := ""
		if len(keys) > 0 {
			key = keys[0]
		}
		var err error
		if node, err = c.cluster.MasterForKey(ctx, key); err != nil {
			err = classify(err)
			return scriptcache.ErrorReply(err), 0, err
		}
	}
	asking := false
	for redirects := 0; ; redirects++ {
		r, acks, err := evalWaitOn(ctx, ran, node, asking, sha, body, keys, args, replicas, timeout)
		if c.cluster == nil || redirects == maxRedirects {
			return r, acks, err
		}
		addr, ask, ok := redirection(r)
		if !ok {
			return r, acks, err
		}
		if !ask {
			c.cluster.ReloadState(ctx) // in the background
		}
		next := c.masterAt(ctx, addr)
		if next == nil {
			return r, acks, err // a node the client does not know yet
		}
		node, asking = next, ask
	}
}

// maxRedirects bounds how many MOVED or ASK replies one EvalWait follows,
// as go-redis's ClusterOptions.MaxRedirects (3 by default) does for its
// own commands.
const maxRedirects = 3

// evalWaitOn runs the pair on a connection of node, after ASKING if
// asking, and sends the script's reply to ran (if not nil) before WAIT.
func evalWaitOn(ctx context.Context, ran chan<- scriptcache.Reply, node *redis.Client, asking bool, sha, body string, keys, args []string, replicas int64, timeout time.Duration) (scriptcache.Reply, int64, error) {
	conn := node.Conn()
	defer conn.Close()
	if asking {
		cmd := redis.NewStatusCmd(ctx, "asking")
		if err := conn.Process(ctx, cmd); err != nil {
			if !isServerError(err) {
				err = classify(err)
			}
			return scriptcache.NewReply(nil, err, isServerError(err)), 0, err
		}
	}
	cmd := evalCmd(ctx, sha, body, keys, args)
	_ = conn.Process(ctx, cmd)
	r := reply(cmd.Cmd)
	if err := r.Error(); err != nil {
		return r, 0, err
	}
	if err := ctx.Err(); err != nil {
		return r, 0, err
	}
	if ran != nil {
		ran <- r // once: a script that ran is not redirected
	}
	// WAIT takes whole milliseconds; 0 would mean forever.
	timeout = max(timeout.Truncate(time.Millisecond), time.Millisecond)
	acks, err := conn.Wait(ctx, int(replicas), timeout).Result()
	if err != nil {
		return r, 0, fmt.Errorf("goredis: wait: %w", classify(err))
	}
	return r, acks, nil
}

// redirection returns the address of a MOVED or ASK error reply, and
// whether it is ASK.
func redirection(r scriptcache.Reply) (addr string, ask, ok bool) {
	if !r.ServerError() {
		return "", false, false
	}
	f := strings.Fields(r.Error().Error())
	if len(f) != 3 || (f[0] != "MOVED" && f[0] != "ASK") {
		return "", false, false
	}
	return f[2], f[0] == "ASK", true
}

// masterAt returns the client of the primary at addr that the cluster
// client knows, or nil.
func (c *Client) masterAt(ctx context.Context, addr string) *redis.Client {
	var mu sync.Mutex
	var found *redis.Client
	_ = c.cluster.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
		if m.Options().Addr == addr {
			mu.Lock()
			found = m
			mu.Unlock()
		}
		return nil
	})
	return found
}

// LoadScripts sends SCRIPT LOAD of every body to every node: on a cluster
// to every primary and replica go-redis knows (ForEachShard), else to the
// client's server (for a Sentinel failover client, the current primary).
// Each node gets its loads in one pipeline. Like Eval, it returns when ctx
// ends: a reload after NOSCRIPT is part of the caller's call.
func (c *Client) LoadScripts(ctx context.Context, bodies ...string) error {
	errc := make(chan error, 1)
	if err := awaitFunc(ctx, func() { errc <- c.loadScripts(ctx, bodies...) }); err != nil {
		return err
	}
	return classify(<-errc)
}

func (c *Client) loadScripts(ctx context.Context, bodies ...string) error {
	load := func(ctx context.Context, node *redis.Client) error {
		cmds, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, b := range bodies {
				p.ScriptLoad(ctx, b)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("goredis: script load on %s: %w", node.Options().Addr, err)
		}
		for _, cmd := range cmds {
			if err := cmd.Err(); err != nil {
				return fmt.Errorf("goredis: script load on %s: %w", node.Options().Addr, err)
			}
		}
		return nil
	}
	if c.cluster != nil {
		return c.cluster.ForEachShard(ctx, load)
	}
	return load(ctx, c.single)
}

// Subscribe subscribes to channel on a connection of its own (go-redis's
// PubSub) and reads it until ctx ends or the connection fails, silence
// that outlasts a PING included (watchSubscription). go-redis's
// Receive does not return when a context without a deadline is cancelled,
// so the end of ctx closes the PubSub, which closes its connection: the
// server drops the subscription with it. Subscribe waits for that close
// before returning, so nothing it started outlives it.
//
// An error reply to the subscription that retrying cannot fix (NOPERM for
// an ACL user without access to the channel) is returned wrapping
// scriptcache.ErrRefused; any other failure is returned as it is, for the
// caller to retry.
func (c *Client) Subscribe(ctx context.Context, channel string, sharded bool, subscribed func(), message func(payload string)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// The PubSub is made empty and the channel subscribed in a second
	// step, whose error is kept: go-redis's Subscribe(ctx, channel)
	// drops it, and when the write of the subscription fails it has
	// already reconnected the PubSub, before recording the channel, on
	// a connection that carries no subscription. Receive on that one
	// would wait for ever (TestSubscribeWriteFails).
	var ps *redis.PubSub
	switch {
	case c.cluster != nil && sharded:
		ps = c.cluster.SSubscribe(ctx)
	case c.cluster != nil:
		ps = c.cluster.Subscribe(ctx)
	case sharded:
		ps = c.single.SSubscribe(ctx)
	default:
		ps = c.single.Subscribe(ctx)
	}
	var err error
	if sharded {
		err = ps.SSubscribe(ctx, channel) // a cluster routes it by the channel's slot
	} else {
		err = ps.Subscribe(ctx, channel)
	}
	if err != nil {
		ps.Close()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("goredis: subscribe %q: %w", channel, classify(err))
	}
	closed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(closed)
		ps.Close()
	})
	var heard, silent atomic.Bool
	stopWatch := c.watchSubscription(ctx, ps, &heard, &silent)
	defer func() {
		stopWatch()
		if stop() {
			ps.Close() // ctx did not end: close it here
		} else {
			<-closed // ctx ended: wait for its close to finish
		}
	}()
	for {
		msg, err := ps.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if silent.Load() {
				return fmt.Errorf("goredis: subscribe %q: no reply to a PING in %v: %w", channel, c.quiet, err)
			}
			if isServerError(err) && !scriptcache.Retryable(err.Error()) {
				return fmt.Errorf("%w: subscribe %q: %w", scriptcache.ErrRefused, channel, err)
			}
			return fmt.Errorf("goredis: subscribe %q: %w", channel, classify(err))
		}
		heard.Store(true)
		switch m := msg.(type) {
		case *redis.Subscription:
			switch m.Kind {
			case "subscribe", "ssubscribe":
				subscribed()
			case "unsubscribe", "sunsubscribe":
				// The server ended the subscription (a sharded
				// channel's slot moved): the caller subscribes again.
				return fmt.Errorf("goredis: subscription to %q ended by the server", channel)
			}
		case *redis.Message:
			message(m.Payload)
		}
	}
}

// watchSubscription gives up the connection of ps when it has gone
// silent: go-redis's Receive waits for ever on a connection that died
// without a reset (a NAT or a load balancer that dropped it, a
// partition), and the TCP keepalive of its dialer takes minutes to
// notice. Every c.quiet, unless Subscribe heard something since the last
// tick (heard), the watcher sends a PING; when the next tick finds
// nothing heard after it, not even the PONG, it sets silent and closes
// ps, which ends Subscribe's Receive. The returned stop ends the watcher
// and waits for it.
func (c *Client) watchSubscription(ctx context.Context, ps *redis.PubSub, heard, silent *atomic.Bool) (stop func()) {
	if c.quiet <= 0 {
		return func() {}
	}
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(c.quiet)
		defer t.Stop()
		pinged := false
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			switch {
			case heard.Swap(false):
				pinged = false
			case pinged:
				silent.Store(true)
				ps.Close()
				return
			default:
				pinged = true
				pctx, cancel := context.WithTimeout(ctx, c.quiet)
				_ = ps.Ping(pctx) // a failed write fails Receive too
				cancel()
			}
		}
	}()
	return func() {
		close(done)
		<-ended
	}
}
