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

	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

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

// rig is one private redis-server, a fault proxy in front of it, and a
// direct rueidis client (the observer, which sees the server's truth
// whatever the proxy does). The clients under test come from newCache:
// through the proxy (proxied) or straight to the server (direct, for the
// other side of a scenario: a contender, a holder).
type rig struct {
	srv      *redistest.Server
	proxy    *faultproxy.Proxy
	direct   rueidis.Client
	newCache NewCache
}

// newRig starts a rig.
func newRig(t *testing.T, newCache NewCache) *rig {
	t.Helper()
	srv := redistest.NewServer(t)
	p, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &rig{srv: srv, proxy: p, direct: newClient(t, srv.Addr()), newCache: newCache}
}

// proxied returns a cache on a new client under test that reaches the
// server through the proxy.
func (r *rig) proxied(t *testing.T, o ClientOptions) *scriptcache.Cache {
	t.Helper()
	return r.newCache(t, r.proxy.Addr(), o)
}

// directCache returns a cache on a new client under test that reaches the
// server directly.
func (r *rig) directCache(t *testing.T) *scriptcache.Cache {
	t.Helper()
	return r.newCache(t, r.srv.Addr(), ClientOptions{})
}

// newClient returns the observer: a rueidis client closed when t ends,
// with client-side caching off so every read reaches the server.
func newClient(t *testing.T, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatalf("client for %s: %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

func newLocker(t *testing.T, sc *scriptcache.Cache, opts mutex.Options) *mutex.Locker {
	t.Helper()
	l, err := mutex.NewLocker(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

func newManager(t *testing.T, sc *scriptcache.Cache, opts semaphore.Options) *semaphore.Manager {
	t.Helper()
	m, err := semaphore.NewManager(sc, opts)
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

// lockField returns field f of the record of the lock key (see
// mutex_lock): "f" token, "n" holds, "a" attempt, "o" owner; "" if there
// is no record or it is not one.
func lockField(t *testing.T, c rueidis.Client, key, f string) string {
	t.Helper()
	v, ok := strings.CutPrefix(str(t, c, "GET", key), "L")
	head, hold, found := strings.Cut(v, "|")
	kfc, nao := strings.SplitN(head, ":", 3), strings.SplitN(hold, ":", 3)
	if !ok || !found || len(kfc) != 3 {
		return ""
	}
	switch {
	case f == "f":
		return kfc[1]
	case len(nao) != 3:
		return "" // free
	case f == "n":
		return nao[0]
	case f == "a":
		return nao[1]
	case f == "o":
		return nao[2]
	}
	t.Fatalf("lockField: no field %q", f)
	return ""
}

// lockHolds returns the holds of the lock key's record (0 if none).
func lockHolds(t *testing.T, c rueidis.Client, key string) int64 {
	t.Helper()
	n, _ := strconv.ParseInt(lockField(t, c, key, "n"), 10, 64)
	return n
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
