// Package clienttest is the one test suite every scriptcache.Client
// implementation runs: the rueidis client of the core module and the
// go-redis adapter of module github.com/sluicekit/sluice/goredis. It checks
// the Client contract call by call, and then runs every primitive (mutex,
// semaphore, ratelimit) through its public API on a cache built on the
// client, against a real redis-server and a real 3-master Redis Cluster
// (package redistest). A client that passes it runs sluice.
//
// A package that runs it needs redistest.Main as its TestMain, which stops
// the shared servers and checks for leaked goroutines:
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
//
//	func TestClient(t *testing.T) {
//		clienttest.Run(t, func(t testing.TB, addrs []string) scriptcache.Client { ... })
//	}
//
// newClient gets the addresses of one server (one address) or of every node
// of a cluster (several), and returns a client of that server or cluster
// that lives until t ends.
package clienttest

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// NewClient returns a client of the server or cluster at addrs, closed
// when t ends.
type NewClient func(t testing.TB, addrs []string) scriptcache.Client

// target is one kind of deployment the suite runs on.
type target struct {
	name  string
	nodes func(t testing.TB) []*redistest.Server
}

func targets() []target {
	return []target{
		{"single", func(t testing.TB) []*redistest.Server { return []*redistest.Server{redistest.Single(t)} }},
		{"cluster", func(t testing.TB) []*redistest.Server { return redistest.SharedCluster(t).Nodes }},
	}
}

// env is what a test of the suite gets: the client under test and the
// servers behind it.
type env struct {
	name    string
	cluster bool
	nodes   []*redistest.Server
	addrs   []string
	client  scriptcache.Client
	newC    NewClient
}

// Run runs the suite on clients made by newClient: the contract of
// scriptcache.Client first, then every primitive, each as subtests "single"
// and "cluster".
func Run(t *testing.T, newClient NewClient) {
	for _, tc := range contractTests {
		t.Run(tc.name, func(t *testing.T) { each(t, newClient, tc.run) })
	}
	for _, tc := range primitiveTests {
		t.Run(tc.name, func(t *testing.T) { each(t, newClient, tc.run) })
	}
	t.Run("EvalWaitSlotMoved", func(t *testing.T) { testEvalWaitSlotMoved(t, newClient) })
}

type test struct {
	name string
	run  func(t *testing.T, e *env)
}

func each(t *testing.T, newClient NewClient, run func(t *testing.T, e *env)) {
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			nodes := tg.nodes(t)
			addrs := make([]string, len(nodes))
			for i, n := range nodes {
				addrs[i] = n.Addr()
			}
			e := &env{name: tg.name, cluster: tg.name == "cluster", nodes: nodes, addrs: addrs, newC: newClient}
			e.client = newClient(t, addrs)
			run(t, e)
		})
	}
}

// key returns a new key, unique to this run of the test (the suite runs
// more than once against the same servers), with hash tag tag (so keys of
// one call share a slot).
func key(t testing.TB, tag, name string) string {
	return fmt.Sprintf("{%s}:clienttest:%s:%s:%d", tag, strings.NewReplacer("/", ":", " ", "_").Replace(t.Name()), name, rand.Uint64())
}

func sha(body string) string {
	s := sha1.Sum([]byte(body))
	return hex.EncodeToString(s[:])
}

// nodeOf returns the cluster node that owns key's slot (the one that
// answers a keyed command without MOVED), or the single server.
func (e *env) nodeOf(t testing.TB, key string) *redistest.Server {
	t.Helper()
	if !e.cluster {
		return e.nodes[0]
	}
	for _, n := range e.nodes {
		if _, err := n.Do("EXISTS", key); err == nil {
			return n
		} else if !strings.HasPrefix(err.Error(), "MOVED") {
			t.Fatalf("EXISTS %s on %s: %v", key, n.Addr(), err)
		}
	}
	t.Fatalf("no node owns the slot of %s", key)
	return nil
}

// do runs a command on the node that owns key.
func (e *env) do(t testing.TB, key string, args ...string) string {
	t.Helper()
	out, err := e.nodeOf(t, key).Do(args...)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return out
}

var contractTests = []test{
	{"Cluster", testCluster},
	{"EvalValues", testEvalValues},
	{"EvalErrors", testEvalErrors},
	{"EvalCancel", testEvalCancel},
	{"LoadScriptsAndNoScript", testLoadScripts},
	{"EvalWait", testEvalWait},
	{"EvalWaitLongTimeout", testEvalWaitLong},
	{"EvalWaitCancel", testEvalWaitCancel},
	{"Subscribe", testSubscribe},
	{"SubscribeRefused", testSubscribeRefused},
}

func testCluster(t *testing.T, e *env) {
	if got := e.client.Cluster(); got != e.cluster {
		t.Fatalf("Cluster() = %v, want %v", got, e.cluster)
	}
}

// evalBoth runs body with EVAL and, after loading it, with EVALSHA.
func evalBoth(t *testing.T, e *env, body string, keys, args []string) [2]scriptcache.Reply {
	t.Helper()
	ctx := context.Background()
	r1 := e.client.Eval(ctx, "", body, keys, args)
	if err := e.client.LoadScripts(ctx, body); err != nil {
		t.Fatalf("LoadScripts: %v", err)
	}
	r2 := e.client.Eval(ctx, sha(body), "", keys, args)
	return [2]scriptcache.Reply{r1, r2}
}

func testEvalValues(t *testing.T, e *env) {
	k := key(t, "v", "k")
	ints := evalBoth(t, e, "return redis.call('INCRBY', KEYS[1], ARGV[1])", []string{k}, []string{"5"})
	for i, want := range []int64{5, 10} {
		if n, err := ints[i].AsInt64(); err != nil || n != want {
			t.Errorf("INCRBY call %d = %d, %v; want %d", i, n, err, want)
		}
	}
	for _, r := range evalBoth(t, e, "return KEYS[1] .. '=' .. ARGV[1]", []string{k}, []string{"x y"}) {
		if s, err := r.ToString(); err != nil || s != k+"=x y" {
			t.Errorf("string reply = %q, %v", s, err)
		}
	}
	// A string of digits reads as an integer too.
	for _, r := range evalBoth(t, e, "return '42'", nil, nil) {
		if n, err := r.AsInt64(); err != nil || n != 42 {
			t.Errorf("'42' as integer = %d, %v", n, err)
		}
	}
	// Lua nil and false are nil replies, not errors; true is 1 (RESP3
	// clients must not leak booleans).
	for _, body := range []string{"return nil", "return false", "return redis.call('GET', KEYS[1] .. ':missing')"} {
		for _, r := range evalBoth(t, e, body, []string{k}, nil) {
			if err := r.Error(); err != nil {
				t.Errorf("%s: Error() = %v, want nil", body, err)
			}
			if r.ServerError() {
				t.Errorf("%s: ServerError() = true", body)
			}
			if _, err := r.ToArray(); err == nil {
				t.Errorf("%s: ToArray of nil succeeded", body)
			}
		}
	}
	for _, r := range evalBoth(t, e, "return true", nil, nil) {
		if n, err := r.AsInt64(); err != nil || n != 1 {
			t.Errorf("true = %d, %v; want 1", n, err)
		}
	}
	// A double (a table with a double field: a RESP3 double, which Redis
	// sends a RESP2 client as its text) reads as the text RESP2 gives, the
	// shortest that reads back as the same number: not rounded, no ".0"
	// added. The values are exact in binary, so every protocol agrees.
	for _, d := range []string{"3.125", "-0.5", "2"} {
		for _, r := range evalBoth(t, e, "return {double = tonumber(ARGV[1])}", nil, []string{d}) {
			if s, err := r.ToString(); err != nil || s != d {
				t.Errorf("double %s = %q, %v; want %q", d, s, err, d)
			}
		}
	}
	// Nested arrays with every element type, as the primitives' scripts
	// return them.
	body := "return {1, 'two', {3, false, 'four', {}}, false, -7, redis.call('HGETALL', KEYS[1] .. ':nohash')}"
	for _, r := range evalBoth(t, e, body, []string{k}, nil) {
		checkNested(t, r)
	}
}

func checkNested(t *testing.T, r scriptcache.Reply) {
	t.Helper()
	a, err := r.ToArray()
	if err != nil {
		t.Fatalf("ToArray: %v", err)
	}
	if a.Len() != 6 {
		t.Fatalf("Len = %d, want 6", a.Len())
	}
	if n, err := a.At(0).AsInt64(); err != nil || n != 1 {
		t.Errorf("[0] = %d, %v", n, err)
	}
	if s, err := a.At(1).ToString(); err != nil || s != "two" {
		t.Errorf("[1] = %q, %v", s, err)
	}
	in, err := a.At(2).ToArray()
	if err != nil || in.Len() != 4 {
		t.Fatalf("[2] = %v (len %d), want a 4-element array", err, in.Len())
	}
	if n, err := in.At(0).AsInt64(); err != nil || n != 3 {
		t.Errorf("[2][0] = %d, %v", n, err)
	}
	if !in.At(1).IsNil() {
		t.Errorf("[2][1] (false) is not nil")
	}
	if s, err := in.At(2).ToString(); err != nil || s != "four" {
		t.Errorf("[2][2] = %q, %v", s, err)
	}
	if e, err := in.At(3).ToArray(); err != nil || e.Len() != 0 {
		t.Errorf("[2][3] = %v, len %d; want an empty array", err, e.Len())
	}
	if !a.At(3).IsNil() {
		t.Errorf("[3] (false) is not nil")
	}
	if a.At(4).IsNil() {
		t.Errorf("[4] is nil")
	}
	if n, err := a.At(4).AsInt64(); err != nil || n != -7 {
		t.Errorf("[4] = %d, %v", n, err)
	}
	if e, err := a.At(5).ToArray(); err != nil || e.Len() != 0 {
		t.Errorf("[5] (HGETALL of nothing) = %v, len %d; want an empty array", err, e.Len())
	}
}

func testEvalErrors(t *testing.T, e *env) {
	k := key(t, "e", "k")
	cases := []struct {
		body, want string
	}{
		{"return redis.error_reply('MYERR custom failure')", "MYERR custom failure"},
		{"return {err = 'OTHER table error'}", "OTHER table error"},
		{"redis.call('SET', KEYS[1], 'x'); return redis.call('INCR', KEYS[1])", "not an integer"},
		{"return redis.call('NOSUCHCOMMAND')", "Unknown"},
	}
	for _, c := range cases {
		for _, r := range evalBoth(t, e, c.body, []string{k}, nil) {
			err := r.Error()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: Error() = %v, want one containing %q", c.body, err, c.want)
			}
			if !r.ServerError() {
				t.Errorf("%s: ServerError() = false for %v", c.body, err)
			}
			if _, err2 := r.AsInt64(); err2 == nil {
				t.Errorf("%s: AsInt64 of an error reply succeeded", c.body)
			}
		}
	}
	// A syntax error in EVAL is the server's reply too.
	r := e.client.Eval(context.Background(), "", "return (", []string{k}, nil)
	if r.Error() == nil || !r.ServerError() {
		t.Errorf("syntax error: Error() = %v, ServerError() = %v", r.Error(), r.ServerError())
	}
}

// testEvalCancel checks that Eval returns when its context ends while the
// server does not answer (SIGSTOP), with the context's error: the outcome
// is unknown, not a server error. Once the server answers again, the client
// works as before. It runs on a server of its own, on the single target
// only: a cluster client takes the same path once it has picked a node.
func testEvalCancel(t *testing.T, e *env) {
	if e.cluster {
		t.Skip("same path as single")
	}
	ctx := context.Background()
	srv := redistest.NewServer(t)
	client := e.newC(t, []string{srv.Addr()})
	k := key(t, "c", "k")
	body := "return redis.call('INCR', KEYS[1])"
	if err := client.Eval(ctx, "", body, []string{k}, nil).Error(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = srv.Resume() // cleanup: the test has failed already
		}
	}()
	for _, withDeadline := range []bool{false, true} {
		cctx, cancel := context.WithCancel(ctx)
		if withDeadline {
			cctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
		}
		done := make(chan scriptcache.Reply, 1)
		go func() { done <- client.Eval(cctx, "", body, []string{k}, nil) }()
		if !withDeadline {
			cancel()
		}
		var r scriptcache.Reply
		select {
		case r = <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("Eval still running 20 s after its context ended (deadline %v)", withDeadline)
		}
		cancel()
		err := r.Error()
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Eval on a stopped server, context ended (deadline %v): Error() = %v, want the context's error", withDeadline, err)
		}
		if r.ServerError() {
			t.Errorf("ServerError() = true for %v", err)
		}
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	if !redistest.WaitFor(ctx, 20*time.Second, func() bool {
		return client.Eval(ctx, "", body, []string{k}, nil).Error() == nil
	}) {
		t.Errorf("Eval fails after the server answers again")
	}
}

func testLoadScripts(t *testing.T, e *env) {
	ctx := context.Background()
	body := "return 'loaded:' .. ARGV[1] -- " + t.Name()
	if err := e.client.LoadScripts(ctx, body, body+" second"); err != nil {
		t.Fatalf("LoadScripts: %v", err)
	}
	for _, n := range e.nodes {
		for _, b := range []string{body, body + " second"} {
			out, err := n.Do("SCRIPT", "EXISTS", sha(b))
			if err != nil || out != "1" {
				t.Errorf("SCRIPT EXISTS on %s = %q, %v; want 1", n.Addr(), out, err)
			}
		}
	}
	k := key(t, "ns", "k")
	if s, err := e.client.Eval(ctx, sha(body), "", []string{k}, []string{"a"}).ToString(); err != nil || s != "loaded:a" {
		t.Fatalf("EVALSHA = %q, %v", s, err)
	}
	for _, n := range e.nodes {
		if err := n.FlushScripts(); err != nil {
			t.Fatal(err)
		}
	}
	r := e.client.Eval(ctx, sha(body), "", []string{k}, []string{"a"})
	if err := r.Error(); err == nil || !strings.HasPrefix(err.Error(), "NOSCRIPT") || !r.ServerError() {
		t.Fatalf("EVALSHA after SCRIPT FLUSH: Error() = %v, ServerError() = %v; want a NOSCRIPT server error", err, r.ServerError())
	}
	if err := e.client.LoadScripts(ctx, body); err != nil {
		t.Fatalf("LoadScripts after the flush: %v", err)
	}
	if s, err := e.client.Eval(ctx, sha(body), "", []string{k}, []string{"b"}).ToString(); err != nil || s != "loaded:b" {
		t.Fatalf("EVALSHA after the reload = %q, %v", s, err)
	}
	// A keyless call goes to any node: the script is on all of them.
	for range 6 {
		if s, err := e.client.Eval(ctx, sha(body), "", nil, []string{"c"}).ToString(); err != nil || s != "loaded:c" {
			t.Fatalf("keyless EVALSHA = %q, %v", s, err)
		}
	}
	if err := e.client.LoadScripts(ctx, "return ("); err == nil {
		t.Errorf("LoadScripts of a script that does not compile succeeded")
	}
}

func testEvalWait(t *testing.T, e *env) {
	ctx := context.Background()
	k := key(t, "w", "k")
	body := "return redis.call('INCR', KEYS[1])"
	// No replicas: WAIT 0 answers at once, with 0 acknowledgements.
	for i, shaArg := range []string{"", sha(body)} {
		b := body
		if shaArg != "" {
			if err := e.client.LoadScripts(ctx, body); err != nil {
				t.Fatal(err)
			}
			b = ""
		}
		start := time.Now()
		r, acks, err := e.client.EvalWait(ctx, shaArg, b, []string{k}, nil, 0, 30*time.Second)
		if err != nil || acks != 0 {
			t.Fatalf("EvalWait = %d acks, %v", acks, err)
		}
		// WAIT 0 returns at once; 30 s would mean it waited its timeout.
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("EvalWait for 0 replicas took %v", d)
		}
		if n, err := r.AsInt64(); err != nil || n != int64(i+1) {
			t.Errorf("script reply = %d, %v; want %d", n, err, i+1)
		}
	}
	if got := e.do(t, k, "GET", k); got != "2" {
		t.Errorf("GET after two EvalWait calls = %q, want 2", got)
	}
	// An error reply comes back as the reply's server error.
	r, acks, err := e.client.EvalWait(ctx, "", "return redis.error_reply('MYERR no')", []string{k}, nil, 0, time.Second)
	if err == nil || r.Error() == nil || !r.ServerError() || acks != 0 {
		t.Errorf("EvalWait of an error reply = %v, %d acks, ServerError %v; want the server error", err, acks, r.ServerError())
	}
	// NOSCRIPT too, for the caller to reload.
	if err := e.nodeOf(t, k).FlushScripts(); err != nil {
		t.Fatal(err)
	}
	r, _, err = e.client.EvalWait(ctx, sha(body), "", []string{k}, nil, 0, time.Second)
	if err == nil || !strings.HasPrefix(r.Error().Error(), "NOSCRIPT") || !r.ServerError() {
		t.Errorf("EvalWait after SCRIPT FLUSH = %v; want a NOSCRIPT server error", err)
	}
}

// testEvalWaitLong waits for a replica that does not exist for longer than
// the read timeouts clients commonly default to (go-redis: 3 s): WAIT's
// reply must be waited for, not cut off.
func testEvalWaitLong(t *testing.T, e *env) {
	if testing.Short() {
		t.Skip("waits 3.5 s")
	}
	k := key(t, "wl", "k")
	const timeout = 3500 * time.Millisecond
	start := time.Now()
	r, acks, err := e.client.EvalWait(context.Background(), "", "return redis.call('INCR', KEYS[1])", []string{k}, nil, 1, timeout)
	if err != nil || acks != 0 {
		t.Fatalf("EvalWait for a missing replica = %d acks, %v; want 0 after the timeout", acks, err)
	}
	if d := time.Since(start); d < timeout-100*time.Millisecond {
		t.Errorf("EvalWait returned after %v, before WAIT's timeout %v", d, timeout)
	}
	if n, err := r.AsInt64(); err != nil || n != 1 {
		t.Errorf("script reply = %d, %v", n, err)
	}
}

// testEvalWaitCancel ends EvalWait's context while WAIT blocks for a
// replica that does not exist, with a timeout of 20 s: EvalWait must
// return at once with the context's error, whether the server still
// answers or has stopped (SIGSTOP) meanwhile. A primitive's Close ends such calls this way
// and waits for them (issue 31, item 5: go-redis waited out WAIT, 20 s,
// or its read timeout on a stopped server). It runs on a server of its
// own, on the single target only: a cluster client takes the same path
// once it has picked a node.
func testEvalWaitCancel(t *testing.T, e *env) {
	if e.cluster {
		t.Skip("same path as single")
	}
	srv := redistest.NewServer(t)
	client := e.newC(t, []string{srv.Addr()})
	k := key(t, "wc", "k")
	body := "return redis.call('INCR', KEYS[1])"
	for i, stop := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		type result struct {
			r    scriptcache.Reply
			acks int64
			err  error
		}
		done := make(chan result, 1)
		before := blocked(t, srv)
		go func() {
			r, acks, err := client.EvalWait(ctx, "", body, []string{k}, nil, 1, 20*time.Second)
			done <- result{r, acks, err}
		}()
		waitBlocked(t, srv, before)
		resume := pauseIf(t, srv, stop)
		start := time.Now()
		cancel()
		var got result
		select {
		case got = <-done:
		case <-time.After(signal):
			t.Fatalf("server stopped %v: EvalWait still running %v after its context ended, with WAIT's timeout 20 s", stop, signal)
		}
		took := time.Since(start)
		resume()
		if !errors.Is(got.err, context.Canceled) {
			t.Errorf("server stopped %v: EvalWait cancelled in WAIT = %v after %v; want an error wrapping context.Canceled", stop, got.err, took)
		}
		if got.acks != 0 {
			t.Errorf("server stopped %v: %d acks; want 0", stop, got.acks)
		}
		// The script ran before WAIT: its reply, if the client kept it,
		// says so; an error must not pass for the server's.
		if n, err := got.r.AsInt64(); err == nil && n != int64(i+1) || err != nil && got.r.ServerError() {
			t.Errorf("server stopped %v: the script's reply = %d, %v (server error %v); want %d or no reply", stop, n, err, got.r.ServerError(), i+1)
		}
	}
}

// blocked returns how many clients srv has blocked in a command (WAIT).
func blocked(t testing.TB, srv *redistest.Server) int {
	t.Helper()
	out, err := srv.Do("INFO", "clients")
	if err != nil {
		t.Fatalf("INFO clients: %v", err)
	}
	for _, line := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(line, "blocked_clients:"); ok {
			var n int
			if _, err := fmt.Sscan(v, &n); err != nil {
				t.Fatalf("INFO clients: %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("INFO clients without blocked_clients: %q", out)
	return 0
}

// waitBlocked waits until srv has more than n clients blocked in a
// command: a call under test has reached WAIT. (A WAIT that a client left
// to its own timeout may still block on the server, so the count before
// the call is the baseline.)
func waitBlocked(t testing.TB, srv *redistest.Server, n int) {
	t.Helper()
	if !redistest.WaitFor(context.Background(), signal, func() bool { return blocked(t, srv) > n }) {
		t.Fatalf("%s: no more than %d clients blocked after %v", srv.Addr(), n, signal)
	}
}

// pauseIf stops srv (SIGSTOP) if stop is set, and returns what resumes it
// (also when the test ends).
func pauseIf(t testing.TB, srv *redistest.Server, stop bool) (resume func()) {
	t.Helper()
	if !stop {
		return func() {}
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	return srv.Resumer(t)
}

// sub runs Subscribe in a goroutine and reports what it calls.
type sub struct {
	confirmed chan struct{} // one value per subscribed call
	messages  chan string
	done      chan error
	cancel    context.CancelFunc
}

func subscribe(e *env, channel string, sharded bool) *sub {
	ctx, cancel := context.WithCancel(context.Background())
	s := &sub{confirmed: make(chan struct{}, 16), messages: make(chan string, 100), done: make(chan error, 1), cancel: cancel}
	go func() {
		s.done <- e.client.Subscribe(ctx, channel, sharded,
			func() { s.confirmed <- struct{}{} },
			func(p string) { s.messages <- p })
	}()
	return s
}

// wait waits for the first confirmation, or fails.
func (s *sub) wait(t *testing.T) {
	t.Helper()
	select {
	case <-s.confirmed:
	case err := <-s.done:
		t.Fatalf("Subscribe returned before confirming: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatalf("no subscription confirmed after 20 s")
	}
}

// stop cancels the subscription and waits for Subscribe to return.
func (s *sub) stop(t *testing.T) error {
	t.Helper()
	s.cancel()
	select {
	case err := <-s.done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("Subscribe still running 20 s after its context ended")
		return nil
	}
}

var channelSeq atomic.Int64

func testSubscribe(t *testing.T, e *env) {
	for _, sharded := range []bool{false, true} {
		t.Run(fmt.Sprintf("sharded=%v", sharded), func(t *testing.T) {
			channel := fmt.Sprintf("clienttest:ch:%d:{%s}", channelSeq.Add(1), strings.ReplaceAll(t.Name(), "/", ":"))
			s := subscribe(e, channel, sharded)
			s.wait(t)
			pub, numsub := "PUBLISH", "NUMSUB"
			if sharded {
				pub, numsub = "SPUBLISH", "SHARDNUMSUB"
			}
			const n = 20
			for i := range n {
				// SPUBLISH must go to the channel's shard; PUBLISH on a
				// cluster reaches every node.
				e.do(t, channel, pub, channel, fmt.Sprint(i))
			}
			for i := range n {
				select {
				case p := <-s.messages:
					if p != fmt.Sprint(i) {
						t.Fatalf("message %d = %q, want %d (in order)", i, p, i)
					}
				case err := <-s.done:
					t.Fatalf("Subscribe returned: %v", err)
				case <-time.After(20 * time.Second):
					t.Fatalf("message %d not delivered after 20 s", i)
				}
			}
			err := s.stop(t)
			if errors.Is(err, scriptcache.ErrRefused) {
				t.Errorf("Subscribe after cancel = %v, not a refusal", err)
			}
			// The server forgets the subscription with the connection.
			if !redistest.WaitFor(context.Background(), 10*time.Second, func() bool {
				for _, node := range e.nodes {
					out, err := node.Do("PUBSUB", numsub, channel)
					if err != nil || !strings.HasSuffix(out, "\n0") {
						return false
					}
				}
				return true
			}) {
				t.Errorf("the server still counts a subscriber of %s after Subscribe returned", channel)
			}
			select {
			case <-s.confirmed:
			default:
			}
		})
	}
	// Cancelled before anything happens: returns at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.client.Subscribe(ctx, "clienttest:cancelled", false, func() {}, func(string) {}); err == nil {
		t.Errorf("Subscribe with an ended context returned nil")
	}
}

// testSubscribeRefused takes every channel from the default user (Redis 7
// ACL resetchannels, what a new ACL user starts with): SUBSCRIBE is refused
// with NOPERM, which Subscribe must report wrapping ErrRefused rather than
// as a failure to retry.
func testSubscribeRefused(t *testing.T, e *env) {
	nodes := e.nodes
	client := e.client
	if !e.cluster {
		// A server of its own: the shared one's default user stays as it is.
		srv := redistest.NewServer(t)
		nodes = []*redistest.Server{srv}
		client = e.newC(t, []string{srv.Addr()})
	}
	for _, n := range nodes {
		if _, err := n.Do("ACL", "SETUSER", "default", "resetchannels"); err != nil {
			t.Fatalf("ACL SETUSER on %s: %v", n.Addr(), err)
		}
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			if _, err := n.Do("ACL", "SETUSER", "default", "allchannels"); err != nil {
				t.Errorf("restore ACL on %s: %v", n.Addr(), err)
			}
		}
	})
	for _, sharded := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := client.Subscribe(ctx, "clienttest:refused:{x}", sharded, func() {
			t.Errorf("subscribed with no channel access")
		}, func(string) {})
		cancel()
		if !errors.Is(err, scriptcache.ErrRefused) || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("sharded=%v: Subscribe = %v, want ErrRefused with NOPERM", sharded, err)
		}
	}
}
