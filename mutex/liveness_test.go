package mutex_test

// Regression tests of issue 31: every release or lease change that can end
// a wait wakes whoever waits, or the waiter's timer already covers it. The
// holders have a fixed lease of a minute, far longer than the tests'
// bounds: a waiter that missed its wake-up sleeps until then, and fails.
//
// The waiters' Lockers run their script calls through a spyClient, so that
// a test knows when a waiter sleeps (its last attempt was refused after its
// subscription was confirmed) instead of guessing with a sleep, and can cut
// a process off or lose a reply at a chosen call.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// holderLease is the fixed lease of the holders a waiter must not sleep
// through.
const holderLease = time.Minute

// spyAction is what spyClient does with a script call.
type spyAction int

const (
	spyPass spyAction = iota
	spyCut            // not sent: it fails as through a broken connection
	spyLose           // sent, and it runs, but its reply is lost
)

// errCutOff is the error of a call a spyClient cut off or whose reply it
// lost: the caller cannot tell whether it ran.
var errCutOff = errors.New("test: connection cut off")

// spyClient is a scriptcache.Client that tells a test which waiters sleep,
// lets it cut calls off or lose their replies (before decides, and may run
// the test's own steps first; after runs once a call sent has run, before
// its caller hears), and can drop the pub/sub messages it receives (mute).
type spyClient struct {
	scriptcache.Client

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced when asleep changes
	before   func(keys, args []string) spyAction
	after    func(keys, args []string)
	mute     bool
	confirms int // subscriptions confirmed so far
	// asleep[owner]: owner's last lock attempt (Mutex Lock, RWMutex Lock
	// or RLock) was refused, and it was sent after a subscription of this
	// client was confirmed: a waiting Lock then sleeps until a wake-up or
	// the timer the refusal gave it. (Each test's spied Locker subscribes
	// to one channel only, so the first confirmation is that of the
	// waiter's own channel.)
	asleep map[string]bool
}

// wrappedLocker returns a Locker on a client for addrs that wrap wraps.
func wrappedLocker(t *testing.T, addrs []string, opts mutex.Options, wrap func(scriptcache.Client) scriptcache.Client) *mutex.Locker {
	t.Helper()
	ctx := context.Background()
	sc0, err := scriptcache.New(ctx, redistest.Client(t, addrs...))
	if err != nil {
		t.Fatal(err)
	}
	sc, err := scriptcache.NewFrom(ctx, wrap(sc0.Client()))
	if err != nil {
		t.Fatal(err)
	}
	l, err := mutex.NewLocker(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// spiedLocker returns a Locker whose script calls and subscriptions go
// through a spyClient, and that client.
func spiedLocker(t *testing.T, addrs []string, opts mutex.Options) (*mutex.Locker, *spyClient) {
	t.Helper()
	spy := &spyClient{changed: make(chan struct{}), asleep: map[string]bool{}}
	l := wrappedLocker(t, addrs, opts, func(c scriptcache.Client) scriptcache.Client {
		spy.Client = c
		return spy
	})
	return l, spy
}

// spiedRW returns an RWMutex of name in a spied Locker of its own.
func spiedRW(t *testing.T, addrs []string, name string, opts ...mutex.LockOption) (*mutex.RWMutex, *spyClient) {
	t.Helper()
	l, spy := spiedLocker(t, addrs, mutex.Options{})
	return newRW(t, l, name, opts...), spy
}

// lockCallOwner returns the owner of a lock attempt (mutex_lock, or
// rwmutex_rlock and rwmutex_lock: four keys, 5 and 7 arguments), or false
// for another call.
func lockCallOwner(keys, args []string) (string, bool) {
	if owner, _, ok := mutexLockCall(keys, args); ok {
		return owner, true
	}
	if len(keys) == 4 && (len(args) == 5 || len(args) == 7) && strings.HasSuffix(keys[1], ":rw.z") {
		return args[0], true
	}
	return "", false
}

// mutexLockCall reports whether a script call is mutex_lock (3 or 4 keys,
// the second the tombstones), and returns its owner and its mode (ARGV[4];
// "" if there is none).
func mutexLockCall(keys, args []string) (owner, mode string, ok bool) {
	if len(keys) < 3 || len(keys) > 4 || !strings.HasSuffix(keys[1], ":x") || len(args) < 3 {
		return "", "", false
	}
	if len(args) > 3 {
		mode = args[3]
	}
	return args[1], mode, true
}

func (s *spyClient) set(before func(keys, args []string) spyAction, after func(keys, args []string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.before, s.after = before, after
}

// cutOff makes every later call fail unsent: the process is cut off.
func (s *spyClient) cutOff() {
	s.set(func([]string, []string) spyAction { return spyCut }, nil)
}

func (s *spyClient) setMute(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mute = on
}

func (s *spyClient) Eval(ctx context.Context, sha, body string, keys, args []string) scriptcache.Reply {
	s.mu.Lock()
	before, after, confirmed := s.before, s.after, s.confirms > 0
	s.mu.Unlock()
	act := spyPass
	if before != nil {
		act = before(keys, args)
	}
	if act == spyCut {
		return scriptcache.ErrorReply(errCutOff)
	}
	r := s.Client.Eval(ctx, sha, body, keys, args)
	if after != nil {
		after(keys, args)
	}
	if owner, ok := lockCallOwner(keys, args); ok {
		refused := false
		if v, err := r.AsInt64(); err == nil {
			refused = v < 0 // mutex_lock's refusal (the others answer tables)
		} else if a, err := r.ToArray(); err == nil && a.Len() == 3 {
			got, _ := a.At(0).AsInt64()
			refused = got == 0
		}
		s.mu.Lock()
		s.asleep[owner] = refused && confirmed && act == spyPass
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
	}
	if act == spyLose {
		return scriptcache.ErrorReply(errCutOff)
	}
	return r
}

func (s *spyClient) Subscribe(ctx context.Context, channel string, sharded bool, subscribed func(), message func(payload string)) error {
	return s.Client.Subscribe(ctx, channel, sharded, func() {
		s.mu.Lock()
		s.confirms++
		s.mu.Unlock()
		subscribed()
	}, func(payload string) {
		s.mu.Lock()
		mute := s.mute
		s.mu.Unlock()
		if !mute {
			message(payload)
		}
	})
}

// waitAsleep waits until owner's waiting Lock or RLock sleeps (see
// spyClient.asleep).
func (s *spyClient) waitAsleep(t *testing.T, owner string) {
	t.Helper()
	deadline := time.After(signal)
	for {
		s.mu.Lock()
		ok, changed := s.asleep[owner], s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%s's Lock never slept on a refusal", owner)
		}
	}
}

// result runs f in a goroutine and returns the channel of its error.
func result(f func() error) <-chan error {
	c := make(chan error, 1)
	go func() { c <- f() }()
	return c
}

// within returns the error from c, or fails t if none comes within d.
func within(t *testing.T, c <-chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-c:
		return err
	case <-time.After(d):
		t.Fatalf("%s: still waiting after %v", what, d)
		return nil
	}
}

// lockThenUnlock returns a func that locks m within ctx and unlocks it.
func lockThenUnlock(ctx context.Context, m *mutex.Mutex) func() error {
	return func() error {
		if err := m.Lock(ctx); err != nil {
			return err
		}
		return m.Unlock(context.Background())
	}
}

// TestExtendShorterWakesWaiter (issue 31 item 2): a waiter refused by a
// holder with a lease of a minute sleeps on a timer of that minute. The
// holder shortens its lease with Extend and never unlocks, so the lock's
// hash expires, and with it the mark (w) that makes a release publish; a
// third owner then locks and unlocks the new hash without a word to the
// waiter, which slept on for the rest of the minute. Now an Extend that
// shortens the lease of a lock a Lock was refused wakes the waiters, and
// their next refusal gives them a timer of the new lease.
func TestExtendShorterWakesWaiter(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			ctx := context.Background()
			addrs := tg.addrs(t)
			name := "extend-wake:" + t.Name()
			others := newLocker(t, redistest.Client(t, addrs...), mutex.Options{Lease: holderLease})
			waiters, spy := spiedLocker(t, addrs, mutex.Options{Lease: holderLease})
			a, b, c := newMutex(t, others, name), newMutex(t, waiters, name), newMutex(t, others, name)
			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, holderLease)
			defer cancel()
			bGot := result(lockThenUnlock(wctx, b))
			spy.waitAsleep(t, b.Owner())
			if _, err := a.Extend(ctx, 300*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			waitRedis(t, "A's shortened hold to end", func() bool {
				in, err := c.Info(ctx)
				return err == nil && in.Owner != a.Owner()
			})
			if err := lockThenUnlock(wctx, c)(); err != nil {
				t.Fatal(err)
			}
			if err := within(t, bGot, signal, "the waiter's Lock, after the holder's shortened lease ran out"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// briefFirst sets spy up so that the first lock attempt of its Locker
// after the lock is free finds brief (a Mutex with a short lease, which
// never unlocks) holding it: brief takes the lock just before the attempt
// is sent. then, if not nil, runs with the owner of that attempt once it
// ran. It returns that owner, "" until then.
func briefFirst(spy *spyClient, brief *mutex.Mutex, then func(owner string)) func() string {
	var mu sync.Mutex
	first := ""
	spy.set(func(keys, args []string) spyAction {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := lockCallOwner(keys, args); ok && first == "" && brief.TryLock(context.Background()) == nil {
			first = args[0]
		}
		return spyPass
	}, func(keys, args []string) {
		mu.Lock()
		owner := first
		mu.Unlock()
		if got, ok := lockCallOwner(keys, args); ok && got == owner && then != nil {
			then(owner)
		}
	})
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return first
	}
}

// TestWaitingGrantPassesWakeOn (issue 31, a sibling of item 2): two Locks
// of one process wait on a holder with a lease of a minute; its release
// wakes one of them, but an owner with a short lease gets in first and
// never unlocks. The woken Lock's timer covers that short lease; the other
// one's is the first holder's minute. When the short hold's hash expired,
// the woken Lock took the lock on a new hash, which no refused Lock had
// marked (w), so its Unlock published nothing and the other Lock slept on
// for the rest of the minute. Now a Lock that waited marks the record it
// takes, so its release passes the wake-up on.
func TestWaitingGrantPassesWakeOn(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			ctx := context.Background()
			addrs := tg.addrs(t)
			name := "wake-chain:" + t.Name()
			others := newLocker(t, redistest.Client(t, addrs...), mutex.Options{Lease: holderLease})
			waiters, spy := spiedLocker(t, addrs, mutex.Options{Lease: holderLease})
			a := newMutex(t, others, name)
			brief := newMutex(t, others, name, mutex.WithLease(500*time.Millisecond))
			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, holderLease)
			defer cancel()
			var got []<-chan error
			for range 2 {
				b := newMutex(t, waiters, name)
				got = append(got, result(lockThenUnlock(wctx, b)))
				spy.waitAsleep(t, b.Owner())
			}
			first := briefFirst(spy, brief, nil)
			if err := a.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if err := within(t, got[i], signal, "a waiter's Lock"); err != nil {
					t.Fatalf("waiter %d: %v", i+1, err)
				}
			}
			if first() == "" {
				t.Fatal("the brief holder never got in before a woken waiter")
			}
		})
	}
}

// TestWokenWaiterLeavingPassesWakeOn (issue 31, a sibling of item 2): as
// TestWaitingGrantPassesWakeOn, but the woken Lock, refused by the brief
// holder, gives up. Its timer was the only one of its process that covered
// the short hold; the other Lock's is the first holder's minute, and when
// the short hold's hash expired the lock stayed free while it slept. Now an
// unfair Lock that gives up after it was woken passes a wake-up on to the
// next local waiter.
func TestWokenWaiterLeavingPassesWakeOn(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			ctx := context.Background()
			addrs := tg.addrs(t)
			name := "wake-leave:" + t.Name()
			others := newLocker(t, redistest.Client(t, addrs...), mutex.Options{Lease: holderLease})
			waiters, spy := spiedLocker(t, addrs, mutex.Options{Lease: holderLease})
			a := newMutex(t, others, name)
			brief := newMutex(t, others, name, mutex.WithLease(500*time.Millisecond))
			if err := a.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			var b []*mutex.Mutex
			var got []<-chan error
			cancels := map[string]context.CancelFunc{}
			for range 2 {
				m := newMutex(t, waiters, name)
				wctx, cancel := context.WithTimeout(ctx, holderLease)
				defer cancel()
				cancels[m.Owner()] = cancel
				b, got = append(b, m), append(got, result(lockThenUnlock(wctx, m)))
				spy.waitAsleep(t, m.Owner())
			}
			// The woken waiter's Lock gives up once the brief holder refused
			// it.
			first := briefFirst(spy, brief, func(owner string) { cancels[owner]() })
			if err := a.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			for i, m := range b {
				err := within(t, got[i], signal, "a waiter's Lock")
				if gaveUp := m.Owner() == first(); gaveUp != (err != nil) {
					t.Fatalf("waiter %d (gave up: %v): %v", i+1, gaveUp, err)
				}
			}
		})
	}
}

// rwProbe returns an RWMutex of name, in a Locker of its own, to read the
// lock's state with.
func rwProbe(t *testing.T, addrs []string, name string) *mutex.RWMutex {
	t.Helper()
	return newRW(t, newLocker(t, redistest.Client(t, addrs...), mutex.Options{}), name)
}

// waitMark waits until the writer-waiting mark of probe's lock has more
// than d left.
func waitMark(t *testing.T, probe *mutex.RWMutex, d time.Duration) {
	t.Helper()
	waitRedis(t, "a writer-waiting mark", func() bool {
		in, err := probe.Info(context.Background())
		return err == nil && in.WriterWaiting > d
	})
}

// sleepingReader starts an RLock (within ctx) and RUnlock of r, whose
// Locker spy watches, and returns once the RLock sleeps.
func sleepingReader(ctx context.Context, t *testing.T, r *mutex.RWMutex, spy *spyClient) <-chan error {
	t.Helper()
	got := result(func() error {
		if err := r.RLock(ctx); err != nil {
			return err
		}
		return r.RUnlock(context.Background())
	})
	spy.waitAsleep(t, r.Owner())
	return got
}

// deadWriter starts a Lock (within ctx) of w, whose Locker spy watches,
// and once the lock has a writer-waiting mark, cuts w's process off: the
// mark's withdrawal never arrives.
func deadWriter(ctx context.Context, t *testing.T, probe, w *mutex.RWMutex, spy *spyClient) <-chan error {
	t.Helper()
	got := result(func() error { return w.Lock(ctx) })
	waitMark(t, probe, 0)
	spy.cutOff()
	return got
}

// wantNoLock fails t unless the Lock of the cut-off writer that got
// reports fails.
func wantNoLock(t *testing.T, got <-chan error) {
	t.Helper()
	if err := within(t, got, signal, "the cut-off writer's Lock"); err == nil {
		t.Fatal("the cut-off writer got the lock")
	}
}

// TestRWReaderWokenPastDeadWritersMark (issue 31 item 1): a reader is
// refused while a writer holds with a lease of a minute; a second writer
// is refused, leaves its mark, and is cut off, so its withdrawal never
// arrives. The holder's release (its Unlock, or the give-back of its Lock
// whose reply was lost) came while the mark ran, so only the writers'
// channel heard it, and when the mark ended nothing reached the readers:
// the reader slept on the timer its refusal gave it (the rest of the
// holder's minute). Now a write release always wakes the readers; one
// refused by the mark then sleeps until the mark ends.
func TestRWReaderWokenPastDeadWritersMark(t *testing.T) {
	const mark = 4 * time.Second
	for _, end := range []string{"unlock", "give-back"} {
		for _, tg := range realTargets {
			t.Run(end+"/"+tg.name, func(t *testing.T) {
				ctx := context.Background()
				addrs := tg.addrs(t)
				name := "rw-dead-mark:" + t.Name()
				probe := rwProbe(t, addrs, name)
				w1, w1spy := spiedRW(t, addrs, name, mutex.WithLease(holderLease))
				r, rspy := spiedRW(t, addrs, name)
				w2, w2spy := spiedRW(t, addrs, name)
				mutex.SetWriterMark(w2, mark)
				wctx, cancel := context.WithTimeout(ctx, holderLease)
				defer cancel()
				// While W1 holds, the reader is refused and W2 leaves its
				// mark.
				var rGot, w2Got <-chan error
				whileHeld := func() {
					rGot = sleepingReader(wctx, t, r, rspy)
					w2Got = deadWriter(wctx, t, probe, w2, w2spy)
				}
				if end == "unlock" {
					if err := w1.Lock(ctx); err != nil {
						t.Fatal(err)
					}
					whileHeld()
					if err := w1.Unlock(ctx); err != nil {
						t.Fatal(err)
					}
				} else {
					// W1's Lock is granted, but its reply is lost: the
					// give-back that follows releases the hold.
					isW1 := func(keys, args []string) bool {
						owner, ok := lockCallOwner(keys, args)
						return ok && owner == w1.Owner()
					}
					w1spy.set(func(keys, args []string) spyAction {
						if isW1(keys, args) {
							return spyLose
						}
						return spyPass
					}, func(keys, args []string) {
						if isW1(keys, args) && rGot == nil {
							whileHeld()
						}
					})
					if err := w1.Lock(ctx); !errors.Is(err, errCutOff) {
						t.Fatalf("W1's Lock whose reply is lost = %v, want the connection error", err)
					}
					if rGot == nil {
						t.Fatal("W1's Lock made no attempt")
					}
				}
				if err := within(t, rGot, mark+signal, "the reader's RLock, after the release and the dead writer's mark"); err != nil {
					t.Fatal(err)
				}
				wantNoLock(t, w2Got)
			})
		}
	}
}

// TestRWReaderWokenWhenMarkWithdrawn (issue 31, a sibling of item 1): a
// reader is refused by the mark of a writer waiting with a long mark, while
// another writer, cut off, left a short one. When the first writer gives
// up, its withdrawal brings the mark back to the short one's end, but it
// woke the readers only when no mark was left: the reader slept until the
// withdrawn mark's end. Now a withdrawal that brings the end of the mark
// forward wakes the readers. Without the other writer ("last"), the
// withdrawal ends every mark and must wake the reader at once: a mutant
// of rwmutex_abandon that negated that wake-up's condition (issue 32, run
// 11) left the reader asleep for the rest of the minute's mark, and no
// test gave up the only mark.
func TestRWReaderWokenWhenMarkWithdrawn(t *testing.T) {
	const short = 4 * time.Second
	for _, other := range []string{"forward", "last"} {
		for _, tg := range realTargets {
			t.Run(other+"/"+tg.name, func(t *testing.T) {
				ctx := context.Background()
				addrs := tg.addrs(t)
				name := "rw-withdraw-mark:" + t.Name()
				probe := rwProbe(t, addrs, name)
				direct := newLocker(t, redistest.Client(t, addrs...), mutex.Options{})
				r0, w2 := newRW(t, direct, name), newRW(t, direct, name)
				mutex.SetWriterMark(w2, holderLease)
				r, rspy := spiedRW(t, addrs, name)
				if err := r0.RLock(ctx); err != nil { // keeps the writers waiting
					t.Fatal(err)
				}
				defer r0.RUnlock(ctx)
				wctx, cancel := context.WithTimeout(ctx, holderLease)
				defer cancel()
				var w3Got <-chan error
				wait := signal // for the reader, once the long mark is withdrawn
				if other == "forward" {
					w3, w3spy := spiedRW(t, addrs, name)
					mutex.SetWriterMark(w3, short)
					w3Got = deadWriter(wctx, t, probe, w3, w3spy)
					wait += short
				}
				w2ctx, w2cancel := context.WithCancel(wctx)
				defer w2cancel()
				w2Got := result(func() error { return w2.Lock(w2ctx) })
				waitMark(t, probe, short)
				rGot := sleepingReader(wctx, t, r, rspy)
				w2cancel()
				if err := within(t, w2Got, signal, "the long-mark writer's Lock"); !errors.Is(err, mutex.ErrNotObtained) {
					t.Fatalf("the writer that gave up: %v, want ErrNotObtained", err)
				}
				if err := within(t, rGot, wait, "the reader's RLock, after the withdrawal (and the dead writer's mark)"); err != nil {
					t.Fatal(err)
				}
				if w3Got != nil {
					wantNoLock(t, w3Got)
				}
			})
		}
	}
}
