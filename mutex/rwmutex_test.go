package mutex_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

func newRW(t testing.TB, l *mutex.Locker, name string, opts ...mutex.LockOption) *mutex.RWMutex {
	t.Helper()
	rw, err := l.NewRWMutex(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return rw
}

func rwKey(name, suffix string) string { return mutex.DefaultPrefix + "{" + name + "}:rw." + suffix }

func TestRWReadersShareWritersExclude(t *testing.T) {
	ctx := context.Background()
	for _, tg := range allTargets() {
		t.Run(tg.name, func(t *testing.T) {
			l := newLocker(t, clientFor(t, tg), mutex.Options{})
			name := "rw-basic:" + t.Name()
			r1, r2, w := newRW(t, l, name), newRW(t, l, name), newRW(t, l, name)
			if err := r1.RLock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := r2.TryRLock(ctx); err != nil {
				t.Fatalf("second reader TryRLock = %v, want nil (readers share)", err)
			}
			if err := w.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
				t.Fatalf("writer TryLock under readers = %v, want ErrNotObtained", err)
			}
			if info, err := w.Info(ctx); err != nil || info.Readers != 2 || info.Writer != "" || info.WriterWaiting != 0 {
				t.Fatalf("Info = %+v, %v; want 2 readers, no writer, no mark (TryLock leaves none)", info, err)
			}
			for _, r := range []*mutex.RWMutex{r1, r2} {
				if err := r.RUnlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := r1.RUnlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
				t.Fatalf("extra RUnlock = %v, want ErrNotHeld", err)
			}
			if err := w.TryLock(ctx); err != nil {
				t.Fatalf("writer TryLock once readers left = %v", err)
			}
			if w.Token() <= 0 {
				t.Fatalf("Token() = %d, want > 0", w.Token())
			}
			if err := r1.TryRLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
				t.Fatalf("reader TryRLock under a writer = %v, want ErrNotObtained", err)
			}
			if err := r2.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
				t.Fatalf("second writer TryLock = %v, want ErrNotObtained", err)
			}
			if err := r1.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
				t.Fatalf("Unlock by a non-writer = %v, want ErrNotHeld", err)
			}
			info, err := w.Info(ctx)
			if err != nil || info.Writer != w.Owner() || info.WriteHolds != 1 || info.Token != w.Token() || info.WriteRemain <= 0 || info.Readers != 0 {
				t.Fatalf("Info = %+v, %v; want held by the writer", info, err)
			}
			if err := w.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := r1.TryRLock(ctx); err != nil {
				t.Fatalf("reader after the writer left = %v", err)
			}
			r1.RUnlock(ctx)
		})
	}
}

func TestRWReentrancyAndDowngrade(t *testing.T) {
	ctx := context.Background()
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			l := newLocker(t, clientFor(t, tg), mutex.Options{})
			name := "rw-reentrant:" + t.Name()
			a, b := newRW(t, l, name), newRW(t, l, name)
			for range 3 {
				if err := a.Lock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			token := a.Token()
			// A writer may take read holds, nested too.
			for range 2 {
				if err := a.RLock(ctx); err != nil {
					t.Fatalf("writer's RLock = %v", err)
				}
			}
			if w, r := a.Holds(); w != 3 || r != 2 {
				t.Fatalf("Holds() = %d, %d; want 3, 2", w, r)
			}
			for range 3 {
				if err := b.TryRLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
					t.Fatalf("other reader while a writes = %v, want ErrNotObtained", err)
				}
				if a.Token() != token {
					t.Fatalf("nested holds changed the token")
				}
				if err := a.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// Downgraded: a still reads, so readers share and writers wait.
			if err := b.TryRLock(ctx); err != nil {
				t.Fatalf("other reader after the downgrade = %v", err)
			}
			if err := b.RUnlock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := b.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
				t.Fatalf("other writer while a still reads = %v, want ErrNotObtained", err)
			}
			// Upgrading would deadlock: refused at once.
			if err := a.Lock(ctx); !errors.Is(err, mutex.ErrUpgrade) {
				t.Fatalf("Lock while holding only reads = %v, want ErrUpgrade", err)
			}
			for range 2 {
				if err := a.RUnlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.TryLock(ctx); err != nil {
				t.Fatalf("writer after all reads left = %v", err)
			}
			if b.Token() <= token {
				t.Fatalf("next token %d, want > %d", b.Token(), token)
			}
			b.Unlock(ctx)
		})
	}
}

// TestRWWriterNotStarved: readers keep the lock read-held without a gap
// (each one takes its next hold before it releases the last); a writer
// must still get in.
func TestRWWriterNotStarved(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			addrs := tg.addrs(t)
			name := "rw-starve:" + t.Name()
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			var wg sync.WaitGroup
			var reads atomic.Int64
			started := make(chan struct{}, 4)
			for i := range 4 {
				l := newLocker(t, redistest.Client(t, addrs...), mutex.Options{})
				wg.Go(func() {
					a, b := newRW(t, l, name), newRW(t, l, name)
					cur, next := a, b
					if err := cur.RLock(ctx); err != nil {
						t.Error(err)
						return
					}
					started <- struct{}{}
					for ctx.Err() == nil {
						// Overlap: the next hold starts before this one
						// ends, so without the writer-waiting mark the
						// lock would never be free.
						time.Sleep(time.Millisecond) // reading: the scenario
						err := next.TryRLock(ctx)
						if err == nil {
							reads.Add(1)
							cur.RUnlock(context.Background())
							cur, next = next, cur
							continue
						}
						if !errors.Is(err, mutex.ErrNotObtained) {
							t.Errorf("reader %d: %v", i, err)
						}
						// Refused: a writer waits. Let go and queue behind it.
						cur.RUnlock(context.Background())
						if cur.RLock(ctx) != nil {
							return
						}
					}
					cur.RUnlock(context.Background())
				})
			}
			for range 4 {
				<-started
			}
			w := newRW(t, newLocker(t, redistest.Client(t, addrs...), mutex.Options{}), name)
			wctx, cancel := context.WithTimeout(context.Background(), signal)
			err := w.Lock(wctx)
			cancel()
			stop()
			wg.Wait()
			if err != nil {
				t.Fatalf("writer starved by readers: %v (reads so far %d)", err, reads.Load())
			}
			w.Unlock(context.Background())
		})
	}
}

// TestRWCrashedReader: a reader whose process dies (its Locker closed, so
// nobody renews it) stops holding the writer out after its lease.
func TestRWCrashedReader(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	dead := newLocker(t, client, mutex.Options{WatchdogLease: 300 * time.Millisecond})
	r := newRW(t, dead, "rw-crash")
	if err := r.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	dead.Close()
	select {
	case <-r.Lost():
	default:
		t.Fatal("Close did not tell the reader")
	}
	w := newRW(t, newLocker(t, client, mutex.Options{}), "rw-crash")
	lctx, cancel := context.WithTimeout(ctx, signal)
	defer cancel()
	if err := w.Lock(lctx); err != nil {
		t.Fatalf("writer held out by a dead reader past its lease: %v", err)
	}
	if info, _ := w.Info(ctx); info.Readers != 0 {
		t.Fatalf("Info = %+v, want the dead reader gone", info)
	}
	w.Unlock(ctx)
}

func TestRWTokensIncrease(t *testing.T) {
	ctx := context.Background()
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			l := newLocker(t, clientFor(t, tg), mutex.Options{})
			name := "rw-tokens:" + t.Name()
			ws := []*mutex.RWMutex{newRW(t, l, name), newRW(t, l, name)}
			var last int64
			for i := range 200 {
				w := ws[i%2]
				if i%5 == 0 { // readers in between do not disturb the order
					if err := w.RLock(ctx); err != nil {
						t.Fatal(err)
					}
					w.RUnlock(ctx)
				}
				if err := w.Lock(ctx); err != nil {
					t.Fatal(err)
				}
				if tok := w.Token(); tok <= last {
					t.Fatalf("acquisition %d: token %d, want > %d", i, tok, last)
				}
				last = w.Token()
				if err := w.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestRWLoss deletes, flushes, restarts or forces under held write and read holds:
// the holders are told, and their releases report ErrNotHeld.
func TestRWLoss(t *testing.T) {
	ctx := context.Background()
	const lease = 600 * time.Millisecond
	faults := []struct {
		name  string
		fault func(t *testing.T, srv *redistest.Server, rw *mutex.RWMutex)
	}{
		{"delete", func(t *testing.T, srv *redistest.Server, _ *mutex.RWMutex) {
			srv.Do("DEL", rwKey("loss-w", "h"), rwKey("loss-r", "z"))
		}},
		{"flushall", func(t *testing.T, srv *redistest.Server, _ *mutex.RWMutex) { srv.Do("FLUSHALL") }},
		{"restart", func(t *testing.T, srv *redistest.Server, _ *mutex.RWMutex) {
			if err := srv.Restart(); err != nil {
				t.Fatal(err)
			}
		}},
		{"force", func(t *testing.T, srv *redistest.Server, other *mutex.RWMutex) {
			if ok, err := other.ForceUnlock(ctx); !ok || err != nil {
				t.Fatalf("ForceUnlock = %v, %v", ok, err)
			}
		}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			srv := redistest.NewServer(t)
			l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{WatchdogLease: lease})
			w, r := newRW(t, l, "loss-w"), newRW(t, l, "loss-r")
			if err := w.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := r.RLock(ctx); err != nil {
				t.Fatal(err)
			}
			if f.name == "force" {
				f.fault(t, srv, newRW(t, l, "loss-w"))
				f.fault(t, srv, newRW(t, l, "loss-r"))
			} else {
				f.fault(t, srv, nil)
			}
			for _, h := range []struct {
				rw      *mutex.RWMutex
				release func(context.Context) error
			}{{w, w.Unlock}, {r, r.RUnlock}} {
				select {
				case <-h.rw.Lost():
				case <-time.After(signal):
					t.Fatalf("%s: holder not told of the loss", h.rw.Name())
				}
				if !errors.Is(h.rw.Err(), mutex.ErrLost) {
					t.Errorf("%s: Err() = %v, want ErrLost", h.rw.Name(), h.rw.Err())
				}
				if err := h.release(ctx); !errors.Is(err, mutex.ErrNotHeld) || !errors.Is(err, mutex.ErrLost) {
					t.Errorf("%s: release after loss = %v, want ErrNotHeld and ErrLost", h.rw.Name(), err)
				}
			}
		})
	}
}

// TestRWNoLossAfterCleanRelease: with renewals every 20 ms some land just
// after a release; a successful release is never followed by a loss. (Each
// renewal has 34 ms to come back, so a loaded machine still releases
// cleanly in most cycles.)
func TestRWNoLossAfterCleanRelease(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, redistest.Client(t, redistest.Single(t).Addr()), mutex.Options{WatchdogLease: 60 * time.Millisecond})
	rw := newRW(t, l, "rw-clean")
	clean := 0
	for i := range 200 {
		write := i%2 == 0
		acquire, release := rw.RLock, rw.RUnlock
		if write {
			acquire, release = rw.Lock, rw.Unlock
		}
		if err := acquire(ctx); err != nil {
			continue // a false loss under load is another matter
		}
		lost := rw.Lost()
		time.Sleep(time.Duration(i%22) * time.Millisecond) // meet the renewals
		if err := release(ctx); err != nil {
			continue
		}
		clean++
		if err := rw.Err(); err != nil {
			t.Fatalf("cycle %d: release returned nil, then Err() = %v", i, err)
		}
		select {
		case <-lost:
			t.Fatalf("cycle %d: Lost closed after a clean release", i)
		default:
		}
	}
	if clean < 20 {
		t.Fatalf("only %d of 200 cycles released cleanly", clean)
	}
}

// TestRWExclusion: goroutines with Lockers and clients of their own (as
// separate processes would) mix reads and writes. A writer sees no other
// writer and no reader; a reader sees no writer; writers' non-atomic
// increments are all counted.
func TestRWExclusion(t *testing.T) {
	const workers, rounds = 6, 25
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			addrs := tg.addrs(t)
			name := "rw-excl:" + t.Name()
			counter, writers, readers := "{"+name+"}:counter", "{"+name+"}:writers", "{"+name+"}:readers"
			check := redistest.Client(t, addrs...)
			ctx := context.Background()
			check.Do(ctx, check.B().Del().Key(counter, writers, readers).Build())
			var wg sync.WaitGroup
			var writes atomic.Int64
			for i := range workers {
				client := redistest.Client(t, addrs...)
				l := newLocker(t, client, mutex.Options{})
				wg.Go(func() {
					rw := newRW(t, l, name)
					incr := func(key string, by int64) int64 {
						n, _ := client.Do(ctx, client.B().Incrby().Key(key).Increment(by).Build()).AsInt64()
						return n
					}
					get := func(key string) int64 {
						n, _ := client.Do(ctx, client.B().Get().Key(key).Build()).AsInt64()
						return n
					}
					for j := range rounds {
						lctx, cancel := context.WithTimeout(ctx, 4*signal)
						if (i+j)%3 == 0 {
							if err := rw.Lock(lctx); err != nil {
								cancel()
								t.Errorf("worker %d: Lock: %v", i, err)
								return
							}
							if w := incr(writers, 1); w != 1 {
								t.Errorf("%d writers at once", w)
							}
							if r := get(readers); r != 0 {
								t.Errorf("a writer with %d readers", r)
							}
							v := get(counter)
							client.Do(ctx, client.B().Set().Key(counter).Value(strconv.FormatInt(v+1, 10)).Build())
							writes.Add(1)
							incr(writers, -1)
							if err := rw.Unlock(ctx); err != nil {
								t.Errorf("worker %d: Unlock: %v", i, err)
							}
						} else {
							if err := rw.RLock(lctx); err != nil {
								cancel()
								t.Errorf("worker %d: RLock: %v", i, err)
								return
							}
							incr(readers, 1)
							if w := get(writers); w != 0 {
								t.Errorf("a reader with %d writers", w)
							}
							incr(readers, -1)
							if err := rw.RUnlock(ctx); err != nil {
								t.Errorf("worker %d: RUnlock: %v", i, err)
							}
						}
						cancel()
					}
				})
			}
			wg.Wait()
			got, _ := check.Do(ctx, check.B().Get().Key(counter).Build()).AsInt64()
			if got != writes.Load() {
				t.Fatalf("counter = %d, want %d (lost updates mean two writers at once)", got, writes.Load())
			}
		})
	}
}

// TestRWAbandonedAttemptGivenBack: Locks and RLocks whose callers gave up
// while Redis was paused are given back, not left for the 30 s lease.
func TestRWAbandonedAttemptGivenBack(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{})
	a, b := newRW(t, l, "rw-abandoned"), newRW(t, l, "rw-abandoned")
	if err := a.TryLock(ctx); err != nil { // open the connection first
		t.Fatal(err)
	}
	a.Unlock(ctx)
	for round := range 4 {
		for _, write := range []bool{true, false} {
			if err := srv.Pause(); err != nil {
				t.Fatal(err)
			}
			short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			var err error
			if write {
				err = a.Lock(short)
			} else {
				err = a.RLock(short)
			}
			cancel()
			if !errors.Is(err, mutex.ErrNotObtained) {
				t.Fatalf("round %d: lock on a paused server = %v, want ErrNotObtained", round, err)
			}
			if err := srv.Resume(); err != nil {
				t.Fatal(err)
			}
			lctx, cancel := context.WithTimeout(ctx, signal)
			err = b.Lock(lctx)
			cancel()
			if err != nil {
				t.Fatalf("round %d (write %v): the abandoned grant was not given back: %v", round, write, err)
			}
			if err := b.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestRWWaitingWriterGivesUp: a waiting Lock leaves a writer-waiting mark
// that refuses new readers (a reader that holds may still nest); when the
// Lock gives up it withdraws the mark, so readers are not held up by a
// writer that left.
func TestRWWaitingWriterGivesUp(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l, wl := newLocker(t, client, mutex.Options{}), newLocker(t, client, mutex.Options{})
	r, w, r2 := newRW(t, l, "rw-giveup"), newRW(t, wl, "rw-giveup"), newRW(t, l, "rw-giveup")
	if err := r.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan error, 1)
	go func() { got <- w.Lock(wctx) }()
	if !redistest.WaitFor(ctx, signal, func() bool { info, _ := r.Info(ctx); return info.WriterWaiting > 0 }) {
		t.Fatal("a waiting writer left no mark")
	}
	if err := r2.TryRLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("new reader while a writer waits = %v, want ErrNotObtained", err)
	}
	if err := r.RLock(ctx); err != nil {
		t.Fatalf("nested RLock of a holding reader while a writer waits = %v, want nil", err)
	}
	cancel()
	if err := <-got; !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("writer Lock under a reader = %v, want ErrNotObtained", err)
	}
	// The withdrawal is sent in the background; Close waits for it. The
	// mark would otherwise last 2 s.
	wl.Close()
	if info, _ := r.Info(ctx); info.WriterWaiting != 0 {
		t.Fatalf("Info = %+v after the writer gave up, want its mark withdrawn", info)
	}
	if err := r2.TryRLock(ctx); err != nil {
		t.Fatalf("new reader after the waiting writer gave up = %v", err)
	}
	r2.RUnlock(ctx)
	r.RUnlock(ctx)
	r.RUnlock(ctx)
	if info, _ := r.Info(ctx); info.Readers != 0 || info.WriterWaiting != 0 {
		t.Fatalf("Info = %+v, want no readers and no mark", info)
	}
}

// TestRWNoKeysLeft: after a busy mix of reads, writes and cancelled
// attempts with short leases, every key expires.
func TestRWNoKeysLeft(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	l := newLocker(t, client, mutex.Options{WatchdogLease: 300 * time.Millisecond})
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			rw := newRW(t, l, "rw-leak:"+strconv.Itoa(i%3))
			cctx, cancel := context.WithTimeout(ctx, time.Duration(i%7)*15*time.Millisecond)
			defer cancel()
			acquire, release := rw.RLock, rw.RUnlock
			if i%4 == 0 {
				acquire, release = rw.Lock, rw.Unlock
			}
			if err := acquire(cctx); err == nil {
				time.Sleep(time.Millisecond)
				release(ctx)
			}
		})
	}
	wg.Wait()
	l.Close()
	if !redistest.WaitFor(ctx, signal, func() bool {
		keys, _ := srv.Do("KEYS", "sluice:mutex:{rw-leak:*")
		return keys == ""
	}) {
		keys, _ := srv.Do("KEYS", "sluice:mutex:{rw-leak:*")
		t.Errorf("keys left behind: %q", keys)
	}
}

func TestRWBadInput(t *testing.T) {
	l := newLocker(t, miniClient(t), mutex.Options{})
	for _, name := range []string{"", strings.Repeat("x", 2000)} {
		if _, err := l.NewRWMutex(name); !errors.Is(err, mutex.ErrInvalidName) {
			t.Errorf("NewRWMutex(%d bytes) = %v, want ErrInvalidName", len(name), err)
		}
	}
	if _, err := l.NewRWMutex("x", mutex.WithOwner("")); !errors.Is(err, mutex.ErrInvalidOptions) {
		t.Errorf("WithOwner(\"\") = %v, want ErrInvalidOptions", err)
	}
	if _, err := l.NewRWMutex("x", mutex.WithLease(time.Millisecond)); !errors.Is(err, mutex.ErrInvalidOptions) {
		t.Errorf("WithLease(1ms) = %v, want ErrInvalidOptions", err)
	}
	closed := newLocker(t, miniClient(t), mutex.Options{})
	rw := newRW(t, closed, "closed")
	closed.Close()
	if err := rw.RLock(context.Background()); !errors.Is(err, mutex.ErrClosed) {
		t.Errorf("RLock on a closed Locker = %v, want ErrClosed", err)
	}
}

// TestRWDoAndContext: Do and RDo run fn under the hold and release it; the
// context of a hold ends when it is lost, with the loss as its cause.
func TestRWDoAndContext(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{WatchdogLease: 600 * time.Millisecond})
	rw, other := newRW(t, l, "rw-do"), newRW(t, l, "rw-do")
	errFn := errors.New("fn failed")
	err := rw.Do(ctx, func(ctx context.Context) error {
		if err := other.TryRLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
			t.Errorf("reader inside Do = %v, want ErrNotObtained", err)
		}
		return errFn
	})
	if !errors.Is(err, errFn) {
		t.Fatalf("Do = %v, want fn's error", err)
	}
	err = rw.RDo(ctx, func(ctx context.Context) error {
		if err := other.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
			t.Errorf("writer inside RDo = %v, want ErrNotObtained", err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("RDo = %v", err)
	}
	if w, r := rw.Holds(); w+r != 0 {
		t.Fatalf("Holds() = %d, %d after Do and RDo; want none", w, r)
	}
	// A loss while fn runs: fn's context ends and Do reports it.
	err = rw.RDo(ctx, func(hctx context.Context) error {
		if ok, err := other.ForceUnlock(ctx); !ok || err != nil {
			t.Errorf("ForceUnlock = %v, %v", ok, err)
		}
		select {
		case <-hctx.Done():
		case <-time.After(signal):
			t.Error("the hold's context did not end at the loss")
		}
		if !errors.Is(context.Cause(hctx), mutex.ErrLost) {
			t.Errorf("Cause = %v, want ErrLost", context.Cause(hctx))
		}
		return nil
	})
	if !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("RDo whose hold was lost = %v, want ErrLost", err)
	}
	// Released: the context ends with ErrNotHeld.
	if err := rw.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, cancel := rw.Context(ctx)
	defer cancel()
	if err := rw.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hctx.Done():
	default:
		t.Fatal("the context outlived the hold")
	}
	if !errors.Is(context.Cause(hctx), mutex.ErrNotHeld) {
		t.Fatalf("Cause after Unlock = %v, want ErrNotHeld", context.Cause(hctx))
	}
}

// TestRWNestedFindsHoldGone: the holds vanish (a restart without
// persistence) before the watchdog notices; a nested Lock or RLock must
// report the loss, not count a hold that no longer excludes anyone.
func TestRWNestedFindsHoldGone(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{})
	w, r := newRW(t, l, "gone-w"), newRW(t, l, "gone-r")
	if err := w.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	if err := w.Lock(ctx); !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("nested Lock after the hold vanished = %v, want ErrLost", err)
	}
	if err := r.RLock(ctx); !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("nested RLock after the hold vanished = %v, want ErrLost", err)
	}
	for _, rw := range []*mutex.RWMutex{w, r} {
		select {
		case <-rw.Lost():
		default:
			t.Fatalf("%s: Lost not closed", rw.Name())
		}
		if wh, rh := rw.Holds(); wh+rh != 0 {
			t.Fatalf("%s: Holds() = %d, %d; want none", rw.Name(), wh, rh)
		}
	}
	// The outer RLock is not released yet: the loss stands until RUnlock.
	if err := r.RLock(ctx); !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("RLock before RUnlock = %v, want ErrLost", err)
	}
	if err := r.RUnlock(ctx); !errors.Is(err, mutex.ErrNotHeld) || !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("RUnlock after the loss = %v, want ErrNotHeld wrapping ErrLost", err)
	}
	if err := r.RLock(ctx); err != nil {
		t.Fatalf("RLock after RUnlock = %v, want a new hold", err)
	}
	r.RUnlock(ctx)
}

// TestRWReplicaAcksWithoutReplica: with ReplicaAcks and no replica to
// confirm, write and read acquisitions are refused and given back.
func TestRWReplicaAcksWithoutReplica(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, redistest.Client(t, redistest.Single(t).Addr()), mutex.Options{ReplicaAcks: 1, ReplicaTimeout: 20 * time.Millisecond})
	rw := newRW(t, l, "rw-noreplica")
	for _, acquire := range []func(context.Context) error{rw.TryLock, rw.TryRLock, rw.Lock, rw.RLock} {
		if err := acquire(ctx); !errors.Is(err, mutex.ErrNotReplicated) {
			t.Fatalf("acquisition = %v, want ErrNotReplicated", err)
		}
	}
	info, err := rw.Info(ctx)
	if w, r := rw.Holds(); err != nil || info.Writer != "" || info.Readers != 0 || w+r != 0 {
		t.Fatalf("after refused acquisitions: Info %+v, %v, Holds %d, %d; want free", info, err, w, r)
	}
}

// TestRWOrphanGivenBack: the client declares its holds lost (a fixed lease
// of a second ran out) while the server, stretched by hand, still keeps
// them. The first release after the loss reports ErrNotHeld and gives back
// what the server kept; a new write acquisition gets a greater token.
func TestRWOrphanGivenBack(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{})
	w := newRW(t, l, "rw-orphan-w", mutex.WithLease(time.Second))
	r := newRW(t, l, "rw-orphan-r", mutex.WithLease(time.Second))
	if err := w.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	old := w.Token()
	if err := r.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	// Stretch both holds on the server far past the client's lease.
	far := strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)
	if _, err := srv.Do("HSET", rwKey("rw-orphan-w", "h"), "e", far); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("PEXPIRE", rwKey("rw-orphan-w", "h"), "60000"); err != nil {
		t.Fatal(err)
	}
	members, err := srv.Do("ZRANGE", rwKey("rw-orphan-r", "z"), "0", "-1")
	if err != nil || members == "" || strings.Contains(members, "\n") {
		t.Fatalf("readers = %q, %v; want one", members, err)
	}
	if _, err := srv.Do("ZADD", rwKey("rw-orphan-r", "z"), far, members); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Do("PEXPIRE", rwKey("rw-orphan-r", "z"), "60000"); err != nil {
		t.Fatal(err)
	}
	for _, rw := range []*mutex.RWMutex{w, r} {
		select {
		case <-rw.Lost():
		case <-time.After(signal):
			t.Fatalf("%s: the fixed lease did not end on the client", rw.Name())
		}
	}
	if err := w.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) || !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("Unlock after loss = %v, want ErrNotHeld wrapping ErrLost", err)
	}
	if err := r.RUnlock(ctx); !errors.Is(err, mutex.ErrNotHeld) || !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("RUnlock after loss = %v, want ErrNotHeld wrapping ErrLost", err)
	}
	if info, _ := w.Info(ctx); info.Writer != "" {
		t.Fatalf("Info = %+v, want the orphaned write hold released", info)
	}
	if info, _ := r.Info(ctx); info.Readers != 0 {
		t.Fatalf("Info = %+v, want the orphaned read hold released", info)
	}
	if err := w.TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	if w.Token() <= old {
		t.Fatalf("token after the loss = %d, want greater than the lost hold's %d", w.Token(), old)
	}
	w.Unlock(ctx)
	other := newRW(t, l, "rw-orphan-r")
	if err := other.TryLock(ctx); err != nil {
		t.Fatalf("writer where the orphaned reader was = %v", err)
	}
	other.Unlock(ctx)
}

// TestRWCloseDuringLock: the Locker is closed while an outermost Lock is in
// flight; Lock must report ErrClosed and give the grant back.
func TestRWCloseDuringLock(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	client := redistest.Client(t, srv.Addr())
	l := newLocker(t, client, mutex.Options{})
	rw := newRW(t, l, "rw-close-during")
	if err := rw.TryLock(ctx); err != nil { // open the connection first
		t.Fatal(err)
	}
	rw.Unlock(ctx)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- rw.Lock(ctx) }()
	time.Sleep(50 * time.Millisecond) // the Lock is in flight: the scenario
	l.Close()
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, mutex.ErrClosed) {
		t.Fatalf("Lock during Close = %v, want ErrClosed", err)
	}
	other := newRW(t, newLocker(t, client, mutex.Options{}), "rw-close-during")
	if info, err := other.Info(ctx); err != nil || info.Writer != "" {
		t.Fatalf("Info = %+v, %v; want the grant given back", info, err)
	}
}

// TestRWHoldLostDuringNestedLock: a nested Lock is in flight (held up by
// the network) when the client declares the write hold lost; it must
// report the loss, not revive the hold, and nothing may stay held.
func TestRWHoldLostDuringNestedLock(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	proxy, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	l := newLocker(t, redistest.Client(t, proxy.Addr()), mutex.Options{})
	rw := newRW(t, l, "rw-nested-lost", mutex.WithLease(300*time.Millisecond))
	if err := rw.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lost := rw.Lost()
	proxy.Blackhole(true)
	got := make(chan error, 1)
	go func() { got <- rw.Lock(ctx) }()
	select {
	case <-lost:
	case <-time.After(signal):
		t.Fatal("the fixed lease did not end on the client")
	}
	proxy.Blackhole(false)
	if err := <-got; !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("nested Lock whose hold was lost during the call = %v, want ErrLost", err)
	}
	if w, r := rw.Holds(); w+r != 0 || rw.Token() != 0 {
		t.Fatalf("Holds() = %d, %d, Token() = %d after the loss; want none", w, r, rw.Token())
	}
	if err := rw.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Fatalf("Unlock after the loss = %v, want ErrNotHeld", err)
	}
	if info, err := rw.Info(ctx); err != nil || info.Writer != "" {
		t.Fatalf("Info = %+v, %v; want nothing left held", info, err)
	}
}
