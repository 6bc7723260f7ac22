package mutex_test

// Regression tests for what a review of the mutex package found (stop 20).

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestRWReadersSetGoesWithLastReader: the package doc of RWMutex
// says "a free lock leaves nothing after min(1 s, lease)". After one
// RLock/RUnlock with a 20 s watchdog lease, the readers sorted set keeps
// the TTL the RLock gave it (the lease): rwmutex_runlock only ever
// lengthens it. The existing TestRWNoKeysLeft cannot see this: its lease
// (300 ms) is below the 1 s keep and it waits 10 s.
func TestRWReadersSetGoesWithLastReader(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{WatchdogLease: 20 * time.Second})
	name := "rw-readers-set:" + t.Name()
	rw := newRW(t, l, name)
	if err := rw.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := rw.Info(ctx); err != nil || info.Readers != 0 || info.Writer != "" {
		t.Fatalf("lock not free after RUnlock: %+v, %v", info, err)
	}
	pattern := mutex.DefaultPrefix + "{" + name + "}*"
	// keep = min(1 s, lease) = 1 s; allow another 2 s for a loaded machine.
	if !redistest.WaitFor(ctx, 3*time.Second, func() bool {
		keys, _ := srv.Do("KEYS", pattern)
		return keys == ""
	}) {
		keys, _ := srv.Do("KEYS", pattern)
		var ttls []string
		for _, k := range strings.Fields(keys) {
			pttl, _ := srv.Do("PTTL", k)
			ttls = append(ttls, k+" pttl="+pttl+"ms")
		}
		t.Errorf("3 s after the last RUnlock of a free read-write lock (keep 1 s), keys remain: %v", ttls)
	}
}

// TestMultiUnwindDropsFailedGiveBack: MultiMutex.Lock "on failure holds none
// of the names it took". Here the set's Lock times out waiting for its
// second name, and the Unlock that gives the first name back is cut off by
// a connection reset (the kind of failure after which Mutex.Lock gives an
// attempt back). unwind ignores that error: the member still counts its
// hold, the watchdog keeps renewing it, and the name stays locked by a set
// whose Lock returned an error and whose Holds() says 0.
func TestMultiUnwindDropsFailedGiveBack(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	proxy, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	const lease = 1500 * time.Millisecond
	lp := newLocker(t, redistest.Client(t, proxy.Addr()), mutex.Options{WatchdogLease: lease})
	ld := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{WatchdogLease: lease})
	p := "unwind:" + t.Name() + ":"
	mm := newMulti(t, lp, []string{p + "a", p + "b"})
	first, last := mm.Names()[0], mm.Names()[1]
	blocker := newMutex(t, ld, last)
	if err := blocker.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer blocker.Unlock(ctx)
	probe := newMutex(t, ld, first)

	lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- mm.Lock(lctx) }()
	if !redistest.WaitFor(ctx, signal, func() bool {
		in, _ := probe.Info(ctx)
		return in.Owner == mm.Owner()
	}) {
		t.Fatal("the set never took its first name")
	}
	// ... and waits for the second (subscribed to its channel).
	channel := mutex.DefaultPrefix + "{" + last + "}:w"
	if !redistest.WaitFor(ctx, signal, func() bool {
		out, _ := srv.Do("PUBSUB", "NUMSUB", channel)
		return out != "" && !strings.HasSuffix(out, "\n0")
	}) {
		t.Fatal("the set never waited for its second name")
	}
	// Partition the set's process; reset its connections until its Lock
	// returns, so that the give-back of the first name fails.
	proxy.Blackhole(true)
	var lockErr error
	deadline := time.After(signal)
wait:
	for {
		select {
		case lockErr = <-errc:
			break wait
		case <-time.After(30 * time.Millisecond):
			proxy.ResetAll()
		case <-deadline:
			proxy.Blackhole(false)
			t.Fatal("MultiMutex.Lock did not return")
		}
	}
	proxy.Blackhole(false)
	// Usually ErrNotObtained (ctx ended while waiting); a reset may also
	// cut off the second name's attempt. Either way Lock failed part way
	// and must give back what it took.
	if lockErr == nil {
		t.Fatal("Lock succeeded although the second name is held")
	}
	t.Logf("Lock returned %v; Holds %d, Tokens %v", lockErr, mm.Holds(), mm.Tokens())
	// Two leases later the first name must be free: nobody knows of a hold.
	if !redistest.WaitFor(ctx, 2*lease+time.Second, func() bool {
		in, _ := probe.Info(ctx)
		return in.Owner != mm.Owner()
	}) {
		in, _ := probe.Info(ctx)
		t.Errorf("%.1fs after MultiMutex.Lock failed (Holds %d), its first name is still held by the set's owner and renewed: %+v; Tokens %v",
			(2*lease + time.Second).Seconds(), mm.Holds(), in, mm.Tokens())
	}
	mm.Unlock(ctx) // let the test end cleanly
}

// TestCloseEndsGiveBack: Locker.Close waits for the give-back of an
// abandoned Lock attempt. Found by a review: with Redis not answering,
// Close blocked for up to a lease (its context's bound; 30 s by default).
// Close now gives such work a second (scriptexec.Group's closeGrace) and
// then ends it; the lease ends what is left on the server.
func TestCloseEndsGiveBack(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	sc, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	l, err := mutex.NewLocker(sc, mutex.Options{Lease: 6 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	m := newMutex(t, l, "close-give-back:"+t.Name())
	// rueidis spreads keyed calls over several pipelining connections, each
	// dialled on first use, and a dial's handshake is bounded by the
	// client's dial timeout (5 s), not by any context: the documented
	// exception. Dial them all before the server stops answering, so the
	// give-back waits for Redis, not for a handshake.
	for range 64 {
		if _, err := m.Info(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resume := srv.Resumer(t)
	lctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = m.Lock(lctx)
	cancel()
	if !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("Lock on a stopped server = %v, want ErrNotObtained", err)
	}
	done := make(chan struct{})
	start := time.Now()
	go func() { l.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(4 * time.Second):
		t.Errorf("Locker.Close has blocked for %v on the give-back of an abandoned attempt (bounded only by the 6 s lease)", time.Since(start).Round(time.Millisecond))
	}
	resume()
	<-done
}
