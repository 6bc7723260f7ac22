package semaphore

// White-box tests: they set up Redis state or timings that the public API
// cannot produce on demand. TestMain is in semaphore_test.go.

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

const internalWait = 10 * time.Second // bounds waits for things that must happen

func internalManager(t *testing.T, addr string, opts Options) *Manager {
	t.Helper()
	client := redistest.Client(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), internalWait)
	defer cancel()
	sc, err := scriptcache.New(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// TestOwnExpiredGrantWrittenBack (S2): a retried id whose earlier grant
// expired, but was not among the 16 expired permits reclaimed first, is
// dropped by the acquire script. If the retry is then refused, the lower
// weight in use must still be stored, or the semaphore shrinks for good.
func TestOwnExpiredGrantWrittenBack(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	m := internalManager(t, srv.Addr(), Options{})
	s, err := m.NewSemaphore("s2", 25)
	if err != nil {
		t.Fatal(err)
	}
	// 16 expired permits of weight 1 (scores 1..16), the retried id "own"
	// of weight 2 expired after them, and a live permit of weight 3.
	// (21 in use: 18 listed and ':h', the weight beyond one each, 1 + 2.)
	hset := []string{"HSET", s.keys[0], ":cap", "25", ":h", "3", "own", "2", "live", "3"}
	zadd := []string{"ZADD", s.keys[1], "17", "own", strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10), "live"}
	for i := 1; i <= 16; i++ {
		zadd = append(zadd, strconv.Itoa(i), "old"+strconv.Itoa(i))
	}
	for _, cmd := range [][]string{hset, zadd} {
		if _, err := srv.Do(cmd...); err != nil {
			t.Fatal(err)
		}
	}
	// Only "live" is held (3 of 25): a retry of "own" for 23 does not fit.
	r, err := s.call(ctx, "own", 23, tryOnce)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != 0 || r.used != 3 {
		t.Fatalf("retry of an expired id = %+v, want status 0 with 3 in use", r)
	}
	if got, err := s.Available(ctx); err != nil || got != 22 {
		t.Fatalf("Available = %d, %v; want 22 (25 less the live permit's 3)", got, err)
	}
}

// TestLossDuringReleaseDeferred: the keeper decides a loss under its lock
// and reports it after, so a loss decided just before Release stopped the
// lease can arrive while the release is in flight. If the release then
// succeeds, the loss must not be signalled: Release returned nil.
func TestLossDuringReleaseDeferred(t *testing.T) {
	srv := redistest.NewServer(t)
	m := internalManager(t, srv.Addr(), Options{})
	s, err := m.NewSemaphore("deferred", 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), internalWait)
	defer cancel()
	p, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Resume() })
	done := make(chan error, 1)
	go func() { done <- p.Release(context.Background()) }()
	blockedIn(t, "semaphore.(*Permit).Release(", "scriptcache.(*Script).Exec(")
	p.lose(lease.ErrExpired) // as the keeper reports a loss it decided before
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Release = %v, want nil", err)
		}
	case <-time.After(internalWait):
		t.Fatal("Release did not return")
	}
	if err := p.Err(); err != nil {
		t.Fatalf("Err after a successful Release = %v, want nil", err)
	}
	select {
	case <-p.Lost():
		t.Fatal("Lost closed after a successful Release")
	default:
	}
}

// TestLossDuringFailedRelease: a loss reported while a Release is in
// flight counts once that Release fails.
func TestLossDuringFailedRelease(t *testing.T) {
	srv := redistest.NewServer(t)
	m := internalManager(t, srv.Addr(), Options{})
	s, err := m.NewSemaphore("deferred-failed", 1)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.TryAcquire(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Release(context.Background()) }()
	blockedIn(t, "semaphore.(*Permit).Release(", "scriptcache.(*Script).Exec(")
	p.lose(lease.ErrExpired)
	srv.Kill() // the release fails
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Release against a killed server = nil, want an error")
		}
	case <-time.After(internalWait):
		t.Fatal("Release did not return")
	}
	select {
	case <-p.Lost():
	default:
		t.Fatal("Lost not closed after a failed Release during which a loss was reported")
	}
	if err := p.Err(); !errors.Is(err, ErrLost) || !errors.Is(err, lease.ErrExpired) {
		t.Fatalf("Err = %v, want ErrLost wrapping lease.ErrExpired", err)
	}
}

// blockedIn waits until some goroutine's stack contains every one of fns
// and it is blocked, so that what the test does next happens while that
// call is in flight.
func blockedIn(t *testing.T, fns ...string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	ok := redistest.WaitFor(context.Background(), internalWait, func() bool {
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			head, _, _ := strings.Cut(g, "\n")
			if strings.Contains(head, "[running]") || strings.Contains(head, "[runnable]") {
				continue
			}
			all := true
			for _, fn := range fns {
				all = all && strings.Contains(g, fn)
			}
			if all {
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no goroutine blocked in %v", fns)
	}
}

// uniqueInternal returns a semaphore name no earlier run used on the shared
// server (go test -count=N).
func uniqueInternal(name string) string {
	return name + ":" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// TestFairBypassLimit: lighter waiters that fit may pass a fair waiter at
// the head that does not, bypassLimit times; after that the permits are
// kept for the head, which gets them at the next release.
func TestFairBypassLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), internalWait)
	defer cancel()
	m := internalManager(t, redistest.Single(t).Addr(), Options{Fair: true})
	s, err := m.NewSemaphore(uniqueInternal("bypass-limit"), 2)
	if err != nil {
		t.Fatal(err)
	}
	hold, err := s.TryAcquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := s.call(ctx, "heavy", 2, firstTry); err != nil || r.status != 0 {
		t.Fatalf("heavy waiter's attempt = %+v, %v; want queued", r, err)
	}
	for i := range bypassLimit + 1 {
		id := "light" + strconv.Itoa(i)
		r, err := s.call(ctx, id, 1, firstTry)
		if err != nil {
			t.Fatal(err)
		}
		if i < bypassLimit {
			if r.status != 1 {
				t.Fatalf("light waiter %d = %+v, want granted past the blocked head", i, r)
			}
			s.cleanup(id)
			continue
		}
		if r.status != 0 {
			t.Fatalf("light waiter %d = %+v, want queued: %d have passed the head", i, r, bypassLimit)
		}
	}
	if err := hold.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := s.call(ctx, "heavy", 2, afterWait); err != nil || r.status != 1 {
		t.Fatalf("heavy waiter after the release = %+v, %v; want granted", r, err)
	}
	s.cleanup("heavy")
	if r, err := s.call(ctx, "light"+strconv.Itoa(bypassLimit), 1, afterWait); err != nil || r.status != 1 {
		t.Fatalf("last light waiter after the heavy one = %+v, %v; want granted", r, err)
	}
}

// TestFairLeaveGivesBackGrant: a waiter that leaves after a release granted
// it permits gives them back at once.
func TestFairLeaveGivesBackGrant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), internalWait)
	defer cancel()
	m := internalManager(t, redistest.Single(t).Addr(), Options{Fair: true})
	s, err := m.NewSemaphore(uniqueInternal("leave-grant"), 1)
	if err != nil {
		t.Fatal(err)
	}
	hold, err := s.TryAcquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := s.call(ctx, "w", 1, firstTry); err != nil || r.status != 0 {
		t.Fatalf("waiter's attempt = %+v, %v; want queued", r, err)
	}
	if err := hold.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if hs, err := s.Holders(ctx); err != nil || len(hs) != 1 || hs[0].ID != "w" {
		t.Fatalf("Holders after the release = %+v, %v; want the waiter", hs, err)
	}
	m.leave(s, "w")
	if !redistest.WaitFor(ctx, internalWait, func() bool {
		n, err := s.Available(ctx)
		return err == nil && n == 1
	}) {
		t.Fatal("the grant of a waiter that left was not given back")
	}
}

// TestAcquireFastPath: an acquire that fits is granted without reclaiming
// expired permits (they stay counted until an acquire finds them in its
// way), the keys never expire before the latest permit whatever order
// leases of different lengths come in, and a retried id is renewed, not
// counted twice.
func TestAcquireFastPath(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	long := internalManager(t, srv.Addr(), Options{Lease: time.Minute})
	// The short lease must outlast two calls on a loaded machine (50 ms
	// did not, once, at load 10 with coverage on), and end in a sleep.
	short := internalManager(t, srv.Addr(), Options{Lease: time.Second})
	sl, err := long.NewSemaphore("fast", 4)
	if err != nil {
		t.Fatal(err)
	}
	ss, err := short.NewSemaphore("fast", 4)
	if err != nil {
		t.Fatal(err)
	}
	do := func(args ...string) string {
		t.Helper()
		out, err := srv.Do(args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	pttls := func() (int64, int64) {
		a, _ := strconv.ParseInt(do("PTTL", sl.keys[0]), 10, 64)
		b, _ := strconv.ParseInt(do("PTTL", sl.keys[1]), 10, 64)
		return a, b
	}
	// The weight in use: the permits listed and the weight beyond one each.
	used := func() string {
		n, _ := strconv.ParseInt(do("ZCARD", sl.keys[1]), 10, 64)
		extra, _ := strconv.ParseInt(do("HGET", sl.keys[0], ":h"), 10, 64)
		return strconv.FormatInt(n+extra, 10)
	}
	// A long lease, then a short one: the keys keep the long one's expiry.
	if r, err := sl.call(ctx, "a", 1, tryOnce); err != nil || r.status != 1 {
		t.Fatalf("acquire a = %+v, %v", r, err)
	}
	if r, err := ss.call(ctx, "b", 2, tryOnce); err != nil || r.status != 1 || used() != "3" {
		t.Fatalf("acquire b = %+v, %v, %s used; want granted with 3 used", r, err, used())
	}
	if h, e := pttls(); h < 55_000 || e < 55_000 {
		t.Fatalf("PTTL %d, %d ms after a 1 min and a 1 s lease, want about a minute", h, e)
	}
	// The retry of a live id renews it: still 3 used.
	if r, err := sl.call(ctx, "a", 1, tryOnce); err != nil || r.status != 1 || used() != "3" {
		t.Fatalf("retry of a = %+v, %v, %s used; want granted with 3 used", r, err, used())
	}
	time.Sleep(1100 * time.Millisecond) // b expires
	// c fits beside the expired b: granted without reclaiming it.
	if r, err := sl.call(ctx, "c", 1, tryOnce); err != nil || r.status != 1 || used() != "4" {
		t.Fatalf("acquire c = %+v, %v, %s used; want granted with 4 used (b not reclaimed)", r, err, used())
	}
	// d does not fit until b is reclaimed: then it does.
	if r, err := sl.call(ctx, "d", 2, tryOnce); err != nil || r.status != 1 || used() != "4" {
		t.Fatalf("acquire d = %+v, %v, %s used; want granted with 4 used (b reclaimed)", r, err, used())
	}
	if got := do("ZSCORE", sl.keys[1], "b"); got != "" {
		t.Fatalf("ZSCORE of b = %q, want the expired permit reclaimed", got)
	}
	if got := do("HEXISTS", sl.keys[0], "b"); got != "0" {
		t.Fatalf("HEXISTS b = %s, want the expired permit's weight gone", got)
	}
	// A short lease first, on fresh keys, then a long one: extended.
	for _, k := range sl.keys[:2] {
		do("DEL", k)
	}
	if r, err := ss.call(ctx, "e", 1, tryOnce); err != nil || r.status != 1 {
		t.Fatalf("acquire e = %+v, %v", r, err)
	}
	if h, e := pttls(); h < 500 || e < 500 || h > 5_000 || e > 5_000 {
		t.Fatalf("PTTL %d, %d ms after a 1 s lease", h, e)
	}
	if r, err := sl.call(ctx, "f", 1, tryOnce); err != nil || r.status != 1 {
		t.Fatalf("acquire f = %+v, %v", r, err)
	}
	if h, e := pttls(); h < 55_000 || e < 55_000 {
		t.Fatalf("PTTL %d, %d ms after a 1 min lease, want about a minute", h, e)
	}
}

// TestFairWaiterOneAttempt: a fair waiter in a Manager whose subscription
// of the semaphore is up (it had a waiter just before) subscribes before
// its first attempt, so that attempt is its only script call: the
// release that frees the permit grants it and tells it. A waiter on a
// channel not subscribed yet attempts once more after subscribing, since a
// grant published before the subscription was confirmed would be missed.
func TestFairWaiterOneAttempt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), internalWait)
	defer cancel()
	srv := redistest.NewServer(t)
	m := internalManager(t, srv.Addr(), Options{Fair: true})
	s, err := m.NewSemaphore("one", 1)
	if err != nil {
		t.Fatal(err)
	}
	queued := func() int {
		out, err := srv.Do("ZCARD", s.keys[3])
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.Atoi(out)
		return n
	}
	holder, err := s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int64{2, 1} {
		before := scriptCalls(t, srv)
		got := make(chan *Permit, 1)
		go func() {
			p, err := s.Acquire(ctx, 1)
			if err != nil {
				t.Error(err)
			}
			got <- p
		}()
		if !redistest.WaitFor(ctx, internalWait, func() bool { return queued() == 1 }) {
			t.Fatal("waiter not queued")
		}
		time.Sleep(50 * time.Millisecond) // its second attempt, if any
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		holder = <-got
		if holder == nil {
			t.FailNow()
		}
		if !holder.handoff {
			t.Errorf("waiter %d: not granted by the release", i)
		}
		if calls := scriptCalls(t, srv) - before; calls != want+1 {
			t.Errorf("waiter %d: %d script calls for its wait and the release, want %d attempts and the release", i, calls, want)
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
