package clienttest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// signal is how long a test waits for something that must happen: far
// below the 30 s leases, so only a wake-up explains it, and generous,
// because CI shares two cores between Redis, the tests and the race
// detector.
const signal = 10 * time.Second

var primitiveTests = []test{
	{"CacheScripts", testCacheScripts},
	{"CacheConcurrent", testCacheConcurrent},
	{"MutexBasics", testMutexBasics},
	{"MutexWakeUp", testMutexWakeUp},
	{"MutexForceUnlock", testMutexForceUnlock},
	{"MutexFair", testMutexFair},
	{"RWMutex", testRWMutex},
	{"MultiMutex", testMultiMutex},
	{"Semaphore", testSemaphore},
	{"SemaphoreFair", testSemaphoreFair},
	{"RateLimit", testRateLimit},
	{"AbandonedAttempt", testAbandonedAttempt},
	{"CloseDuringReplicaWait", testCloseDuringReplicaWait},
}

// name returns a lock or limiter name unique to this run of the test: the
// suite runs more than once against the same servers.
func name(t testing.TB, what string) string {
	return fmt.Sprintf("ct-%s-%s-%d", what, strings.NewReplacer("/", "-", " ", "_", "=", "-").Replace(t.Name()), rand.Uint64())
}

// cache returns a script cache on client.
func cache(t testing.TB, client scriptcache.Client, opts ...scriptcache.Option) *scriptcache.Cache {
	t.Helper()
	sc, err := scriptcache.NewFrom(context.Background(), client, opts...)
	if err != nil {
		t.Fatalf("NewFrom: %v", err)
	}
	return sc
}

// process returns a cache on a client of its own, as another process
// would have.
func (e *env) process(t testing.TB) *scriptcache.Cache {
	t.Helper()
	return cache(t, e.newC(t, e.addrs))
}

func locker(t testing.TB, sc *scriptcache.Cache, opts mutex.Options) *mutex.Locker {
	t.Helper()
	l, err := mutex.NewLocker(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

func newMutex(t testing.TB, l *mutex.Locker, name string, opts ...mutex.LockOption) *mutex.Mutex {
	t.Helper()
	m, err := l.NewMutex(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func manager(t testing.TB, sc *scriptcache.Cache, opts semaphore.Options) *semaphore.Manager {
	t.Helper()
	m, err := semaphore.NewManager(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// subscribers returns how many clients are subscribed to channel, the way
// the primitives subscribe: sharded on a cluster (Redis 7), else plain.
func (e *env) subscribers(t testing.TB, channel string) string {
	if e.cluster {
		out, _ := e.nodeOf(t, channel).Do("PUBSUB", "SHARDNUMSUB", channel)
		return out
	}
	out, _ := e.nodes[0].Do("PUBSUB", "NUMSUB", channel)
	return out
}

// waitSubscribed waits until someone listens on channel: a waiter that
// waits for a release message.
func (e *env) waitSubscribed(t testing.TB, channel string) {
	t.Helper()
	if !redistest.WaitFor(context.Background(), signal, func() bool {
		out := e.subscribers(t, channel)
		return out != "" && !strings.HasSuffix(out, "\n0")
	}) {
		t.Fatalf("nobody subscribed to %s in time", channel)
	}
}

// waitCard waits until the sorted set key (a fair queue) has n members.
func (e *env) waitCard(t testing.TB, key string, n int) {
	t.Helper()
	want := fmt.Sprint(n)
	if !redistest.WaitFor(context.Background(), signal, func() bool {
		out, err := e.nodeOf(t, key).Do("ZCARD", key)
		return err == nil && out == want
	}) {
		t.Fatalf("%s did not reach %d members in time", key, n)
	}
}

// lockKey is the record key of the mutex name with the default prefix.
func lockKey(name string) string { return mutex.DefaultPrefix + "{" + name + "}" }

func semKey(name string) string { return semaphore.DefaultPrefix + "{" + name + "}" }

var testFS = fstest.MapFS{
	"echo.lua": {Data: []byte("return KEYS[1] .. ARGV[1]\n")},
	"incr.lua": {Data: []byte("return redis.call('INCR', KEYS[1])\n")},
}

// testCacheScripts runs scripts through a cache on the client: NOSCRIPT
// after SCRIPT FLUSH on every node never reaches the caller, and keys in
// different slots are refused before sending on a cluster.
func testCacheScripts(t *testing.T, e *env) {
	ctx := context.Background()
	sc := cache(t, e.client, scriptcache.WithFS(testFS))
	if sc.Cluster() != e.cluster || sc.ShardedPubSub() != e.cluster {
		t.Errorf("Cluster() = %v, ShardedPubSub() = %v; want %v", sc.Cluster(), sc.ShardedPubSub(), e.cluster)
	}
	incr, err := sc.Script("incr")
	if err != nil {
		t.Fatal(err)
	}
	k := key(t, name(t, "cs"), "n")
	for i := int64(1); i <= 9; i++ {
		if i%3 == 0 {
			for _, n := range e.nodes {
				if err := n.FlushScripts(); err != nil {
					t.Fatal(err)
				}
			}
		}
		if n, err := incr.Exec(ctx, []string{k}, nil).AsInt64(); err != nil || n != i {
			t.Fatalf("call %d: Exec = %d, %v", i, n, err)
		}
	}
	echo, _ := sc.Script("echo")
	r := echo.Exec(ctx, []string{"{a}x", "{b}y"}, []string{"!"})
	if e.cluster {
		if !errors.Is(r.Error(), scriptcache.ErrCrossSlot) {
			t.Errorf("cross-slot Exec on a cluster = %v, want ErrCrossSlot", r.Error())
		}
	} else if s, err := r.ToString(); err != nil || s != "{a}x!" {
		t.Errorf("two-key Exec on one server = %q, %v", s, err)
	}
	if s, err := echo.Exec(ctx, []string{"{a}x", "{a}y"}, []string{"!"}).ToString(); err != nil || s != "{a}x!" {
		t.Errorf("same-slot Exec = %q, %v", s, err)
	}
	// ExecWait on the cache: no replicas, so 0 acknowledgements.
	if r, acks, err := incr.ExecWait(ctx, []string{k}, nil, 0, time.Second); err != nil || acks != 0 {
		t.Errorf("ExecWait = %v, %d acks, %v", r.Error(), acks, err)
	}
}

func testMutexBasics(t *testing.T, e *env) {
	ctx := context.Background()
	l := locker(t, e.process(t), mutex.Options{})
	other := locker(t, e.process(t), mutex.Options{})
	n := name(t, "m")
	a, b := newMutex(t, l, n), newMutex(t, other, n)
	var last int64
	for round := range 3 {
		if err := a.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if tok := a.Token(); tok <= last {
			t.Fatalf("round %d: token %d after %d; fencing tokens must increase", round, tok, last)
		} else {
			last = tok
		}
		if err := a.Lock(ctx); err != nil { // reentrant
			t.Fatal(err)
		}
		info, err := b.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Held || info.Owner != a.Owner() || info.Holds != 2 || info.Token != a.Token() || info.Remain <= 0 {
			t.Fatalf("Info while held twice = %+v; want held by %s, 2 holds, token %d", info, a.Owner(), a.Token())
		}
		if err := b.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
			t.Fatalf("TryLock of a held lock = %v, want ErrNotObtained", err)
		}
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if info, _ := a.Info(ctx); !info.Held || info.Holds != 1 {
			t.Fatalf("Info after one of two Unlocks = %+v, want still held once", info)
		}
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if info, _ := a.Info(ctx); info.Held {
			t.Fatalf("Info after the last Unlock = %+v, want free", info)
		}
		// The other process gets it now, with a greater token.
		if err := b.TryLock(ctx); err != nil {
			t.Fatalf("TryLock of a free lock = %v", err)
		}
		if b.Token() <= last {
			t.Fatalf("token %d after %d", b.Token(), last)
		}
		last = b.Token()
		if err := b.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Errorf("Unlock of a free lock = %v, want ErrNotHeld", err)
	}
}

// testMutexWakeUp: a waiter of another process is woken by the release
// message, far sooner than the holder's 30 s lease would let it in.
func testMutexWakeUp(t *testing.T, e *env) {
	ctx := context.Background()
	n := name(t, "wake")
	a := newMutex(t, locker(t, e.process(t), mutex.Options{WatchdogLease: 30 * time.Second}), n)
	b := newMutex(t, locker(t, e.process(t), mutex.Options{WatchdogLease: 30 * time.Second}), n)
	for round := range 3 {
		if err := a.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			lctx, cancel := context.WithTimeout(ctx, signal)
			defer cancel()
			got <- b.Lock(lctx)
		}()
		if round == 0 {
			// The hub keeps its subscription a while after: only the first
			// round can tell that b is waiting this way.
			e.waitSubscribed(t, lockKey(n)+":w")
		}
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("round %d: waiter not given the lock within %v of the release (lease 30 s): %v", round, signal, err)
		}
		if err := b.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// testMutexForceUnlock: a forced release is seen by the holder at its next
// renewal, through Lost and Err.
func testMutexForceUnlock(t *testing.T, e *env) {
	ctx := context.Background()
	n := name(t, "force")
	a := newMutex(t, locker(t, e.process(t), mutex.Options{WatchdogLease: 1500 * time.Millisecond}), n)
	b := newMutex(t, locker(t, e.process(t), mutex.Options{}), n)
	if ok, err := b.ForceUnlock(ctx); err != nil || ok {
		t.Fatalf("ForceUnlock of a free lock = %v, %v; want false", ok, err)
	}
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.ForceUnlock(ctx); err != nil || !ok {
		t.Fatalf("ForceUnlock of a held lock = %v, %v; want true", ok, err)
	}
	select {
	case <-a.Lost():
	case <-time.After(signal):
		t.Fatalf("Lost not closed %v after a ForceUnlock (renewals every 500 ms)", signal)
	}
	if err := a.Err(); !errors.Is(err, mutex.ErrLost) {
		t.Errorf("Err after the loss = %v, want ErrLost", err)
	}
	if err := b.TryLock(ctx); err != nil {
		t.Fatalf("TryLock after ForceUnlock = %v", err)
	}
	_ = b.Unlock(ctx) // cleanup
	_ = a.Unlock(ctx) // reports the loss; nothing to check
}

// testMutexFair: a release hands a fair lock straight to the queued waiter
// of another process, whether the holder is fair or not. An unfair
// holder's client sends only the record and the channel with its Unlock;
// finding the queue flagged, mutex_release answers -2 before it changes
// anything and the client calls again with every key: the second round
// must go through each adapter (and a cluster) like the first.
func testMutexFair(t *testing.T, e *env) {
	for _, holderFair := range []bool{true, false} {
		t.Run(fmt.Sprintf("holderFair=%v", holderFair), func(t *testing.T) {
			ctx := context.Background()
			n := name(t, "fair")
			a := newMutex(t, locker(t, e.process(t), mutex.Options{Fair: holderFair}), n)
			b := newMutex(t, locker(t, e.process(t), mutex.Options{Fair: true}), n)
			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				lctx, cancel := context.WithTimeout(ctx, signal)
				defer cancel()
				got <- b.Lock(lctx)
			}()
			e.waitCard(t, lockKey(n)+":q", 1)
			if err := a.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if info, err := a.Info(ctx); err != nil || info.Owner != b.Owner() {
				t.Fatalf("Info after Unlock = %+v, %v; want handed to the waiter %s", info, err, b.Owner())
			}
			if err := a.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
				t.Fatalf("TryLock after a hand-off = %v, want ErrNotObtained", err)
			}
			if err := <-got; err != nil {
				t.Fatalf("the waiter handed the lock: %v", err)
			}
			if err := b.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func testRWMutex(t *testing.T, e *env) {
	ctx := context.Background()
	n := name(t, "rw")
	l1, l2 := locker(t, e.process(t), mutex.Options{}), locker(t, e.process(t), mutex.Options{})
	newRW := func(l *mutex.Locker) *mutex.RWMutex {
		rw, err := l.NewRWMutex(n)
		if err != nil {
			t.Fatal(err)
		}
		return rw
	}
	r1, r2, w := newRW(l1), newRW(l2), newRW(l2)
	if err := r1.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.RLock(ctx); err != nil {
		t.Fatalf("second reader: %v", err)
	}
	if err := w.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("writer TryLock with readers = %v, want ErrNotObtained", err)
	}
	got := make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(ctx, signal)
		defer cancel()
		got <- w.Lock(lctx)
	}()
	if err := r1.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r2.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("writer after the readers left: %v", err)
	}
	if err := r1.TryRLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("reader TryRLock with a writer = %v, want ErrNotObtained", err)
	}
	info, err := r1.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("RWInfo while write-held: %+v", info)
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r1.TryRLock(ctx); err != nil {
		t.Fatalf("reader after the writer left: %v", err)
	}
	if err := r1.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// testMultiMutex locks names in different slots together.
func testMultiMutex(t *testing.T, e *env) {
	ctx := context.Background()
	base := name(t, "mm")
	names := []string{base + "-a", base + "-b", base + "-c", base + "-d"}
	l := locker(t, e.process(t), mutex.Options{})
	other := locker(t, e.process(t), mutex.Options{})
	mm, err := l.NewMultiMutex(names)
	if err != nil {
		t.Fatal(err)
	}
	if err := mm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if toks := mm.Tokens(); len(toks) != len(names) {
		t.Fatalf("Tokens = %v, want %d", toks, len(names))
	}
	for _, n := range names {
		if err := newMutex(t, other, n).TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
			t.Fatalf("TryLock of %s while the MultiMutex holds it = %v", n, err)
		}
	}
	// A second MultiMutex over an overlapping set waits, and is woken.
	mm2, err := other.NewMultiMutex([]string{names[3], base + "-e"})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(ctx, signal)
		defer cancel()
		got <- mm2.Lock(lctx)
	}()
	if err := mm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("overlapping MultiMutex after the release: %v", err)
	}
	for _, n := range names[:3] {
		m := newMutex(t, other, n)
		if err := m.TryLock(ctx); err != nil {
			t.Fatalf("TryLock of %s after the release = %v", n, err)
		}
		_ = m.Unlock(ctx) // cleanup
	}
	if err := mm2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func testSemaphore(t *testing.T, e *env) {
	ctx := context.Background()
	n := name(t, "sem")
	newSem := func(m *semaphore.Manager) *semaphore.Semaphore {
		s, err := m.NewSemaphore(n, 5)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s1 := newSem(manager(t, e.process(t), semaphore.Options{WatchdogLease: 30 * time.Second}))
	s2 := newSem(manager(t, e.process(t), semaphore.Options{WatchdogLease: 30 * time.Second}))
	p3, err := s1.Acquire(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := s2.Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if p3.Weight() != 3 || p2.Weight() != 2 {
		t.Fatalf("weights %d, %d", p3.Weight(), p2.Weight())
	}
	if avail, err := s1.Available(ctx); err != nil || avail != 0 {
		t.Fatalf("Available = %d, %v; want 0", avail, err)
	}
	if _, err := s2.TryAcquire(ctx, 1); !errors.Is(err, semaphore.ErrNotObtained) {
		t.Fatalf("TryAcquire of a full semaphore = %v, want ErrNotObtained", err)
	}
	holders, err := s1.Holders(ctx)
	if err != nil || len(holders) != 2 {
		t.Fatalf("Holders = %v, %v; want 2", holders, err)
	}
	got := make(chan error, 1)
	var waiter *semaphore.Permit
	go func() {
		actx, cancel := context.WithTimeout(ctx, signal)
		defer cancel()
		var err error
		waiter, err = s2.Acquire(actx, 3)
		got <- err
	}()
	e.waitSubscribed(t, semKey(n)+":w")
	if err := p3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter for 3 permits not woken by their release (lease 30 s): %v", err)
	}
	for _, p := range []*semaphore.Permit{p2, waiter} {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := p2.Release(ctx); !errors.Is(err, semaphore.ErrNotHeld) {
		t.Errorf("second Release = %v, want ErrNotHeld", err)
	}
	if avail, err := s1.Available(ctx); err != nil || avail != 5 {
		t.Fatalf("Available after every release = %d, %v; want 5", avail, err)
	}
}

// testSemaphoreFair: permits freed by a release go to the head of the
// queue, in another process, even when a later waiter would fit.
func testSemaphoreFair(t *testing.T, e *env) {
	ctx := context.Background()
	n := name(t, "fairsem")
	newSem := func() *semaphore.Semaphore {
		s, err := manager(t, e.process(t), semaphore.Options{Fair: true}).NewSemaphore(n, 3)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b, c := newSem(), newSem(), newSem()
	held, err := a.Acquire(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		p   *semaphore.Permit
		err error
	}
	acquire := func(s *semaphore.Semaphore, w int64) chan result {
		ch := make(chan result, 1)
		go func() {
			actx, cancel := context.WithTimeout(ctx, signal)
			defer cancel()
			p, err := s.Acquire(actx, w)
			ch <- result{p, err}
		}()
		return ch
	}
	gotB := acquire(b, 2)
	e.waitCard(t, semKey(n)+":q", 1)
	gotC := acquire(c, 2)
	e.waitCard(t, semKey(n)+":q", 2)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rb := <-gotB
	if rb.err != nil {
		t.Fatalf("head of the queue: %v", rb.err)
	}
	// c wants 2 with 1 free: it stays queued until b releases.
	select {
	case rc := <-gotC:
		t.Fatalf("second waiter got %v, %v while the head held 2 of 3", rc.p, rc.err)
	default:
	}
	if err := rb.p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rc := <-gotC
	if rc.err != nil {
		t.Fatalf("second waiter after the head released: %v", rc.err)
	}
	if err := rc.p.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func testRateLimit(t *testing.T, e *env) {
	ctx := context.Background()
	sc := e.process(t)
	for _, algo := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow, ratelimit.GCRA} {
		t.Run(algo.String(), func(t *testing.T) {
			l, err := ratelimit.New(sc, ratelimit.Options{Algorithm: algo, Limit: ratelimit.Limit{Rate: 3, Period: time.Hour}})
			if err != nil {
				t.Fatal(err)
			}
			k := name(t, "rl")
			for i := range 3 {
				res, err := l.Allow(ctx, k)
				if err != nil || !res.Allowed {
					t.Fatalf("request %d: %+v, %v; want allowed", i, res, err)
				}
				if res.Remaining != 2-i {
					t.Errorf("request %d: Remaining = %d, want %d", i, res.Remaining, 2-i)
				}
			}
			res, err := l.Allow(ctx, k)
			if err != nil || res.Allowed || res.RetryAfter <= 0 {
				t.Fatalf("fourth request: %+v, %v; want denied with a RetryAfter", res, err)
			}
			// Another key counts apart.
			if res, err := l.Allow(ctx, k+"-other"); err != nil || !res.Allowed {
				t.Fatalf("other key: %+v, %v", res, err)
			}
			if err := l.Reset(ctx, k); err != nil {
				t.Fatal(err)
			}
			if res, err := l.AllowN(ctx, k, 3); err != nil || !res.Allowed {
				t.Fatalf("AllowN(3) after Reset: %+v, %v", res, err)
			}
		})
	}
	t.Run("Policies", func(t *testing.T) {
		ps, err := ratelimit.NewPolicies(
			ratelimit.Policy{Name: "burst", Algorithm: ratelimit.FixedWindow, Limit: ratelimit.Limit{Rate: 2, Period: time.Hour}},
			ratelimit.Policy{Name: "daily", Algorithm: ratelimit.SlidingWindow, Limit: ratelimit.Limit{Rate: 100, Period: 24 * time.Hour}},
			ratelimit.Policy{Name: "smooth", Algorithm: ratelimit.GCRA, Limit: ratelimit.Limit{Rate: 10, Period: time.Hour, Burst: 5}},
		)
		if err != nil {
			t.Fatal(err)
		}
		l, err := ratelimit.New(sc, ratelimit.Options{Limit: ratelimit.PerSecond(1000)})
		if err != nil {
			t.Fatal(err)
		}
		k := name(t, "pol")
		for i := range 2 {
			d, err := l.AllowPolicies(ctx, k, 1, ps)
			if err != nil || !d.Allowed || len(d.Results) != 3 {
				t.Fatalf("request %d: %+v, %v; want allowed by 3 policies", i, d, err)
			}
		}
		d, err := l.AllowPolicies(ctx, k, 1, ps)
		if err != nil || d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("third request: %+v, %v; want denied by the burst policy", d, err)
		}
		if d.Results[0].Allowed || !d.Results[1].Allowed {
			t.Errorf("third request: results %+v; want only the burst policy to deny", d.Results)
		}
		if err := l.Reset(ctx, k, ps); err != nil {
			t.Fatal(err)
		}
		if d, err := l.AllowPolicies(ctx, k, 1, ps); err != nil || !d.Allowed {
			t.Fatalf("after Reset: %+v, %v", d, err)
		}
	})
}

// testAbandonedAttempt: a Lock whose context ends while its script call is
// in flight (the server stopped) must not leave a grant nobody holds: once
// the server answers again, another process gets the lock well before the
// 30 s lease. It needs a server of its own to stop, so it runs on the
// single target only: a cluster client takes the same path once it has
// picked a node.
func testAbandonedAttempt(t *testing.T, e *env) {
	if e.cluster {
		t.Skip("same path as single; stopping a node of the shared cluster would disturb it")
	}
	ctx := context.Background()
	srv := redistest.NewServer(t)
	scA := cache(t, e.newC(t, []string{srv.Addr()}))
	scB := cache(t, e.newC(t, []string{srv.Addr()}))
	n := name(t, "abandoned")
	a := newMutex(t, locker(t, scA, mutex.Options{}), n)
	b := newMutex(t, locker(t, scB, mutex.Options{}), n)
	// Open the connections first: a call waiting for a dial is bounded by
	// the client's dial timeout, which is not what this test is about.
	for _, m := range []*mutex.Mutex{a, b} {
		if err := m.TryLock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 4 {
		if err := srv.Pause(); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		start := time.Now()
		err := a.Lock(short)
		cancel()
		took := time.Since(start)
		if err := srv.Resume(); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(err, mutex.ErrNotObtained) {
			t.Fatalf("round %d: Lock on a stopped server = %v, want ErrNotObtained", round, err)
		}
		if took > signal {
			t.Fatalf("round %d: Lock returned %v after its 50 ms context ended", round, took)
		}
		lctx, cancel := context.WithTimeout(ctx, signal)
		err = b.Lock(lctx)
		cancel()
		if err != nil {
			t.Fatalf("round %d: the abandoned grant was not given back before the 30 s lease: %v", round, err)
		}
		if err := b.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lctx, cancel := context.WithTimeout(ctx, signal)
	defer cancel()
	if err := a.Lock(lctx); err != nil {
		t.Fatal(err)
	}
	if err := b.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("TryLock while A holds = %v, want ErrNotObtained", err)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// testCacheConcurrent runs many script calls at once through a cache,
// with the scripts flushed from every node midway: each call must get its
// own reply (a client that coalesces calls into pipelines must not mix
// them up), a NOSCRIPT among many must be reloaded for each, and every
// call must run exactly once.
func testCacheConcurrent(t *testing.T, e *env) {
	ctx := context.Background()
	sc := cache(t, e.client, scriptcache.WithFS(testFS))
	incr, err := sc.Script("incr")
	if err != nil {
		t.Fatal(err)
	}
	echo, err := sc.Script("echo")
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, calls = 32, 40
	tag := name(t, "cc")
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			k := key(t, tag, fmt.Sprint(g)) // one slot per tag: a cluster sees one node, others see theirs
			for i := range calls {
				if g == 0 && i == calls/2 {
					for _, n := range e.nodes {
						if err := n.FlushScripts(); err != nil {
							errs <- err
							return
						}
					}
				}
				arg := fmt.Sprintf("%d/%d", g, i)
				if s, err := echo.Exec(ctx, []string{k}, []string{arg}).ToString(); err != nil || s != k+arg {
					errs <- fmt.Errorf("goroutine %d call %d: echo = %q, %w; want %q", g, i, s, err, k+arg)
					return
				}
				if n, err := incr.Exec(ctx, []string{k}, nil).AsInt64(); err != nil || n != int64(i+1) {
					errs <- fmt.Errorf("goroutine %d call %d: incr = %d, %w; want %d (each call once)", g, i, n, err, i+1)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// testCloseDuringReplicaWait closes a Manager and a Locker while an Acquire
// or Lock with ReplicaAcks, whose caller has left, waits in WAIT for a
// replica that does not exist (ReplicaTimeout 20 s): Close must return at
// once, on a server that answers and on one that has stopped (SIGSTOP)
// meanwhile (issue 31, item 5: on go-redis, Close waited out WAIT, or its
// read timeout on a stopped server). The README: a server that stopped
// answering cannot hold Close up.
func testCloseDuringReplicaWait(t *testing.T, e *env) {
	if e.cluster {
		t.Skip("same path as single; stopping a node of the shared cluster would disturb it")
	}
	srv := redistest.NewServer(t)
	const replicaTimeout = 20 * time.Second
	for _, stop := range []bool{false, true} {
		for _, prim := range []string{"semaphore", "mutex"} {
			t.Run(fmt.Sprintf("%s/stopped=%v", prim, stop), func(t *testing.T) {
				sc := cache(t, e.newC(t, []string{srv.Addr()}))
				var acquire func(ctx context.Context) error
				var closeIt func()
				switch prim {
				case "semaphore":
					m := manager(t, sc, semaphore.Options{ReplicaAcks: 1, ReplicaTimeout: replicaTimeout})
					s, err := m.NewSemaphore(name(t, "sem"), 1)
					if err != nil {
						t.Fatal(err)
					}
					acquire = func(ctx context.Context) error { _, err := s.Acquire(ctx, 1); return err }
					closeIt = m.Close
				default:
					l := locker(t, sc, mutex.Options{ReplicaAcks: 1, ReplicaTimeout: replicaTimeout})
					m := newMutex(t, l, name(t, "mu"))
					acquire = m.Lock
					closeIt = l.Close
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				done := make(chan error, 1)
				before := blocked(t, srv)
				go func() { done <- acquire(ctx) }()
				waitBlocked(t, srv, before)
				resume := pauseIf(t, srv, stop)
				cancel()
				select {
				case err := <-done:
					if !errors.Is(err, context.Canceled) {
						t.Errorf("%s in WAIT, its context cancelled = %v; want an error wrapping context.Canceled", prim, err)
					}
				case <-time.After(signal):
					t.Fatalf("%s in WAIT still running %v after its context ended", prim, signal)
				}
				start := time.Now()
				closed := make(chan struct{})
				go func() {
					defer close(closed)
					closeIt()
				}()
				select {
				case <-closed:
				case <-time.After(signal):
					t.Errorf("%s: Close still running after %v, with a call in WAIT (ReplicaTimeout %v) whose caller left", prim, signal, replicaTimeout)
					<-closed
					t.Logf("Close returned after %v", time.Since(start))
				}
				resume()
			})
		}
	}
}
