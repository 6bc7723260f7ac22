package mutex_test

// Regression tests for suspicions of issue 22 about the fair queue, the
// writer-waiting mark and the release path. The script calls are seen (and
// held back, or their replies lost) through hookClient, so every step is
// ordered by a signal, not by timing.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// errReplyLost is the error hookClient returns for a call whose reply it
// drops after the call ran: as a broken connection, the caller cannot tell
// whether the call took effect.
var errReplyLost = errors.New("test: connection lost before the reply")

// hookClient is a scriptcache.Client that shows a test every script call
// with keys before it is sent (hook may block it, and may ask for its reply
// to be lost: the call runs, and the caller gets errReplyLost) and after
// its reply came (done), with the caller's context.
type hookClient struct {
	scriptcache.Client

	mu   sync.Mutex
	hook func(ctx context.Context, keys, args []string) (lose bool)
	done func(ctx context.Context, keys, args []string)
}

func (h *hookClient) set(hook func(ctx context.Context, keys, args []string) bool, done func(ctx context.Context, keys, args []string)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hook, h.done = hook, done
}

func (h *hookClient) Eval(ctx context.Context, sha, body string, keys, args []string) scriptcache.Reply {
	h.mu.Lock()
	hook, done := h.hook, h.done
	h.mu.Unlock()
	if len(keys) == 0 || hook == nil {
		return h.Client.Eval(ctx, sha, body, keys, args)
	}
	lose := hook(ctx, keys, args)
	r := h.Client.Eval(ctx, sha, body, keys, args)
	if done != nil {
		done(ctx, keys, args)
	}
	if lose {
		return scriptcache.ErrorReply(errReplyLost)
	}
	return r
}

// hookedLocker returns a Locker whose script calls go through a
// hookClient, and that client; its subscriptions are not hooked.
func hookedLocker(t *testing.T, addr string, opts mutex.Options) (*mutex.Locker, *hookClient) {
	t.Helper()
	hc := &hookClient{}
	l := wrappedLocker(t, []string{addr}, opts, func(c scriptcache.Client) scriptcache.Client {
		hc.Client = c
		return hc
	})
	return l, hc
}

// isUnlockOf reports whether a script call is mutex_release's Unlock mode
// sent by owner.
func isUnlockOf(owner string, keys, args []string) bool {
	return (len(keys) == 5 || len(keys) == 2) && len(args) >= 4 && (args[0] == "u" || args[0] == "U") && args[2] == owner
}

// TestFairUnlockRetryAfterTwoHandOffs (issue 22, suspected, confirmed): a
// fair holder's final Unlock ran but its reply was lost; before the retry,
// the release's hand-off went on to a second waiter. The hash remembered
// only the last earlier owner (r), so the retry was told -1 and Unlock
// reported a loss that never happened. Now the record keeps the run of
// acquisitions that ended by their owner's Unlock (c), and the retry is
// told its first try released the lock. A hold ended otherwise (here a
// ForceUnlock) is still reported lost, however many hand-offs follow.
func TestFairUnlockRetryAfterTwoHandOffs(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	// A long watchdog lease: no renewal runs during the test (one that
	// found the hold handed on would declare the loss itself).
	opts := mutex.Options{Fair: true, WatchdogLease: 5 * time.Minute}
	l, hc := hookedLocker(t, srv.Addr(), opts)
	waiters := newLocker(t, client, opts)

	for _, forced := range []bool{false, true} {
		name := "retry-handoffs-" + map[bool]string{false: "unlock", true: "forced"}[forced]
		a := newMutex(t, l, name)
		b, c := newMutex(t, waiters, name), newMutex(t, waiters, name)
		if err := a.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		bGot, cGot := make(chan error, 1), make(chan error, 1)
		go func() { bGot <- b.Lock(ctx) }()
		waitQueued(t, client, name, 1)
		go func() { cGot <- c.Lock(ctx) }()
		waitQueued(t, client, name, 2)

		if forced {
			// The hold ends without a's Unlock; the release hands it to b.
			if ok, err := b.ForceUnlock(ctx); err != nil || !ok {
				t.Fatalf("ForceUnlock = %v, %v", ok, err)
			}
		} else {
			var once sync.Once
			hc.set(func(_ context.Context, keys, args []string) bool {
				lose := false
				if isUnlockOf(a.Owner(), keys, args) {
					once.Do(func() { lose = true })
				}
				return lose
			}, nil)
			if err := a.Unlock(ctx); !errors.Is(err, errReplyLost) {
				t.Fatalf("Unlock whose reply is lost = %v, want the connection error", err)
			}
			hc.set(nil, nil)
			if a.Holds() != 1 {
				t.Fatalf("Holds after a failed Unlock = %d, want 1 (still counted)", a.Holds())
			}
		}
		// Two hand-offs: a's release to b, b's to c.
		if err := <-bGot; err != nil {
			t.Fatal(err)
		}
		if err := b.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-cGot; err != nil {
			t.Fatal(err)
		}

		err := a.Unlock(ctx)
		if forced {
			if !errors.Is(err, mutex.ErrNotHeld) || !errors.Is(a.Err(), mutex.ErrLost) {
				t.Errorf("Unlock of a forced hold = %v (Err %v), want ErrNotHeld and the loss", err, a.Err())
			}
		} else if err != nil || a.Err() != nil || a.Holds() != 0 {
			t.Errorf("retried Unlock = %v (Err %v, Holds %d), want nil: its first try released the lock", err, a.Err(), a.Holds())
		}
		if info, err := c.Info(ctx); err != nil || info.Owner != c.Owner() {
			t.Fatalf("Info = %+v, %v; want c holding", info, err)
		}
		if err := c.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCloseLeavesFairQueue (issue 22, suspected, confirmed): a fair Lock
// whose Locker is closed while its attempt is in flight gets the reply
// (queued) after Close returned. Its give-back went through the Locker's
// background group, which Close had closed, so it was dropped: the entry
// stayed for a lease, and the holder's release handed the lock to it, held
// by nobody until that lease ended. Now a fair Lock leaves the queue before
// it returns, whenever Close ran. The second part closes the Locker while
// the Lock waits in the queue (the waiter's give-back then races the
// group's Close; either order must leave the queue).
func TestCloseLeavesFairQueue(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	holders := newLocker(t, client, mutex.Options{})

	for _, inFlight := range []bool{true, false} {
		name := "close-queued-" + map[bool]string{true: "in-flight", false: "waiting"}[inFlight]
		holder := newMutex(t, holders, name)
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		l, hc := hookedLocker(t, srv.Addr(), mutex.Options{Fair: true})
		w := newMutex(t, l, name)
		held, gate := make(chan struct{}), make(chan struct{})
		if inFlight {
			var once sync.Once
			hc.set(func(_ context.Context, keys, args []string) bool {
				if owner, mode, ok := mutexLockCall(keys, args); ok && owner == w.Owner() && mode == "f" {
					once.Do(func() {
						close(held)
						<-gate
					})
				}
				return false
			}, nil)
		}
		got := make(chan error, 1)
		go func() { got <- w.Lock(ctx) }()
		if inFlight {
			<-held // the attempt is past the closed check, not yet sent
			l.Close()
			close(gate)
		} else {
			waitQueued(t, client, name, 1)
			l.Close()
		}
		if err := <-got; !errors.Is(err, mutex.ErrClosed) {
			t.Fatalf("%s: Lock = %v, want ErrClosed", name, err)
		}
		if q := queueIDs(t, client, name); len(q) != 0 {
			t.Errorf("%s: queue %q after the Lock returned, want empty", name, q)
		}
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if info, err := holder.Info(ctx); err != nil || info.Held {
			t.Errorf("%s: Info after the holder's release = %+v, %v; want free, not handed to the closed Locker's Lock", name, info, err)
		}
	}
}

// writerOf tells the goroutines of one RWMutex value apart in hookClient
// hooks: each Lock runs with its own value under this key.
type writerOf struct{}

// isMarkingLock reports whether a script call is an rwmutex_lock attempt of
// owner that leaves a writer-waiting mark if refused.
func isMarkingLock(owner string, args []string) bool {
	return len(args) >= 6 && args[0] == owner && args[5] != "0" && args[5] != "f" && args[5] != "t" && args[5] != ""
}

// isWithdrawal reports whether a script call is rwmutex_abandon's
// withdrawal of a writer-waiting mark sent by owner.
func isWithdrawal(owner string, args []string) bool {
	return len(args) >= 6 && args[0] == owner && args[2] == "m"
}

// TestRWMarkKeptForOtherWaitingWriter (issue 22, suspected, confirmed): two
// goroutines of one RWMutex value wait for the write lock behind a reader.
// The writer-waiting mark was keyed by the value's nonce, so when the first
// gives up, its withdrawal cleared the mark the second still relied on, and
// new readers got in until the second's next attempt (a grant of one
// writer cleared it the same way). Now each Lock call has its own mark and
// the lock's mark runs while any of them does.
//
// The second writer's attempts after its first are held back, so that only
// the mark it already left can keep readers out; the marks last a minute,
// so that none ends by itself during the test.
func TestRWMarkKeptForOtherWaitingWriter(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	name := "rw-mark-shared"
	l := newLocker(t, client, mutex.Options{})
	r, r2 := newRW(t, l, name), newRW(t, l, name)
	if err := r.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	lh, hc := hookedLocker(t, srv.Addr(), mutex.Options{})
	w := newRW(t, lh, name)
	mutex.SetWriterMark(w, time.Minute)

	var mu sync.Mutex
	marked := map[string]bool{}
	holdG2, g2InFlight := false, 0
	gate := make(chan struct{})
	withdrawn := make(chan struct{}, 4)
	hc.set(func(ctx context.Context, keys, args []string) bool {
		if isMarkingLock(w.Owner(), args) && ctx.Value(writerOf{}) == "G2" {
			mu.Lock()
			hold := holdG2
			if !hold {
				g2InFlight++
			}
			mu.Unlock()
			if hold {
				<-gate
				mu.Lock()
				g2InFlight++
				mu.Unlock()
			}
		}
		return false
	}, func(ctx context.Context, keys, args []string) {
		mu.Lock()
		defer mu.Unlock()
		if isMarkingLock(w.Owner(), args) {
			who, _ := ctx.Value(writerOf{}).(string)
			marked[who] = true
			if who == "G2" {
				g2InFlight--
			}
		}
		if isWithdrawal(w.Owner(), args) {
			withdrawn <- struct{}{}
		}
	})
	t.Cleanup(func() {
		mu.Lock()
		if holdG2 {
			close(gate)
			holdG2 = false
		}
		mu.Unlock()
	})

	ctx1, cancel1 := context.WithCancel(context.WithValue(ctx, writerOf{}, "G1"))
	defer cancel1()
	ctx2 := context.WithValue(ctx, writerOf{}, "G2")
	got1, got2 := make(chan error, 1), make(chan error, 1)
	go func() { got1 <- w.Lock(ctx1) }()
	go func() { got2 <- w.Lock(ctx2) }()
	if !redistest.WaitFor(ctx, signal, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return marked["G1"] && marked["G2"]
	}) {
		t.Fatal("the two writers did not both try and wait")
	}
	// From now on G2 sends nothing more; wait for an attempt of it that
	// was already on its way.
	mu.Lock()
	holdG2 = true
	mu.Unlock()
	if !redistest.WaitFor(ctx, signal, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return g2InFlight == 0
	}) {
		t.Fatal("G2's attempt did not return")
	}

	cancel1()
	if err := <-got1; !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("G1's Lock = %v, want ErrNotObtained", err)
	}
	select {
	case <-withdrawn:
	case <-time.After(signal):
		t.Fatal("G1 did not withdraw its mark")
	}
	if info, err := r.Info(ctx); err != nil || info.WriterWaiting == 0 {
		t.Errorf("Info = %+v, %v after G1 gave up; want the mark G2 left still running", info, err)
	}
	if err := r2.TryRLock(ctx); err == nil {
		r2.RUnlock(ctx)
		t.Errorf("a new reader got in while G2 waits for the write lock")
	} else if !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatal(err)
	}

	mu.Lock()
	close(gate)
	holdG2 = false
	mu.Unlock()
	if err := r.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got2; err != nil {
		t.Fatalf("G2's Lock = %v", err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := r.Info(ctx); err != nil || info.WriterWaiting != 0 {
		t.Errorf("Info = %+v, %v after G2's grant; want no mark left", info, err)
	}
}

// TestRWLostRefusalWithdrawsMark (issue 22, suspected, confirmed): a Lock's
// first attempt is refused (a reader holds) and leaves its mark, but the
// reply is lost, so Lock fails. It withdrew its mark only when a later
// attempt failed, never the first, so new readers were refused for the
// whole mark (here a minute; 2 s by default). Now a failed Lock withdraws
// its mark whichever attempt failed.
func TestRWLostRefusalWithdrawsMark(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	client := redistest.Client(t, srv.Addr())
	name := "rw-mark-lost"
	l := newLocker(t, client, mutex.Options{})
	r, r2 := newRW(t, l, name), newRW(t, l, name)
	if err := r.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	lh, hc := hookedLocker(t, srv.Addr(), mutex.Options{})
	w := newRW(t, lh, name)
	mutex.SetWriterMark(w, time.Minute)
	withdrawn := make(chan struct{}, 4)
	hc.set(func(_ context.Context, keys, args []string) bool {
		return isMarkingLock(w.Owner(), args)
	}, func(_ context.Context, keys, args []string) {
		if isWithdrawal(w.Owner(), args) {
			withdrawn <- struct{}{}
		}
	})
	if err := w.Lock(ctx); !errors.Is(err, errReplyLost) {
		t.Fatalf("Lock whose refusal's reply is lost = %v, want the connection error", err)
	}
	select {
	case <-withdrawn:
	case <-time.After(signal):
		t.Fatal("the failed Lock did not withdraw its mark")
	}
	if info, err := r.Info(ctx); err != nil || info.WriterWaiting != 0 {
		t.Errorf("Info = %+v, %v after the Lock failed; want no writer-waiting mark", info, err)
	}
	if err := r2.TryRLock(ctx); err != nil {
		t.Errorf("new reader after the writer's Lock failed = %v, want it in", err)
	} else {
		r2.RUnlock(ctx)
	}
	r.RUnlock(ctx)
}
