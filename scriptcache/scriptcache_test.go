package scriptcache_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// testFS holds scripts whose replies show that they ran with the keys and
// arguments given.
var testFS = fstest.MapFS{
	"echo.lua":  {Data: []byte("-- echo: returns KEYS[1] .. ARGV[1]\nreturn KEYS[1] .. ARGV[1]\n")},
	"incr.lua":  {Data: []byte("-- incr: INCR KEYS[1]\nreturn redis.call('INCR', KEYS[1])\n")},
	"notes.txt": {Data: []byte("not a script")},
}

// target is one kind of server the cache must work the same on.
type target struct {
	name   string
	client func(t *testing.T) rueidis.Client
	flush  func(t *testing.T) // SCRIPT FLUSH on every node
}

func targets() []target {
	return []target{
		{
			name: "single",
			client: func(t *testing.T) rueidis.Client {
				return redistest.Client(t, redistest.Single(t).Addr())
			},
			flush: func(t *testing.T) {
				if err := redistest.Single(t).FlushScripts(); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "cluster",
			client: func(t *testing.T) rueidis.Client {
				return redistest.Client(t, redistest.SharedCluster(t).Addrs()...)
			},
			flush: func(t *testing.T) {
				for _, n := range redistest.SharedCluster(t).Nodes {
					if err := n.FlushScripts(); err != nil {
						t.Fatal(err)
					}
				}
			},
		},
		{
			name:   "miniredis",
			client: miniClient,
			flush:  nil, // miniredis has no script cache to lose in a useful way
		},
	}
}

func miniClient(t *testing.T) rueidis.Client {
	t.Helper()
	mr := miniredis.RunT(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestExec(t *testing.T) {
	ctx := context.Background()
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) {
			sc, err := scriptcache.New(ctx, tg.client(t), scriptcache.WithFS(testFS))
			if err != nil {
				t.Fatal(err)
			}
			s, err := sc.Script("echo")
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Exec(ctx, []string{"{k}a"}, []string{"-b"}).ToString()
			if err != nil || got != "{k}a-b" {
				t.Fatalf("Exec = %q, %v; want %q", got, err, "{k}a-b")
			}
			if _, err := sc.Script("nope"); !errors.Is(err, scriptcache.ErrUnknownScript) {
				t.Errorf("Script(nope) err = %v, want ErrUnknownScript", err)
			}
			if _, err := sc.Script("notes"); !errors.Is(err, scriptcache.ErrUnknownScript) {
				t.Errorf("Script(notes) err = %v, want ErrUnknownScript (not a .lua file)", err)
			}
			// rueidis treats miniredis as a one-node cluster (it answers
			// CLUSTER SLOTS); it has no sharded pub/sub either way.
			if want := tg.name == "cluster"; sc.ShardedPubSub() != want || (tg.name != "miniredis" && sc.Cluster() != want) {
				t.Errorf("Cluster() = %v, ShardedPubSub() = %v, want %v", sc.Cluster(), sc.ShardedPubSub(), want)
			}
		})
	}
}

// TestNoScriptRecovery flushes the script cache between calls: no caller may
// see NOSCRIPT or any other error.
func TestNoScriptRecovery(t *testing.T) {
	ctx := context.Background()
	for _, tg := range targets() {
		if tg.flush == nil {
			continue
		}
		t.Run(tg.name, func(t *testing.T) {
			client := tg.client(t)
			sc, err := scriptcache.New(ctx, client, scriptcache.WithFS(testFS))
			if err != nil {
				t.Fatal(err)
			}
			s, _ := sc.Script("incr")
			key := "{sc}:flush:" + t.Name()
			if err := client.Do(ctx, client.B().Del().Key(key).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			for i := 1; i <= 20; i++ {
				if i%3 == 0 {
					tg.flush(t)
				}
				n, err := s.Exec(ctx, []string{key}, nil).AsInt64()
				if err != nil || n != int64(i) {
					t.Fatalf("call %d: Exec = %d, %v", i, n, err)
				}
			}
		})
	}
}

// TestNoScriptStorm sends many concurrent calls right after a flush: all
// succeed, and the script is loaded again a handful of times at most, not
// once per caller.
func TestNoScriptStorm(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	client := redistest.Client(t, srv.Addr())
	sc, err := scriptcache.New(ctx, client, scriptcache.WithFS(testFS))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sc.Script("incr")
	const callers = 64
	for round := range 5 {
		if err := srv.FlushScripts(); err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		start := make(chan struct{})
		for range callers {
			wg.Go(func() {
				<-start
				if err := s.Exec(ctx, []string{"storm"}, nil).Error(); err != nil {
					errs <- err
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: caller saw %v", round, err)
		}
		loads := commandCalls(t, srv, "script|load")
		evals := commandCalls(t, srv, "eval")
		if loads+evals > 2 {
			t.Errorf("round %d: %d SCRIPT LOAD + %d EVAL for %d concurrent NOSCRIPTs, want a few", round, loads, evals, callers)
		}
		if loads+evals == 0 {
			t.Errorf("round %d: script was never reloaded after FLUSH", round)
		}
	}
}

// commandCalls reads calls=N of a command from INFO commandstats.
func commandCalls(t *testing.T, srv *redistest.Server, cmd string) int {
	t.Helper()
	info, err := srv.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^cmdstat_` + regexp.QuoteMeta(cmd) + `:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func TestRestart(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	client := redistest.Client(t, srv.Addr())
	sc, err := scriptcache.New(ctx, client, scriptcache.WithFS(testFS))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sc.Script("echo")
	if err := s.Exec(ctx, []string{"a"}, []string{"b"}).Error(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// The client's connections are gone: rueidis multiplexes over several,
	// and a call that lands on a dead one fails once with EOF before it is
	// replaced. Those are connection errors; no reply from the server
	// (NOSCRIPT above all) may reach the caller, and once the client has
	// reconnected every call must succeed.
	for i := range 30 {
		r := s.Exec(ctx, []string{"a"}, []string{strconv.Itoa(i)})
		got, err := r.ToString()
		if _, isServerErr := rueidis.IsRedisErr(err); isServerErr || r.ServerError() {
			t.Fatalf("call %d after restart: server error reached the caller: %v", i, err)
		}
		if i >= 10 && (err != nil || got != "a"+strconv.Itoa(i)) {
			t.Fatalf("call %d after restart: %q, %v", i, got, err)
		}
	}
}

func TestLoadedOnEveryClusterNode(t *testing.T) {
	ctx := context.Background()
	cl := redistest.SharedCluster(t)
	for _, n := range cl.Nodes {
		if err := n.FlushScripts(); err != nil {
			t.Fatal(err)
		}
	}
	sc, err := scriptcache.New(ctx, redistest.Client(t, cl.Addrs()...), scriptcache.WithFS(testFS))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"echo", "incr"} {
		s, _ := sc.Script(name)
		for _, n := range cl.Nodes {
			got, err := n.Do("SCRIPT", "EXISTS", s.SHA1())
			if err != nil || got != "1" {
				t.Errorf("node %s: SCRIPT EXISTS %s (%s) = %q, %v; want 1", n.Addr(), name, s.SHA1(), got, err)
			}
		}
	}
}

func TestCrossSlot(t *testing.T) {
	ctx := context.Background()
	sc, err := scriptcache.New(ctx, redistest.Client(t, redistest.SharedCluster(t).Addrs()...), scriptcache.WithFS(testFS))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sc.Script("echo")
	err = s.Exec(ctx, []string{"{a}x", "{b}x"}, []string{"1"}).Error()
	if !errors.Is(err, scriptcache.ErrCrossSlot) {
		t.Fatalf("cross-slot Exec err = %v, want ErrCrossSlot", err)
	}
	if err := s.Exec(ctx, []string{"{a}x", "{a}y"}, []string{"1"}).Error(); err != nil {
		t.Fatalf("same-tag Exec err = %v", err)
	}
}

func TestBadInput(t *testing.T) {
	ctx := context.Background()
	if _, err := scriptcache.New(ctx, nil); !errors.Is(err, scriptcache.ErrNilClient) {
		t.Errorf("New(nil) err = %v, want ErrNilClient", err)
	}
	if _, err := scriptcache.New(ctx, miniClient(t), scriptcache.WithFS(fstest.MapFS{})); !errors.Is(err, scriptcache.ErrNoScripts) {
		t.Errorf("New(empty fs) err = %v, want ErrNoScripts", err)
	}
	bad := fstest.MapFS{"bad.lua": {Data: []byte("this is not lua (")}}
	if _, err := scriptcache.New(ctx, miniClient(t), scriptcache.WithFS(bad)); err == nil {
		t.Error("New with a script that does not compile: err = nil")
	}
}

// TestDefaultScripts loads the scripts sluice ships, on a real server, so a
// script that does not compile fails here.
func TestDefaultScripts(t *testing.T) {
	ctx := context.Background()
	sc, err := scriptcache.New(ctx, redistest.Client(t, redistest.Single(t).Addr()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Script("ratelimit_fixed"); err != nil {
		t.Fatal(err)
	}
}

func ExampleNew() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	client, _ := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true})
	defer client.Close()

	ctx := context.Background()
	sc, err := scriptcache.New(ctx, client, scriptcache.WithFS(testFS))
	if err != nil {
		fmt.Println(err)
		return
	}
	incr, _ := sc.Script("incr")
	n, err := incr.Exec(ctx, []string{"visits"}, nil).AsInt64()
	fmt.Println(n, err)
	// Output: 1 <nil>
}

// TestCallerDeadlinesAreIsolated: callers whose contexts end early must not
// fail other callers' commands (rueidis would close or fail to dial the
// connection they share if it saw those deadlines).
func TestCallerDeadlinesAreIsolated(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	sc, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()), scriptcache.WithFS(testFS))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sc.Script("incr")
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 300 {
		wg.Go(func() {
			short, cancel := context.WithTimeout(ctx, time.Duration(i%20)*100*time.Microsecond)
			defer cancel()
			s.Exec(short, []string{"isolated"}, nil)
			if err := s.Exec(ctx, []string{"isolated"}, nil).Error(); err != nil {
				failed.Add(1)
				t.Logf("call without deadline failed: %v", err)
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d calls without a deadline failed because of other callers' deadlines", n)
	}
}

// pausedIncrAfter returns the script "incr" of testFS, loaded on a server
// of its own that is then paused (SIGSTOP): calls hang until srv.Resume.
// warm runs on the script before the pause (nil: nothing).
func pausedIncrAfter(t *testing.T, warm func(*scriptcache.Script)) (*redistest.Server, *scriptcache.Script) {
	t.Helper()
	srv := redistest.NewServer(t)
	sc, err := scriptcache.New(context.Background(), redistest.Client(t, srv.Addr()), scriptcache.WithFS(testFS))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sc.Script("incr")
	if warm != nil {
		warm(s)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	return srv, s
}

// TestExecWaitReturnsWithContext: a WAIT on a server that stopped answering
// returns when the caller's context ends, not when the server wakes (issue
// 10, item 6). rueidis's pool of dedicated connections is warmed first: a
// call that must open a connection is bounded by the dial timeout instead
// (the documented exception).
func TestExecWaitReturnsWithContext(t *testing.T) {
	srv, s := pausedIncrAfter(t, func(s *scriptcache.Script) {
		warm, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, _, err := s.ExecWait(warm, []string{"warm"}, nil, 0, time.Millisecond); err != nil {
			t.Fatal(err)
		}
	})
	resume := srv.Resumer(t)
	defer resume()
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := s.ExecWait(short, []string{"wait"}, nil, 0, 100*time.Millisecond)
	// The server stays paused until the call has returned, so the call
	// cannot have waited for it; the bound, far below the call's own (WAIT's
	// timeout plus 5 s of slack), tells the caller's deadline from it.
	if elapsed := time.Since(start); elapsed > 2500*time.Millisecond {
		t.Fatalf("ExecWait returned after %v, want soon after the 50 ms context", elapsed)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ExecWait on a paused server = %v, want DeadlineExceeded", err)
	}
}

// TestLoneCallDeadline: a call alone in flight with a deadline goes on a
// connection of its own carrying that deadline. On a server that stopped
// answering it returns DeadlineExceeded at its deadline, and it is never
// sent again: the script runs at most once when the server answers again
// (rueidis reports the connection's deadline as context.DeadlineExceeded,
// possibly before ctx itself has ended, which the retry of calls never
// sent must not take for one).
func TestLoneCallDeadline(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	client := redistest.Client(t, srv.Addr())
	sc, err := scriptcache.New(ctx, client, scriptcache.WithFS(testFS))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sc.Script("incr")
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = s.Exec(short, []string{"lone"}, nil).Error()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a lone call on a paused server = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("returned after %v, want about its 100 ms deadline", d)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	n, err := client.Do(ctx, client.B().Get().Key("lone").Build()).AsInt64()
	if err != nil && !rueidis.IsRedisNil(err) {
		t.Fatal(err)
	}
	// Give a second send every chance to arrive: a later call on the same
	// client has been answered, and the connection that carried the lone
	// call is closed.
	if err := s.Exec(ctx, []string{"other"}, nil).Error(); err != nil {
		t.Fatal(err)
	}
	if n2, _ := client.Do(ctx, client.B().Get().Key("lone").Build()).AsInt64(); n > 1 || n2 > 1 {
		t.Fatalf("the script ran %d then %d times, want at most once: the call was sent again", n, n2)
	}
}

// TestDialOfAnotherCallerEnds: rueidis dials a connection under the context
// of the call that needs it first, and every call waiting on that dial
// fails with that context's error (see Eval). Such a call was never sent,
// so Eval sends it again: a caller whose own context is alive gets its
// reply, not another caller's context error. Here a blackholed proxy
// stalls the first caller's handshake until the dial timeout ends it
// (rueidis does not end a handshake when the caller's context is
// cancelled), so the waiting caller sees context.DeadlineExceeded.
func TestDialOfAnotherCallerEnds(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	p, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	// One pipelining connection, so that both callers need the same dial.
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{p.Addr()},
		DisableCache:      true,
		PipelineMultiplex: -1,
		Dialer:            net.Dialer{Timeout: 2 * time.Second}, // the stalled handshake's end
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	sc, err := scriptcache.New(ctx, client, scriptcache.WithFS(testFS))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sc.Script("incr")
	if err := s.Exec(ctx, []string{"dial"}, nil).Error(); err != nil {
		t.Fatal(err)
	}
	p.Blackhole(true)
	before := p.Accepted()
	p.ResetAll()

	// The first caller: its call finds the connection gone (until rueidis
	// has seen the reset) or starts the dial that the blackhole stalls.
	var cancelFirst context.CancelFunc
	var firstDone chan struct{}
	for range 50 {
		var first context.Context
		first, cancelFirst = context.WithCancel(ctx)
		firstDone = make(chan struct{})
		go func() {
			defer close(firstDone)
			s.Exec(first, []string{"dial"}, nil)
		}()
		dialing := redistest.WaitFor(ctx, 10*time.Second, func() bool {
			select {
			case <-firstDone:
				return true
			default:
				return p.Accepted() > before
			}
		})
		if dialing && p.Accepted() > before {
			break
		}
		cancelFirst()
		<-firstDone
	}
	if p.Accepted() == before {
		cancelFirst()
		t.Fatal("no caller started a dial")
	}
	// The second caller waits for that dial. Nothing signals that it has
	// started waiting: if it comes later, it dials itself and the test
	// passes without testing the retry, never the other way round.
	second := make(chan error, 1)
	go func() { second <- s.Exec(ctx, []string{"dial"}, nil).Error() }()
	time.Sleep(100 * time.Millisecond)
	cancelFirst()
	<-firstDone
	p.Blackhole(false)
	if err := <-second; err != nil {
		t.Fatalf("a call with a live context, waiting on another caller's dial that failed: %v; want its reply", err)
	}
}
