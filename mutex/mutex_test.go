package mutex_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// signal is how long a test waits for something that must happen; generous
// because CI shares two cores between Redis, the tests and the race detector.
const signal = 10 * time.Second

type target struct {
	name  string
	addrs func(t *testing.T) []string
}

var realTargets = []target{
	{"single", func(t *testing.T) []string { return []string{redistest.Single(t).Addr()} }},
	{"cluster", func(t *testing.T) []string { return redistest.SharedCluster(t).Addrs() }},
}

// newScripts loads the scripts through client, failing the test if it
// cannot.
func newScripts(t testing.TB, client rueidis.Client) *scriptcache.Cache {
	t.Helper()
	sc, err := scriptcache.New(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func newLocker(t testing.TB, client rueidis.Client, opts mutex.Options) *mutex.Locker {
	t.Helper()
	sc := newScripts(t, client)
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

func miniClient(t *testing.T) rueidis.Client {
	t.Helper()
	mr := miniredis.RunT(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true, AlwaysRESP2: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func allTargets() []target {
	return append(realTargets[:len(realTargets):len(realTargets)], target{"miniredis", nil})
}

func clientFor(t *testing.T, tg target) rueidis.Client {
	if tg.addrs == nil {
		return miniClient(t)
	}
	return redistest.Client(t, tg.addrs(t)...)
}

func TestLockUnlock(t *testing.T) {
	ctx := context.Background()
	for _, tg := range allTargets() {
		t.Run(tg.name, func(t *testing.T) {
			l := newLocker(t, clientFor(t, tg), mutex.Options{})
			name := "basic:" + t.Name()
			a, b := newMutex(t, l, name), newMutex(t, l, name)
			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if tok := a.Token(); tok <= 0 {
				t.Errorf("Token() = %d, want > 0", tok)
			}
			if err := b.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
				t.Fatalf("TryLock while held by another = %v, want ErrNotObtained", err)
			}
			if err := b.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
				t.Fatalf("Unlock by non-owner = %v, want ErrNotHeld", err)
			}
			info, err := a.Info(ctx)
			if err != nil || !info.Held || info.Owner != a.Owner() || info.Holds != 1 || info.Token != a.Token() || info.Remain <= 0 {
				t.Fatalf("Info = %+v, %v; want held by %s with 1 hold", info, err, a.Owner())
			}
			if err := a.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := a.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
				t.Fatalf("second Unlock = %v, want ErrNotHeld", err)
			}
			if err := b.TryLock(ctx); err != nil {
				t.Fatalf("TryLock after release = %v", err)
			}
			if err := b.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestReentrancy(t *testing.T) {
	ctx := context.Background()
	for _, tg := range allTargets() {
		t.Run(tg.name, func(t *testing.T) {
			l := newLocker(t, clientFor(t, tg), mutex.Options{})
			for depth := 1; depth <= 5; depth++ {
				name := fmt.Sprintf("reentrant:%s:%d", t.Name(), depth)
				a, b := newMutex(t, l, name), newMutex(t, l, name)
				for range depth {
					if err := a.Lock(ctx); err != nil {
						t.Fatal(err)
					}
				}
				token := a.Token()
				if a.Holds() != int64(depth) {
					t.Fatalf("Holds() = %d, want %d", a.Holds(), depth)
				}
				for i := depth; i > 0; i-- {
					if err := b.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
						t.Fatalf("depth %d, %d holds left: other TryLock = %v, want ErrNotObtained", depth, i, err)
					}
					if got := a.Token(); got != token {
						t.Fatalf("nested holds changed the token: %d, want %d", got, token)
					}
					if err := a.Unlock(ctx); err != nil {
						t.Fatal(err)
					}
				}
				if err := a.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
					t.Fatalf("extra Unlock = %v, want ErrNotHeld", err)
				}
				if err := b.TryLock(ctx); err != nil {
					t.Fatalf("after the last Unlock, other TryLock = %v", err)
				}
				if got := b.Token(); got <= token {
					t.Fatalf("next token %d, want > %d", got, token)
				}
				b.Unlock(ctx)
			}
		})
	}
}

// TestStaleOwner: A's fixed lease runs out, B takes the lock; A's Unlock
// must fail and leave B's lock alone.
func TestStaleOwner(t *testing.T) {
	ctx := context.Background()
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			l := newLocker(t, clientFor(t, tg), mutex.Options{})
			name := "stale:" + t.Name()
			a := newMutex(t, l, name, mutex.WithLease(150*time.Millisecond))
			b := newMutex(t, l, name)
			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case <-a.Lost():
			case <-time.After(signal):
				t.Fatal("A was not told its lease ran out")
			}
			if !errors.Is(a.Err(), mutex.ErrLost) {
				t.Errorf("A.Err() = %v, want ErrLost", a.Err())
			}
			lctx, cancel := context.WithTimeout(ctx, signal)
			defer cancel()
			if err := b.Lock(lctx); err != nil {
				t.Fatal(err)
			}
			if err := a.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
				t.Fatalf("stale Unlock = %v, want ErrNotHeld", err)
			}
			info, _ := b.Info(ctx)
			if !info.Held || info.Owner != b.Owner() {
				t.Fatalf("after stale Unlock, Info = %+v, want held by B", info)
			}
			b.Unlock(ctx)
		})
	}
}

func TestWatchdog(t *testing.T) {
	ctx := context.Background()
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			// Renewals every 200 ms, each with 340 ms to come back: room
			// for a loaded machine, where a false loss is what this test
			// would catch.
			const lease = 600 * time.Millisecond
			l := newLocker(t, clientFor(t, tg), mutex.Options{WatchdogLease: lease})
			m := newMutex(t, l, "watchdog:"+t.Name())
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			// Nothing to wait on: the point is that nothing happens for 5 leases.
			select {
			case <-m.Lost():
				t.Fatalf("lost under the watchdog: %v", m.Err())
			case <-time.After(5 * lease):
			}
			info, err := m.Info(ctx)
			if err != nil || !info.Held || info.Owner != m.Owner() {
				t.Fatalf("after 5 leases, Info = %+v, %v; want held", info, err)
			}
			if err := m.Unlock(ctx); err != nil {
				t.Fatal(err)
			}

			fixed := newMutex(t, l, "fixed:"+t.Name(), mutex.WithLease(lease))
			if err := fixed.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if !redistest.WaitFor(ctx, signal, func() bool { info, _ := fixed.Info(ctx); return !info.Held }) {
				t.Fatal("a lock with a fixed lease did not expire")
			}
			// That the signal comes before the expiry is the lease and
			// blackhole suites' business, with the timer lateness of a
			// loaded machine accounted for; here it must come at all.
			select {
			case <-fixed.Lost():
			case <-time.After(signal):
				t.Fatal("the holder of an expired fixed lease was not told")
			}
		})
	}
}

// TestLoss deletes, flushes or restarts under a held lock: the holder is
// told within about one renewal interval.
func TestLoss(t *testing.T) {
	ctx := context.Background()
	const lease = 600 * time.Millisecond
	faults := []struct {
		name  string
		fault func(t *testing.T, srv *redistest.Server, key string)
	}{
		{"delete", func(t *testing.T, srv *redistest.Server, key string) { srv.Do("DEL", key) }},
		{"flushall", func(t *testing.T, srv *redistest.Server, key string) { srv.Do("FLUSHALL") }},
		{"restart", func(t *testing.T, srv *redistest.Server, key string) {
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
		}},
		{"force", nil},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			srv := redistest.NewServer(t)
			l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{WatchdogLease: lease})
			m := newMutex(t, l, "loss")
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if f.fault != nil {
				f.fault(t, srv, "sluice:mutex:{loss}")
			} else if ok, err := newMutex(t, l, "loss").ForceUnlock(ctx); !ok || err != nil {
				t.Fatalf("ForceUnlock = %v, %v", ok, err)
			}
			select {
			case <-m.Lost():
			case <-time.After(signal):
				t.Fatal("holder not told of the loss")
			}
			if !errors.Is(m.Err(), mutex.ErrLost) {
				t.Errorf("Err() = %v, want ErrLost", m.Err())
			}
			// One renewal interval (lease/3) plus the lease the keeper may
			// take to give up on a dead connection.
			if d := time.Since(start); d > lease+lease/3+time.Second {
				t.Errorf("loss noticed after %v, want within about %v", d, lease/3)
			}
			if err := m.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) || !errors.Is(err, mutex.ErrLost) {
				t.Errorf("Unlock after loss = %v, want ErrNotHeld and ErrLost", err)
			}
		})
	}
}

// TestTokensIncrease: tokens of successive acquisitions, by different owners
// and in quick succession, strictly increase.
func TestTokensIncrease(t *testing.T) {
	ctx := context.Background()
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			l := newLocker(t, clientFor(t, tg), mutex.Options{})
			ms := []*mutex.Mutex{newMutex(t, l, "tokens:"+t.Name()), newMutex(t, l, "tokens:"+t.Name())}
			var last int64
			for i := range 300 {
				m := ms[i%2]
				if err := m.Lock(ctx); err != nil {
					t.Fatal(err)
				}
				tok := m.Token()
				if tok <= last {
					t.Fatalf("acquisition %d: token %d, want > %d", i, tok, last)
				}
				last = tok
				if err := m.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestTokensAfterStaleHash: a failover to a replica that missed the last
// acquisitions gives the lock's record back as it was before them. The next
// token must still be above every token issued, because tokens come from
// the server's clock, not only from the previous token the record keeps: a
// token of "one more than the stored one" would hand out again the token of
// the first acquisition the replica missed, and two holders (the lock is
// doubled by such a failover) would pass the same fencing check. DUMP and
// RESTORE stand in for the failover; the clock moves on in between, as it
// does on a promoted replica. Mutex and RWMutex writers alike.
func TestTokensAfterStaleHash(t *testing.T) {
	ctx := context.Background()
	type lock interface {
		Lock(context.Context) error
		Unlock(context.Context) error
		Token() int64
	}
	kinds := []struct {
		name string
		key  func(name string) string
		open func(t *testing.T, l *mutex.Locker, name string) lock
	}{
		{"mutex", lockKey, func(t *testing.T, l *mutex.Locker, name string) lock { return newMutex(t, l, name) }},
		{"rwmutex", func(name string) string { return rwKey(name, "h") }, func(t *testing.T, l *mutex.Locker, name string) lock { return newRW(t, l, name) }},
	}
	for _, tg := range realTargets {
		for _, k := range kinds {
			t.Run(tg.name+"/"+k.name, func(t *testing.T) {
				client := clientFor(t, tg)
				l := newLocker(t, client, mutex.Options{})
				name := "tokens-stale:" + t.Name()
				key := k.key(name)
				m := k.open(t, l, name)
				pair := func() int64 {
					t.Helper()
					if err := m.Lock(ctx); err != nil {
						t.Fatal(err)
					}
					tok := m.Token()
					if err := m.Unlock(ctx); err != nil {
						t.Fatal(err)
					}
					return tok
				}
				pair()
				stale, err := client.Do(ctx, client.B().Dump().Key(key).Build()).ToString()
				if err != nil {
					t.Fatalf("DUMP %s: %v", key, err)
				}
				var last int64
				for range 50 {
					last = max(last, pair())
				}
				if err := client.Do(ctx, client.B().Restore().Key(key).Ttl(0).SerializedValue(stale).Replace().Build()).Error(); err != nil {
					t.Fatalf("RESTORE: %v", err)
				}
				if tok := pair(); tok <= last {
					t.Fatalf("token %d after the record went back, want above every earlier token (%d): a token was issued twice", tok, last)
				}
			})
		}
	}
}

// TestHandOff: a waiter gets a released lock through pub/sub, not by
// waiting out the 30 s lease.
func TestHandOff(t *testing.T) {
	ctx := context.Background()
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			l := newLocker(t, clientFor(t, tg), mutex.Options{})
			name := "handoff:" + t.Name()
			a, b := newMutex(t, l, name), newMutex(t, l, name)
			for range 10 {
				if err := a.Lock(ctx); err != nil {
					t.Fatal(err)
				}
				// The holder works for a while (that is the scenario, not
				// synchronization) while b waits in Lock.
				unlocked := make(chan error, 1)
				go func() {
					time.Sleep(30 * time.Millisecond)
					unlocked <- a.Unlock(ctx)
				}()
				lctx, cancel := context.WithTimeout(ctx, signal)
				err := b.Lock(lctx)
				cancel()
				if err != nil {
					t.Fatalf("waiter not handed the lock (the lease is 30 s, so it was not woken): %v", err)
				}
				if err := <-unlocked; err != nil {
					t.Fatal(err)
				}
				if err := b.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestContextBounds: Lock returns when its context ends, wrapping both
// ErrNotObtained and the context's error, and holds nothing.
func TestContextBounds(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, redistest.Client(t, redistest.Single(t).Addr()), mutex.Options{})
	a, b := newMutex(t, l, "ctx"), newMutex(t, l, "ctx")
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer a.Unlock(ctx)
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	err := b.Lock(tctx)
	if !errors.Is(err, mutex.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock with expiring ctx = %v, want ErrNotObtained and DeadlineExceeded", err)
	}
	if b.Holds() != 0 {
		t.Fatalf("b holds %d after a failed Lock", b.Holds())
	}
}

// TestCancelStorm: many Locks cancelled at random while the lock is busy,
// then Close: no goroutine is left (checked by goleak in TestMain), no
// waiter hangs, and no key is left after the lease.
func TestCancelStorm(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	sc := newScripts(t, client)
	l, err := mutex.NewLocker(sc, mutex.Options{WatchdogLease: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var acquired atomic.Int64
	for i := range 200 {
		wg.Go(func() {
			m, _ := l.NewMutex("storm:" + strconv.Itoa(i%4))
			cctx, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(100))*time.Millisecond)
			defer cancel()
			if err := m.Lock(cctx); err == nil {
				acquired.Add(1)
				time.Sleep(time.Millisecond)
				if err := m.Unlock(ctx); err != nil {
					t.Errorf("Unlock: %v", err)
				}
			} else if !errors.Is(err, mutex.ErrNotObtained) {
				t.Errorf("Lock: %v", err)
			}
		})
	}
	wg.Wait()
	l.Close()
	if acquired.Load() == 0 {
		t.Error("no Lock succeeded in the storm")
	}
	if !redistest.WaitFor(ctx, signal, func() bool {
		keys, _ := srv.Do("KEYS", "sluice:mutex:{storm:*")
		return keys == ""
	}) {
		t.Error("keys left behind after the storm")
	}
}

func TestBadInput(t *testing.T) {
	l := newLocker(t, miniClient(t), mutex.Options{})
	for _, name := range []string{"", strings.Repeat("x", 2000)} {
		if _, err := l.NewMutex(name); !errors.Is(err, mutex.ErrInvalidName) {
			t.Errorf("NewMutex(%d bytes) = %v, want ErrInvalidName", len(name), err)
		}
	}
	for _, name := range []string{"{", "}", "a}b{", "\x00\xff"} {
		if _, err := l.NewMutex(name); err != nil {
			t.Errorf("NewMutex(%q) = %v, want nil", name, err)
		}
	}
	sc, _ := scriptcache.New(context.Background(), miniClient(t))
	for _, o := range []mutex.Options{
		{Prefix: "a{b"}, {Lease: -time.Second}, {Lease: time.Millisecond}, {WatchdogLease: -1}, {Lease: 1 << 62},
	} {
		if _, err := mutex.NewLocker(sc, o); !errors.Is(err, mutex.ErrInvalidOptions) {
			t.Errorf("NewLocker(%+v) = %v, want ErrInvalidOptions", o, err)
		}
	}
	if _, err := mutex.NewLocker(nil, mutex.Options{}); !errors.Is(err, mutex.ErrInvalidOptions) {
		t.Errorf("NewLocker(nil) = %v, want ErrInvalidOptions", err)
	}
	if _, err := l.NewMutex("x", mutex.WithOwner("")); !errors.Is(err, mutex.ErrInvalidOptions) {
		t.Errorf("WithOwner(\"\") = %v, want ErrInvalidOptions", err)
	}
	closed := newLocker(t, miniClient(t), mutex.Options{})
	m := newMutex(t, closed, "closed")
	closed.Close()
	if err := m.Lock(context.Background()); !errors.Is(err, mutex.ErrClosed) {
		t.Errorf("Lock on a closed Locker = %v, want ErrClosed", err)
	}
}

// TestNamesWithBraces: names with braces still keep all keys in one slot on
// a cluster (a wrong slot would fail with ErrCrossSlot).
func TestNamesWithBraces(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, redistest.Client(t, redistest.SharedCluster(t).Addrs()...), mutex.Options{})
	for _, name := range []string{"{", "}", "}x{", "a}b", "{a}", "~}"} {
		m := newMutex(t, l, name)
		if err := m.Lock(ctx); err != nil {
			t.Fatalf("Lock(%q) = %v", name, err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatalf("Unlock(%q) = %v", name, err)
		}
	}
}

// Multi-process tests re-run this test binary as helper processes.
const (
	envRole  = "SLUICE_MUTEX_HELPER"
	envAddrs = "SLUICE_MUTEX_ADDRS"
)

func helper(t *testing.T, role string, addrs []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envRole+"="+role, envAddrs+"="+strings.Join(addrs, ","),
		"SLUICE_MUTEX_ARGS="+strings.Join(args, ","))
	cmd.Stderr = os.Stderr
	return cmd
}

// TestHelperProcess is not a test: it is the body of helper processes.
func TestHelperProcess(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		t.Skip("helper process body")
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: strings.Split(os.Getenv(envAddrs), ","), DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	args := strings.Split(os.Getenv("SLUICE_MUTEX_ARGS"), ",")
	switch role {
	case "exclusion":
		exclusionWorker(t, client, args)
	case "holder":
		pausedHolder(t, client)
	case "fairwaiter":
		fairWaiter(t, client, args)
	}
}

// exclusionWorker runs goroutines that each do sections critical sections:
// a non-atomic read-modify-write of a counter plus an occupancy gauge.
func exclusionWorker(t *testing.T, client rueidis.Client, args []string) {
	ctx := context.Background()
	name := args[0]
	goroutines, _ := strconv.Atoi(args[1])
	sections, _ := strconv.Atoi(args[2])
	sc := newScripts(t, client)
	l, err := mutex.NewLocker(sc, mutex.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	counter, gauge := "{"+name+"}:counter", "{"+name+"}:occupancy"
	var maxOcc atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			m, _ := l.NewMutex(name)
			for range sections {
				if err := m.Lock(ctx); err != nil {
					t.Error(err)
					return
				}
				occ, _ := client.Do(ctx, client.B().Incr().Key(gauge).Build()).AsInt64()
				if occ > maxOcc.Load() {
					maxOcc.Store(occ)
				}
				v, _ := client.Do(ctx, client.B().Get().Key(counter).Build()).AsInt64()
				client.Do(ctx, client.B().Set().Key(counter).Value(strconv.FormatInt(v+1, 10)).Build())
				client.Do(ctx, client.B().Decr().Key(gauge).Build())
				if err := m.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("maxocc %d\n", maxOcc.Load())
}

func TestMutualExclusionAcrossProcesses(t *testing.T) {
	const procs, goroutines, sections = 4, 8, 40
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			addrs := tg.addrs(t)
			name := "excl:" + tg.name + strconv.Itoa(rand.IntN(1e9))
			var cmds []*exec.Cmd
			var outs []*bufio.Scanner
			for range procs {
				cmd := helper(t, "exclusion", addrs, name, strconv.Itoa(goroutines), strconv.Itoa(sections))
				out, _ := cmd.StdoutPipe()
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				cmds = append(cmds, cmd)
				outs = append(outs, bufio.NewScanner(out))
			}
			for i, cmd := range cmds {
				for outs[i].Scan() {
					if occ, ok := strings.CutPrefix(outs[i].Text(), "maxocc "); ok && occ != "1" {
						t.Errorf("process %d saw %s holders at once, want 1", i, occ)
					}
				}
				if err := cmd.Wait(); err != nil {
					t.Fatalf("helper %d: %v", i, err)
				}
			}
			client := redistest.Client(t, addrs...)
			got, err := client.Do(context.Background(), client.B().Get().Key("{"+name+"}:counter").Build()).AsInt64()
			if want := int64(procs * goroutines * sections); err != nil || got != want {
				t.Fatalf("counter = %d, %v; want %d (lost updates mean two holders at once)", got, err, want)
			}
		})
	}
}

// pausedHolder takes the lock, reports its token, and after being stopped
// and continued reports whether it learned that it lost the lock.
func pausedHolder(t *testing.T, client rueidis.Client) {
	ctx := context.Background()
	sc := newScripts(t, client)
	l, err := mutex.NewLocker(sc, mutex.Options{WatchdogLease: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	m, _ := l.NewMutex("paused")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("token %d\n", m.Token())
	select {
	case <-m.Lost():
		fmt.Printf("lost %v\n", m.Err())
	case <-time.After(signal):
		fmt.Println("not told")
	}
}

// TestPausedHolder stops a holder process (SIGSTOP) past its lease: another
// process gets the lock with a larger token, and the holder, when it runs
// again, learns that it lost the lock.
func TestPausedHolder(t *testing.T) {
	srv := redistest.NewServer(t)
	cmd := helper(t, "holder", []string{srv.Addr()})
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		t.Fatal("holder printed nothing")
	}
	first, err := strconv.ParseInt(strings.TrimPrefix(sc.Text(), "token "), 10, 64)
	if err != nil {
		t.Fatalf("holder said %q", sc.Text())
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), signal)
	defer cancel()
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{})
	m := newMutex(t, l, "paused")
	if err := m.Lock(ctx); err != nil {
		t.Fatalf("lock of a paused holder never freed: %v", err)
	}
	if m.Token() <= first {
		t.Errorf("new token %d, want > the paused holder's %d", m.Token(), first)
	}
	cmd.Process.Signal(syscall.SIGCONT)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "lost ") {
		t.Fatalf("resumed holder said %q, want it to know it lost the lock", sc.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := m.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestReplicaAcksWithoutReplica: with ReplicaAcks and no replica to confirm,
// every acquisition is refused and released again, not left held.
func TestReplicaAcksWithoutReplica(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, redistest.Client(t, redistest.Single(t).Addr()), mutex.Options{ReplicaAcks: 1, ReplicaTimeout: 20 * time.Millisecond})
	m := newMutex(t, l, "noreplica")
	if err := m.TryLock(ctx); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("TryLock = %v, want ErrNotReplicated", err)
	}
	if err := m.Lock(ctx); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("Lock = %v, want ErrNotReplicated", err)
	}
	info, err := m.Info(ctx)
	if err != nil || info.Held || m.Holds() != 0 {
		t.Fatalf("after refused acquisitions: Info %+v, %v, Holds %d; want free", info, err, m.Holds())
	}
}

// TestNestedLockFindsHoldGone: the key vanishes (a restart without
// persistence) before the watchdog notices, and the holder nests another
// Lock. The script would take the free lock afresh under a new token; the
// Mutex must report the loss instead of counting a nested hold under the
// old token, and must leave the lock free.
func TestNestedLockFindsHoldGone(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{})
	m := newMutex(t, l, "gone")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lost := m.Lost()
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	if err := m.Lock(ctx); !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("nested Lock after the hold vanished = %v, want ErrLost", err)
	}
	select {
	case <-lost:
	default:
		t.Fatal("Lost not closed")
	}
	if info, err := m.Info(ctx); err != nil || info.Held {
		t.Fatalf("Info = %+v, %v; want the fresh acquisition given back", info, err)
	}
	// The outer Lock is not released yet: the loss stands until Unlock.
	if err := m.Lock(ctx); !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("Lock before Unlock = %v, want ErrLost", err)
	}
	if err := m.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) || !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("Unlock after the loss = %v, want ErrNotHeld wrapping ErrLost", err)
	}
	if err := m.Lock(ctx); err != nil || m.Holds() != 1 {
		t.Fatalf("Lock after Unlock = %v with %d holds, want a new outermost hold", err, m.Holds())
	}
	m.Unlock(ctx)
}

// TestAbandonedAttemptGivenBack pauses Redis while a Lock is in flight: the
// caller gives up, Redis then runs the attempt and grants the lock to an
// owner that no longer waits for it. The Locker must give it back at once,
// not leave everyone to wait out the 30 s lease; a later Lock of the same
// Mutex must not be undone by that give-back.
func TestAbandonedAttemptGivenBack(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{})
	a, b := newMutex(t, l, "abandoned"), newMutex(t, l, "abandoned")
	// Open the connection first: a call that has to wait for a connection's
	// handshake is bounded by the dial timeout, not its context (see
	// scriptcache.Exec), and that is not what this test is about.
	if err := a.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Several rounds: rueidis spreads calls over several connections, so a
	// give-back sent too early could overtake the attempt in some of them.
	for round := range 8 {
		if err := srv.Pause(); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err := a.Lock(short)
		cancel()
		if !errors.Is(err, mutex.ErrNotObtained) {
			t.Fatalf("round %d: Lock on a paused server = %v, want ErrNotObtained", round, err)
		}
		if err := srv.Resume(); err != nil {
			t.Fatal(err)
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
	// A's next Lock holds, whatever give-back of its old attempt is in flight.
	if err := a.Lock(lctx); err != nil {
		t.Fatal(err)
	}
	if err := b.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("B's TryLock while A holds = %v, want ErrNotObtained", err)
	}
	a.Unlock(ctx)
}

// TestHoldLostDuringNestedLock: a nested Lock is in flight when the client
// declares the hold lost (its lease deadline passed while the network held
// the request); the request reaches Redis afterwards, possibly while the key
// still exists there. The nested Lock must not revive the lost hold under
// its stale token, and the next Unlock gives back whatever Redis kept.
func TestHoldLostDuringNestedLock(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	proxy, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	l := newLocker(t, redistest.Client(t, proxy.Addr()), mutex.Options{})
	m := newMutex(t, l, "nested-lost", mutex.WithLease(300*time.Millisecond))
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lost := m.Lost()
	proxy.Blackhole(true)
	got := make(chan error, 1)
	go func() { got <- m.Lock(ctx) }()
	select {
	case <-lost:
	case <-time.After(signal):
		t.Fatal("the fixed lease did not end on the client")
	}
	proxy.Blackhole(false)
	if err := <-got; !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("nested Lock whose hold was lost during the call = %v, want ErrLost", err)
	}
	if h, tok := m.Holds(), m.Token(); h != 0 || tok != 0 {
		t.Fatalf("Holds() = %d, Token() = %d after the loss; want 0, 0", h, tok)
	}
	if err := m.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Fatalf("Unlock after the loss = %v, want ErrNotHeld", err)
	}
	if info, err := m.Info(ctx); err != nil || info.Held {
		t.Fatalf("Info = %+v, %v; want nothing left held", info, err)
	}
}

// TestCloseDuringLock: the Locker is closed while an outermost Lock is in
// flight. Lock must not report success for a hold nobody would renew, and
// must give the grant back.
func TestCloseDuringLock(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	client := redistest.Client(t, srv.Addr())
	sc := newScripts(t, client)
	l, err := mutex.NewLocker(sc, mutex.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := l.NewMutex("close-during")
	if err := m.TryLock(ctx); err != nil { // open the connection first
		t.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- m.Lock(ctx) }()
	time.Sleep(50 * time.Millisecond) // the Lock is in flight: the scenario
	l.Close()
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, mutex.ErrClosed) {
		t.Fatalf("Lock during Close = %v, want ErrClosed", err)
	}
	other, _ := newLocker(t, client, mutex.Options{}).NewMutex("close-during")
	if info, err := other.Info(ctx); err != nil || info.Held {
		t.Fatalf("Info = %+v, %v; want the grant given back", info, err)
	}
}
