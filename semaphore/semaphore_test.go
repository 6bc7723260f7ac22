package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// signalWait bounds waits for things that must happen; generous for a
// loaded machine.
const signalWait = 10 * time.Second

// target is a Redis deployment the tests run against.
type target struct {
	name  string
	addrs func(t testing.TB) []string
}

func targets() []target {
	return []target{
		{"single", func(t testing.TB) []string { return []string{redistest.Single(t).Addr()} }},
		{"cluster", func(t testing.TB) []string { return redistest.SharedCluster(t).Addrs() }},
	}
}

// forTargets runs f as a subtest per target.
func forTargets(t *testing.T, f func(t *testing.T, addrs []string)) {
	for _, tg := range targets() {
		t.Run(tg.name, func(t *testing.T) { f(t, tg.addrs(t)) })
	}
}

// env is one process's view of Redis: a client and a Manager on it.
type env struct {
	client rueidis.Client
	mgr    *semaphore.Manager
	prefix string
}

func newEnv(t testing.TB, addrs []string, opts semaphore.Options) *env {
	t.Helper()
	client := redistest.Client(t, addrs...)
	ctx, cancel := context.WithTimeout(context.Background(), signalWait)
	defer cancel()
	sc, err := scriptcache.New(ctx, client)
	if err != nil {
		t.Fatalf("scriptcache.New: %v", err)
	}
	if opts.Prefix == "" {
		opts.Prefix = semaphore.DefaultPrefix
	}
	mgr, err := semaphore.NewManager(sc, opts)
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	t.Cleanup(mgr.Close)
	return &env{client: client, mgr: mgr, prefix: opts.Prefix}
}

// uniqueName returns a semaphore name no other test uses.
func uniqueName(t testing.TB) string {
	return strings.ReplaceAll(t.Name(), "/", ":") + ":" + uuid.NewString()[:8]
}

func (e *env) sem(t testing.TB, name string, capacity int64) *semaphore.Semaphore {
	t.Helper()
	s, err := e.mgr.NewSemaphore(name, capacity)
	if err != nil {
		t.Fatalf("NewSemaphore(%q, %d): %v", name, capacity, err)
	}
	return s
}

// keysLeft counts the semaphore's keys still in Redis.
func (e *env) keysLeft(t testing.TB, name string) int64 {
	t.Helper()
	var total int64
	for _, k := range []string{keyspace.Key(e.prefix, name, ""), keyspace.Key(e.prefix, name, ":e"),
		keyspace.Key(e.prefix, name, ":q"), keyspace.Key(e.prefix, name, ":qe")} {
		n, err := e.client.Do(context.Background(), e.client.B().Exists().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatalf("EXISTS %s: %v", k, err)
		}
		total += n
	}
	return total
}

func acquire(t testing.TB, s *semaphore.Semaphore, n int64) *semaphore.Permit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), signalWait)
	defer cancel()
	p, err := s.Acquire(ctx, n)
	if err != nil {
		t.Fatalf("Acquire(%d): %v", n, err)
	}
	return p
}

func release(t testing.TB, p *semaphore.Permit) {
	t.Helper()
	if err := p.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func available(t testing.TB, s *semaphore.Semaphore) int64 {
	t.Helper()
	n, err := s.Available(context.Background())
	if err != nil {
		t.Fatalf("Available: %v", err)
	}
	return n
}

func wantAvailable(t testing.TB, s *semaphore.Semaphore, want int64) {
	t.Helper()
	if got := available(t, s); got != want {
		t.Fatalf("Available = %d, want %d", got, want)
	}
}

func waitLost(t testing.TB, p *semaphore.Permit) error {
	t.Helper()
	select {
	case <-p.Lost():
	case <-time.After(signalWait):
		t.Fatal("permit not reported lost")
	}
	return p.Err()
}

func TestInvalidInput(t *testing.T) {
	if _, err := semaphore.NewManager(nil, semaphore.Options{}); !errors.Is(err, semaphore.ErrInvalidOptions) {
		t.Errorf("NewManager(nil) = %v, want ErrInvalidOptions", err)
	}
	addrs := []string{redistest.Single(t).Addr()}
	client := redistest.Client(t, addrs...)
	sc, err := scriptcache.New(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range []semaphore.Options{
		{Prefix: "a{b"},
		{Lease: time.Millisecond},
		{Lease: -time.Second},
		{WatchdogLease: 10 * time.Millisecond},
	} {
		if _, err := semaphore.NewManager(sc, opts); !errors.Is(err, semaphore.ErrInvalidOptions) {
			t.Errorf("NewManager(%+v) = %v, want ErrInvalidOptions", opts, err)
		}
	}

	e := newEnv(t, addrs, semaphore.Options{})
	names := []struct {
		name     string
		capacity int64
		want     error
	}{
		{"", 1, semaphore.ErrInvalidName},
		{strings.Repeat("x", keyspace.MaxNameLen+1), 1, semaphore.ErrInvalidName},
		{"ok", 0, semaphore.ErrInvalidCapacity},
		{"ok", -3, semaphore.ErrInvalidCapacity},
		{"ok", semaphore.MaxCapacity + 1, semaphore.ErrInvalidCapacity},
	}
	for _, tt := range names {
		if _, err := e.mgr.NewSemaphore(tt.name, tt.capacity); !errors.Is(err, tt.want) {
			t.Errorf("NewSemaphore(%.10q, %d) = %v, want %v", tt.name, tt.capacity, err, tt.want)
		}
	}

	s := e.sem(t, uniqueName(t), 4)
	ctx := context.Background()
	for _, n := range []int64{0, -1, 5} {
		if _, err := s.Acquire(ctx, n); !errors.Is(err, semaphore.ErrInvalidWeight) {
			t.Errorf("Acquire(%d) = %v, want ErrInvalidWeight", n, err)
		}
		if _, err := s.TryAcquire(ctx, n); !errors.Is(err, semaphore.ErrInvalidWeight) {
			t.Errorf("TryAcquire(%d) = %v, want ErrInvalidWeight", n, err)
		}
	}
	if got := e.keysLeft(t, s.Name()); got != 0 {
		t.Errorf("keys after refused calls = %d, want 0", got)
	}
}

func TestAcquireRelease(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		e := newEnv(t, addrs, semaphore.Options{})
		name := uniqueName(t)
		s := e.sem(t, name, 5)
		ctx := context.Background()
		wantAvailable(t, s, 5)

		p2 := acquire(t, s, 2)
		p3 := acquire(t, s, 3)
		if p2.Weight() != 2 || p3.Weight() != 3 || p2.ID() == p3.ID() {
			t.Fatalf("permits (%s, %d) and (%s, %d), want weights 2 and 3 with distinct ids", p2.ID(), p2.Weight(), p3.ID(), p3.Weight())
		}
		wantAvailable(t, s, 0)
		if _, err := s.TryAcquire(ctx, 1); !errors.Is(err, semaphore.ErrNotObtained) {
			t.Fatalf("TryAcquire on a full semaphore = %v, want ErrNotObtained", err)
		}

		hs, err := s.Holders(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, h := range hs {
			got[h.ID] = h.Weight
			if h.Remaining <= 0 || h.Remaining > semaphore.DefaultWatchdogLease {
				t.Errorf("holder %s remaining %v, want in (0, %v]", h.ID, h.Remaining, semaphore.DefaultWatchdogLease)
			}
		}
		if len(got) != 2 || got[p2.ID()] != 2 || got[p3.ID()] != 3 {
			t.Fatalf("Holders = %+v, want %s:2 and %s:3", hs, p2.ID(), p3.ID())
		}

		release(t, p2)
		wantAvailable(t, s, 2)
		if err := p2.Release(ctx); !errors.Is(err, semaphore.ErrNotHeld) {
			t.Fatalf("second Release = %v, want ErrNotHeld", err)
		}
		wantAvailable(t, s, 2) // the double release freed nothing of p3's
		p1, err := s.TryAcquire(ctx, 2)
		if err != nil {
			t.Fatalf("TryAcquire(2) with 2 free: %v", err)
		}
		release(t, p1)
		release(t, p3)
		wantAvailable(t, s, 5)
		if got := e.keysLeft(t, name); got != 0 {
			t.Fatalf("keys left after releasing everything = %d, want 0", got)
		}
		select {
		case <-p3.Lost():
			t.Fatalf("Lost closed after a normal release (Err %v)", p3.Err())
		default:
		}
	})
}

func TestWeightedWaits(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		e := newEnv(t, addrs, semaphore.Options{})
		s := e.sem(t, uniqueName(t), 4)
		a, b := acquire(t, s, 1), acquire(t, s, 1)

		type result struct {
			p   *semaphore.Permit
			err error
		}
		done := make(chan result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), signalWait)
			defer cancel()
			p, err := s.Acquire(ctx, 3)
			done <- result{p, err}
		}()
		// 2 of 4 are free: Acquire(3) must not get through. This only
		// checks for a wrong grant; a correct one cannot come early.
		select {
		case r := <-done:
			t.Fatalf("Acquire(3) returned (%v, %v) with only 2 permits free", r.p, r.err)
		case <-time.After(200 * time.Millisecond):
		}

		// Freeing one leaves 3 free. The watchdog lease is 30 s, so a grant
		// well within signalWait comes from the release's wake-up.
		release(t, a)
		r := <-done
		if r.err != nil {
			t.Fatalf("Acquire(3) after a release: %v", r.err)
		}
		if r.p.Weight() != 3 {
			t.Fatalf("Weight = %d, want 3", r.p.Weight())
		}
		wantAvailable(t, s, 0)
		release(t, r.p)
		release(t, b)
		wantAvailable(t, s, 4)
	})
}

func TestCancelWhileWaiting(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		e := newEnv(t, addrs, semaphore.Options{})
		s := e.sem(t, uniqueName(t), 2)
		held := acquire(t, s, 2)

		tests := []struct {
			name string
			ctx  func() (context.Context, context.CancelFunc)
			want error
		}{
			{"timeout", func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 150*time.Millisecond)
			}, context.DeadlineExceeded},
			{"cancel", func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(150*time.Millisecond, cancel)
				return ctx, cancel
			}, context.Canceled},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				ctx, cancel := tt.ctx()
				defer cancel()
				p, err := s.Acquire(ctx, 1)
				if p != nil || !errors.Is(err, semaphore.ErrNotObtained) || !errors.Is(err, tt.want) {
					t.Fatalf("Acquire = (%v, %v), want ErrNotObtained wrapping %v", p, err, tt.want)
				}
				hs, err := s.Holders(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if len(hs) != 1 || hs[0].ID != held.ID() {
					t.Fatalf("Holders after a cancelled Acquire = %+v, want only %s", hs, held.ID())
				}
			})
		}
		release(t, held)
		wantAvailable(t, s, 2)
	})
}

func TestFixedLeaseExpires(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		const leaseDur = 300 * time.Millisecond
		short := newEnv(t, addrs, semaphore.Options{Lease: leaseDur})
		long := newEnv(t, addrs, semaphore.Options{})
		name := uniqueName(t)
		old := acquire(t, short.sem(t, name, 3), 3)

		// A waiter elsewhere gets in when the permit expires: nobody
		// releases, so only the expiry hint can wake it.
		s := long.sem(t, name, 3)
		p := acquire(t, s, 2)

		err := waitLost(t, old)
		if !errors.Is(err, semaphore.ErrLost) || !errors.Is(err, lease.ErrExpired) {
			t.Fatalf("Err = %v, want ErrLost wrapping lease.ErrExpired", err)
		}
		if err := old.Release(context.Background()); !errors.Is(err, semaphore.ErrNotHeld) {
			t.Fatalf("Release of an expired permit = %v, want ErrNotHeld", err)
		}
		wantAvailable(t, s, 1) // the expired release freed nothing of p's
		release(t, p)
		if got := long.keysLeft(t, name); got != 0 {
			t.Fatalf("keys left = %d, want 0", got)
		}

		// Permits that just expire leave no key behind either.
		acquire(t, short.sem(t, name, 3), 1)
		if !redistest.WaitFor(context.Background(), signalWait, func() bool { return long.keysLeft(t, name) == 0 }) {
			t.Fatalf("keys of expired permits still there after %v", signalWait)
		}
	})
}

func TestWatchdogRenews(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		// Renewals every 667 ms, each with 1.13 s to come back before
		// the client gives the lease up (margin a tenth): a loaded
		// machine does not turn that into a false loss, which is what is
		// tested. (At 1.2 s, with 680 ms, a machine loaded far beyond two
		// CPU hogs lost it now and then.)
		const leaseDur = 2 * time.Second
		e := newEnv(t, addrs, semaphore.Options{WatchdogLease: leaseDur})
		s := e.sem(t, uniqueName(t), 2)
		p := acquire(t, s, 2)
		// Time passing is what is tested: several leases without release.
		time.Sleep(3 * leaseDur)
		select {
		case <-p.Lost():
			t.Fatalf("permit lost while renewed: %v", p.Err())
		default:
		}
		hs, err := s.Holders(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(hs) != 1 || hs[0].ID != p.ID() || hs[0].Remaining > leaseDur {
			t.Fatalf("Holders = %+v, want %s with at most %v left", hs, p.ID(), leaseDur)
		}
		wantAvailable(t, s, 0)
		release(t, p)
	})
}

func TestLossReported(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		// The first renewal, after a third of the lease, finds the permit
		// gone; the lease is long enough that its client-side end does not
		// come first on a loaded machine.
		e := newEnv(t, addrs, semaphore.Options{WatchdogLease: time.Second})
		name := uniqueName(t)
		s := e.sem(t, name, 2)
		p := acquire(t, s, 1)
		// An operator (or a Redis restart) removes the semaphore.
		for _, k := range []string{keyspace.Key(e.prefix, name, ""), keyspace.Key(e.prefix, name, ":e")} {
			if err := e.client.Do(context.Background(), e.client.B().Del().Key(k).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		err := waitLost(t, p)
		if !errors.Is(err, semaphore.ErrLost) || !errors.Is(err, lease.ErrGone) {
			t.Fatalf("Err = %v, want ErrLost wrapping lease.ErrGone", err)
		}
		if err := p.Release(context.Background()); !errors.Is(err, semaphore.ErrNotHeld) || !errors.Is(err, semaphore.ErrLost) {
			t.Fatalf("Release after loss = %v, want ErrNotHeld wrapping ErrLost", err)
		}
	})
}

// TestReleaseFindsPermitGone: the permit is deleted behind the holder's
// back and Release comes before the watchdog notices. Release must say the
// permit was lost (ErrNotHeld wrapping ErrLost), and Lost must close.
func TestReleaseFindsPermitGone(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		e := newEnv(t, addrs, semaphore.Options{}) // 30 s lease: no renewal before the Release
		name := uniqueName(t)
		s := e.sem(t, name, 2)
		p := acquire(t, s, 1)
		for _, k := range []string{keyspace.Key(e.prefix, name, ""), keyspace.Key(e.prefix, name, ":e")} {
			if err := e.client.Do(context.Background(), e.client.B().Del().Key(k).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		err := p.Release(context.Background())
		if !errors.Is(err, semaphore.ErrNotHeld) || !errors.Is(err, semaphore.ErrLost) {
			t.Fatalf("Release of a deleted permit = %v, want ErrNotHeld wrapping ErrLost", err)
		}
		select {
		case <-p.Lost():
		default:
			t.Fatal("Lost not closed after Release found the permit gone")
		}
		if !errors.Is(p.Err(), semaphore.ErrLost) {
			t.Fatalf("Err = %v, want ErrLost", p.Err())
		}
	})
}

// TestCapacityMismatch: while permits are held, a Semaphore made with
// another capacity is refused with ErrCapacityMismatch, fair or not (a
// fair Acquire goes through semaphore_queue, whose refusal a mutant of
// issue 32 turned into the too-many-permits answer, ErrInvalidWeight,
// when only the unfair path was tried).
func TestCapacityMismatch(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(map[bool]string{false: "unfair", true: "fair"}[fair], func(t *testing.T) { testCapacityMismatch(t, fair) })
	}
}

func testCapacityMismatch(t *testing.T, fair bool) {
	forTargets(t, func(t *testing.T, addrs []string) {
		e := newEnv(t, addrs, semaphore.Options{Fair: fair})
		name := uniqueName(t)
		five := e.sem(t, name, 5)
		three := e.sem(t, name, 3)
		ctx := context.Background()

		p := acquire(t, five, 4)
		if _, err := three.Acquire(ctx, 1); !errors.Is(err, semaphore.ErrCapacityMismatch) {
			t.Fatalf("Acquire with capacity 3 while 5 holds = %v, want ErrCapacityMismatch", err)
		}
		if _, err := three.Available(ctx); !errors.Is(err, semaphore.ErrCapacityMismatch) {
			t.Fatalf("Available with capacity 3 while 5 holds = %v, want ErrCapacityMismatch", err)
		}
		wantAvailable(t, five, 1)
		release(t, p)

		// Empty: the next capacity applies, and is then enforced.
		q := acquire(t, three, 3)
		if _, err := five.TryAcquire(ctx, 1); !errors.Is(err, semaphore.ErrCapacityMismatch) {
			t.Fatalf("TryAcquire with capacity 5 while 3 holds = %v, want ErrCapacityMismatch", err)
		}
		release(t, q)
		wantAvailable(t, five, 5)
	})
}

// TestReclaimManyExpired: a call reclaims expired permits 16 at a time,
// and Acquire calls again at once until they are gone; the reclaimed ones
// leave the permits set. Fair too: semaphore_queue reclaims for a fair
// Acquire (a mutant of issue 32 that took them out of the wrong key there
// left them listed, and only the unfair path was tried).
func TestReclaimManyExpired(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(map[bool]string{false: "unfair", true: "fair"}[fair], func(t *testing.T) { testReclaimManyExpired(t, fair) })
	}
}

func testReclaimManyExpired(t *testing.T, fair bool) {
	forTargets(t, func(t *testing.T, addrs []string) {
		const n = 40 // more than one reclaim batch (16)
		// The short permits must all still run when Available is read
		// after the 40 acquisitions: 100 ms did not, once, at load 10
		// with coverage on.
		short := newEnv(t, addrs, semaphore.Options{Lease: time.Second, Fair: fair})
		long := newEnv(t, addrs, semaphore.Options{Fair: fair})
		name := uniqueName(t)
		keep := acquire(t, long.sem(t, name, n+1), 1) // keeps the keys alive
		ss := short.sem(t, name, n+1)
		for range n {
			acquire(t, ss, 1)
		}
		s := long.sem(t, name, n+1)
		wantAvailable(t, s, 0)
		// Acquire retries at once while expired permits remain to reclaim.
		p := acquire(t, s, n)
		hs, err := s.Holders(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(hs) != 2 {
			t.Fatalf("Holders = %d entries, want 2 (the expired ones reclaimed)", len(hs))
		}
		release(t, p)
		release(t, keep)
		if got := long.keysLeft(t, name); got != 0 {
			t.Fatalf("keys left = %d, want 0", got)
		}
	})
}

func TestClose(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(map[bool]string{false: "unfair", true: "fair"}[fair], func(t *testing.T) { testClose(t, fair) })
	}
}

// testClose: Close ends a waiting Acquire and reports held permits lost; a
// fair waiter it ends leaves the queue, so the permits released afterwards
// are free, not granted to it.
func testClose(t *testing.T, fair bool) {
	addrs := []string{redistest.Single(t).Addr()}
	other := newEnv(t, addrs, semaphore.Options{Fair: fair})
	e := newEnv(t, addrs, semaphore.Options{Fair: fair})
	name := uniqueName(t)
	s := e.sem(t, name, 2)
	held := acquire(t, s, 1)
	blocker := acquire(t, other.sem(t, name, 2), 1)

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), signalWait)
		defer cancel()
		_, err := s.Acquire(ctx, 2)
		done <- err
	}()
	if fair {
		e.waitQueued(t, name, 1)
	}
	e.mgr.Close()
	select {
	case err := <-done:
		if !errors.Is(err, semaphore.ErrClosed) {
			t.Fatalf("waiting Acquire after Close = %v, want ErrClosed", err)
		}
	case <-time.After(signalWait):
		t.Fatal("waiting Acquire did not return after Close")
	}
	if err := waitLost(t, held); !errors.Is(err, semaphore.ErrLost) || !errors.Is(err, semaphore.ErrClosed) {
		t.Fatalf("Err of a permit held at Close = %v, want ErrLost wrapping ErrClosed", err)
	}
	if _, err := s.Acquire(context.Background(), 1); !errors.Is(err, semaphore.ErrClosed) {
		t.Fatalf("Acquire after Close = %v, want ErrClosed", err)
	}
	// Still on the server until released: Release frees it.
	release(t, held)
	release(t, blocker)
	wantAvailable(t, other.sem(t, name, 2), 2)
}

// TestWakeBudget checks that a release wakes as many local waiters as can
// succeed, not all of them, by counting script calls on a private server.
func TestWakeBudget(t *testing.T) {
	srv := redistest.NewServer(t)
	e := newEnv(t, []string{srv.Addr()}, semaphore.Options{})
	s := e.sem(t, uniqueName(t), 1)
	held := acquire(t, s, 1)

	const waiters = 10
	var wg sync.WaitGroup
	errs := make(chan error, waiters)
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), signalWait)
			defer cancel()
			p, err := s.Acquire(ctx, 1)
			if err == nil {
				err = p.Release(ctx)
			}
			errs <- err
		}()
	}
	// Each waiter tries once, subscribes, and tries once more before
	// waiting; the state to wait for is only visible in Redis.
	before := int64(1) + 2*waiters
	if !redistest.WaitFor(context.Background(), signalWait, func() bool { return evalshaCalls(t, srv) >= before }) {
		t.Fatalf("waiters made %d calls, want %d", evalshaCalls(t, srv), before)
	}
	release(t, held)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// One release, then per waiter one attempt and one release when each
	// release wakes one waiter; waking the herd would take 55 attempts.
	got := evalshaCalls(t, srv) - before
	t.Logf("%d script calls after the first release", got)
	if want := int64(1 + 2*waiters + 5); got > want {
		t.Fatalf("%d script calls after the first release, want at most %d", got, want)
	}
}

func evalshaCalls(t testing.TB, srv *redistest.Server) int64 {
	t.Helper()
	info, err := srv.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
			var n int64
			fmt.Sscanf(rest, "%d", &n)
			return n
		}
	}
	return 0
}

// TestLostReplyReleased checks that an Acquire whose request reaches Redis
// only after its context ended holds nothing: the request still runs and
// grants the permit, which must then be released when its late reply comes.
func TestLostReplyReleased(t *testing.T) {
	srv := redistest.NewServer(t)
	e := newEnv(t, []string{srv.Addr()}, semaphore.Options{})
	s := e.sem(t, uniqueName(t), 2)
	wantAvailable(t, s, 2) // connection up, scripts loaded
	calls := evalshaCalls(t, srv)

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	p, err := s.Acquire(ctx, 1)
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if p != nil || !errors.Is(err, semaphore.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire against a paused server = (%v, %v), want ErrNotObtained wrapping DeadlineExceeded", p, err)
	}
	// The late grant runs after Resume, and the release of it after its
	// reply arrives; only the server's count of script calls shows when
	// both have run. Without that release the permit would stay for 30 s.
	if !redistest.WaitFor(context.Background(), signalWait, func() bool { return evalshaCalls(t, srv) >= calls+2 }) {
		t.Fatalf("script calls after Resume = %d, want %d (the late acquire and its release)", evalshaCalls(t, srv)-calls, 2)
	}
	hs, err := s.Holders(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 0 {
		t.Fatalf("Holders after a timed-out Acquire = %+v, want none", hs)
	}
	wantAvailable(t, s, 2)
}

// TestReplicaAcksWithoutReplica: with ReplicaAcks and no replica to confirm,
// every grant is refused and given back, never left held.
func TestReplicaAcksWithoutReplica(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{ReplicaAcks: 1, ReplicaTimeout: 20 * time.Millisecond})
	name := uniqueName(t)
	s := e.sem(t, name, 3)
	if _, err := s.TryAcquire(ctx, 1); !errors.Is(err, semaphore.ErrNotReplicated) {
		t.Fatalf("TryAcquire = %v, want ErrNotReplicated", err)
	}
	if _, err := s.Acquire(ctx, 2); !errors.Is(err, semaphore.ErrNotReplicated) {
		t.Fatalf("Acquire = %v, want ErrNotReplicated", err)
	}
	wantAvailable(t, s, 3)
	if n := e.keysLeft(t, name); n != 0 {
		t.Fatalf("%d keys left after refused grants, want 0", n)
	}
}

// TestMaxCapacityExact: at the largest capacity, a request one permit too
// big must be refused; Lua's doubles must not round it under capacity.
func TestMaxCapacityExact(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{})
	s := e.sem(t, uniqueName(t), semaphore.MaxCapacity)
	big, err := s.TryAcquire(ctx, semaphore.MaxCapacity-1)
	if err != nil {
		t.Fatal(err)
	}
	defer big.Release(ctx)
	if p, err := s.TryAcquire(ctx, 2); !errors.Is(err, semaphore.ErrNotObtained) {
		if p != nil {
			p.Release(ctx)
		}
		t.Fatalf("TryAcquire(2) with 1 permit free = %v, want ErrNotObtained", err)
	}
	p, err := s.TryAcquire(ctx, 1)
	if err != nil {
		t.Fatalf("TryAcquire(1) with 1 permit free = %v", err)
	}
	defer p.Release(ctx)
	wantAvailable(t, s, 0)
}

// TestWakeLighterWaiter (issue 10, item 5): capacity 5, permits of 4 and 1
// held, a waiter for 5 ahead of a waiter for 1. Releasing the 1 must wake
// the waiter for 1, not spend the wake-up on the one for 5 that cannot use
// it; otherwise the waiter for 1 sleeps until its wait bound, a whole
// watchdog lease (30 s), with a permit free.
func TestWakeLighterWaiter(t *testing.T) {
	srv := redistest.NewServer(t)
	e := newEnv(t, []string{srv.Addr()}, semaphore.Options{})
	s := e.sem(t, uniqueName(t), 5)
	four := acquire(t, s, 4)
	one := acquire(t, s, 1)

	type result struct {
		p   *semaphore.Permit
		err error
	}
	ctx, cancel := context.WithTimeout(context.Background(), signalWait)
	defer cancel()
	start := func(n int64) chan result {
		done := make(chan result, 1)
		calls := evalshaCalls(t, srv)
		go func() {
			p, err := s.Acquire(ctx, n)
			done <- result{p, err}
		}()
		// Its first attempt, then the one after subscribing: it waits
		// next, and is registered behind any waiter started before it.
		if !redistest.WaitFor(ctx, signalWait, func() bool { return evalshaCalls(t, srv) >= calls+2 }) {
			t.Fatalf("Acquire(%d) did not start waiting", n)
		}
		return done
	}
	heavy := start(5)
	light := start(1)

	release(t, one)
	select {
	case r := <-light:
		if r.err != nil {
			t.Fatalf("Acquire(1) after one permit was released: %v", r.err)
		}
		release(t, r.p)
	case <-time.After(signalWait):
		t.Fatalf("Acquire(1) still waiting %v after one permit was released", signalWait)
	}
	release(t, four)
	r := <-heavy
	if r.err != nil {
		t.Fatalf("Acquire(5) once all were released: %v", r.err)
	}
	release(t, r.p)
}

// TestSubscribeRefused (issue 10, item 7): an ACL user without access to
// the wake-up channel (resetchannels, the default for new Redis 7 users)
// gets NOPERM for SUBSCRIBE. An Acquire that has to wait must say so at
// once, not wait a whole lease for want of wake-ups.
func TestSubscribeRefused(t *testing.T) {
	srv := redistest.NewServer(t)
	if _, err := srv.Do("ACL", "SETUSER", "limited", "on", ">pw", "~*", "+@all", "resetchannels"); err != nil {
		t.Fatal(err)
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{srv.Addr()}, DisableCache: true, Username: "limited", Password: "pw",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	sc, err := scriptcache.New(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := semaphore.NewManager(sc, semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	name := uniqueName(t)
	s, err := mgr.NewSemaphore(name, 1)
	if err != nil {
		t.Fatal(err)
	}
	full := newEnv(t, []string{srv.Addr()}, semaphore.Options{})
	held := acquire(t, full.sem(t, name, 1), 1)
	defer release(t, held)

	for i := range 2 { // the refusal is not remembered: each Acquire asks
		ctx, cancel := context.WithTimeout(context.Background(), signalWait)
		p, err := s.Acquire(ctx, 1)
		cancel()
		var re *rueidis.RedisError
		if p != nil || !errors.Is(err, semaphore.ErrSubscribe) || !errors.As(err, &re) || !strings.HasPrefix(re.Error(), "NOPERM") {
			t.Fatalf("Acquire %d on a full semaphore without channel access = (%v, %v), want ErrSubscribe wrapping NOPERM", i, p, err)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire %d waited for its context: %v", i, err)
		}
	}
}

// TestReplicaAcksHonoursContext (issue 10, items 4 and 6): with ReplicaAcks
// an Acquire against a server that does not answer returns when its context
// ends, not when the server answers; and the permit its request is granted
// once the server answers after all is released, not left until its lease.
func TestReplicaAcksHonoursContext(t *testing.T) {
	srv := redistest.NewServer(t)
	e := newEnv(t, []string{srv.Addr()}, semaphore.Options{ReplicaAcks: 1})
	s := e.sem(t, uniqueName(t), 2)
	wantAvailable(t, s, 2) // connection up, scripts loaded

	const paused = 3 * time.Second
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	pausedAt := time.Now()
	t.Cleanup(func() { srv.Resume() })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	p, err := s.Acquire(ctx, 1)
	took := time.Since(pausedAt)
	if p != nil || !errors.Is(err, semaphore.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire against a paused server = (%v, %v), want ErrNotObtained wrapping DeadlineExceeded", p, err)
	}
	if took > 2*time.Second {
		t.Fatalf("Acquire with a 200ms context took %v against a paused server", took)
	}
	// The server stays paused well past the context, as a stalled one would.
	time.Sleep(paused - time.Since(pausedAt))
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	// The request runs now and is granted (WAIT then finds no replica):
	// nobody waits for it, so it must be released, well before the 30 s
	// lease would free it.
	if !redistest.WaitFor(context.Background(), signalWait, func() bool { return available(t, s) == 2 }) {
		t.Fatalf("Available still %d %v after the server answered, want 2: the late grant was not released", available(t, s), signalWait)
	}
}

// TestNoLossAfterRelease (issue 10, item 4 for the semaphore): with a
// 30 ms watchdog lease, renewals run every 10 ms and overlap many releases.
// A successful Release must never be followed by a loss signal. A loss
// reported before Release was called is legitimate (a loaded machine can
// miss a whole lease of renewals: lease.ErrExpired), and so is a Release
// that then finds the permit gone; neither is what this test is after.
func TestNoLossAfterRelease(t *testing.T) {
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{WatchdogLease: 30 * time.Millisecond})
	s := e.sem(t, uniqueName(t), 4)
	ctx := context.Background()
	var prev *semaphore.Permit
	expired := 0
	for i := range 200 {
		p := acquire(t, s, 1)
		// Hold for 0 to 11 ms (workload, not synchronization), so that
		// releases meet renewals at every stage.
		time.Sleep(time.Duration(i%12) * time.Millisecond)
		err := p.Release(ctx)
		if errors.Is(err, semaphore.ErrNotHeld) {
			expired++
			continue
		}
		if err != nil {
			t.Fatalf("Release %d: %v", i, err)
		}
		if err := p.Err(); err != nil {
			if !errors.Is(err, lease.ErrExpired) {
				t.Fatalf("Err after successful Release %d = %v, want nil", i, err)
			}
			expired++ // reported before Release was called
		}
		// Nothing may arrive after Release returned: look again a cycle later.
		if prev != nil && prev.Err() != nil && !errors.Is(prev.Err(), lease.ErrExpired) {
			t.Fatalf("Err of permit %d after its successful Release = %v, want nil", i-1, prev.Err())
		}
		prev = p
	}
	t.Logf("%d of 200 permits expired before their Release (a loaded machine)", expired)
}
