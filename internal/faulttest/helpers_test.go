package faulttest

import (
	"context"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/faultproxy"
	"github.com/sluicekit/sluice/internal/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// TestMain stops the servers and then fails the run if any goroutine of a
// proxy, client, Locker or Manager outlived its test (goleak).
func TestMain(m *testing.M) { redistest.Main(m) }

// signalWait bounds waits for things that must happen. It is generous: CI
// shares two cores between redis-server, the tests and the race detector,
// and a wait that times out is a failure, not a measurement.
const signalWait = 10 * time.Second

// long reports whether the long variants run (SLUICE_LONG=1).
func long() bool { return os.Getenv("SLUICE_LONG") == "1" }

// pick returns short normally and long with SLUICE_LONG=1.
func pick[T any](short, long_ T) T {
	if long() {
		return long_
	}
	return short
}

// rig is one private redis-server, a fault proxy in front of it, a client
// through the proxy (the one under test) and a direct client (the
// observer, which sees the server's truth whatever the proxy does).
type rig struct {
	srv     *redistest.Server
	proxy   *faultproxy.Proxy
	proxied rueidis.Client
	direct  rueidis.Client
}

// newRig starts a rig. opts, if given, adjust the proxied client's options.
func newRig(t *testing.T, opts ...func(*rueidis.ClientOption)) *rig {
	t.Helper()
	srv := redistest.NewServer(t)
	p, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &rig{srv: srv, proxy: p, proxied: newClient(t, p.Addr(), opts...), direct: newClient(t, srv.Addr())}
}

// newClient returns a rueidis client closed when t ends. Client-side
// caching is off so every read reaches the server.
func newClient(t *testing.T, addr string, opts ...func(*rueidis.ClientOption)) rueidis.Client {
	t.Helper()
	o := rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true}
	for _, f := range opts {
		f(&o)
	}
	c, err := rueidis.NewClient(o)
	if err != nil {
		t.Fatalf("client for %s: %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

func newCache(t *testing.T, c rueidis.Client) *scriptcache.Cache {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), signalWait)
	defer cancel()
	sc, err := scriptcache.New(ctx, c)
	if err != nil {
		t.Fatalf("scriptcache.New: %v", err)
	}
	return sc
}

func newLocker(t *testing.T, c rueidis.Client, opts mutex.Options) *mutex.Locker {
	t.Helper()
	l, err := mutex.NewLocker(newCache(t, c), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

func newManager(t *testing.T, c rueidis.Client, opts semaphore.Options) *semaphore.Manager {
	t.Helper()
	m, err := semaphore.NewManager(newCache(t, c), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func newMutex(t *testing.T, l *mutex.Locker, name string) *mutex.Mutex {
	t.Helper()
	m, err := l.NewMutex(name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// uniqueName returns a lock or semaphore name no other test uses.
func uniqueName(t *testing.T) string {
	return strings.ReplaceAll(t.Name(), "/", ":") + ":" + uuid.NewString()[:8]
}

// lockKey is the Redis key of the mutex called name (default prefix).
func lockKey(name string) string { return mutex.DefaultPrefix + "{" + name + "}" }

// do runs one command on c with a short deadline.
func do(t *testing.T, c rueidis.Client, args ...string) rueidis.RedisResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Do(ctx, c.B().Arbitrary(args...).Build())
}

// waitFor polls cond until it holds or signalWait passes: for state in Redis
// that has no signal to wait on.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !redistest.WaitFor(context.Background(), signalWait, cond) {
		t.Fatalf("timed out after %v waiting for %s", signalWait, what)
	}
}

// durations summarises a sample for the test log.
func durations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return "min " + s[0].Round(time.Microsecond).String() +
		", median " + s[len(s)/2].Round(time.Microsecond).String() +
		", max " + s[len(s)-1].Round(time.Microsecond).String() +
		" (n=" + strconv.Itoa(len(s)) + ")"
}

// str runs one command on c and returns its reply as a string, "" for nil.
func str(t *testing.T, c rueidis.Client, args ...string) string {
	t.Helper()
	s, err := do(t, c, args...).ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		t.Fatalf("%v: %v", args, err)
	}
	return s
}
