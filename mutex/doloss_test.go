package mutex_test

// Regression tests for issue 22, items 1 and 2: Do must report a loss its
// own release finds, and a MultiMutex must neither erase a member's loss
// nor leave members held once the set says it holds nothing. All set up by
// key manipulation (ForceUnlock, DEL) on a real server; the default 30 s
// lease means no renewal runs while fn does, so the release is what finds
// the hold gone.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestDoReportsLossFoundAtRelease: inside fn an operator forces the lock
// open and another owner takes it; Do's Unlock then finds the hold gone.
// That loss may date from any time while fn ran, so Do must report it,
// and must leave the new owner's hold alone.
func TestDoReportsLossFoundAtRelease(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, redistest.Client(t, redistest.Single(t).Addr()), mutex.Options{}) // 30 s lease: no renewal during fn

	t.Run("Mutex", func(t *testing.T) {
		name := "doloss:" + t.Name()
		m, other := newMutex(t, l, name), newMutex(t, l, name)
		err := m.Do(ctx, func(context.Context) error {
			if _, err := other.ForceUnlock(ctx); err != nil {
				return err
			}
			return other.TryLock(ctx)
		})
		if !errors.Is(err, mutex.ErrLost) {
			t.Fatalf("Do whose release found the hold gone = %v, want ErrLost", err)
		}
		if info, _ := other.Info(ctx); info.Owner != other.Owner() {
			t.Fatalf("after Do, Info = %+v; want the new owner's hold intact", info)
		}
		if err := other.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
	for _, write := range []bool{true, false} {
		kind := map[bool]string{true: "RWMutex.Do", false: "RWMutex.RDo"}[write]
		t.Run(kind, func(t *testing.T) {
			name := "doloss:" + t.Name()
			rw, other := newRW(t, l, name), newRW(t, l, name)
			do := rw.RDo
			if write {
				do = rw.Do
			}
			err := do(ctx, func(context.Context) error {
				if _, err := other.ForceUnlock(ctx); err != nil {
					return err
				}
				return other.TryLock(ctx)
			})
			if !errors.Is(err, mutex.ErrLost) {
				t.Fatalf("%s whose release found the hold gone = %v, want ErrLost", kind, err)
			}
			if info, _ := other.Info(ctx); info.Writer != other.Owner() {
				t.Fatalf("after %s, Info = %+v; want the new writer intact", kind, info)
			}
			if err := other.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("MultiMutex", func(t *testing.T) {
		p := "doloss:" + t.Name() + ":"
		mm := newMulti(t, l, []string{p + "a", p + "b", p + "c"})
		mid := mm.Names()[1]
		other := newMutex(t, l, mid)
		err := mm.Do(ctx, func(context.Context) error {
			if _, err := other.ForceUnlock(ctx); err != nil {
				return err
			}
			return other.TryLock(ctx)
		})
		if !errors.Is(err, mutex.ErrLost) {
			t.Fatalf("MultiMutex.Do whose release found a member gone = %v, want ErrLost", err)
		}
		if info, _ := other.Info(ctx); info.Owner != other.Owner() {
			t.Fatalf("after Do, Info(%q) = %+v; want the new owner's hold intact", mid, info)
		}
		for _, name := range []string{mm.Names()[0], mm.Names()[2]} {
			if info, _ := newMutex(t, l, name).Info(ctx); info.Held {
				t.Fatalf("after Do, %q still held: %+v", name, info)
			}
		}
		if mm.Holds() != 0 {
			t.Fatalf("Holds after Do = %d, want 0", mm.Holds())
		}
		if err := other.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// lostMember locks a set of three, deletes the middle member's key and
// waits until the set is told. It returns the set and the names of the
// members that remain held.
func lostMember(t *testing.T, l *mutex.Locker, srv *redistest.Server, nested int) (*mutex.MultiMutex, []string) {
	t.Helper()
	ctx := context.Background()
	p := "mmloss:" + t.Name() + ":"
	mm := newMulti(t, l, []string{p + "a", p + "b", p + "c"})
	for range nested {
		if err := mm.Lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lost := mm.Lost()
	names := mm.Names()
	if _, err := srv.Do("DEL", lockKey(names[1])); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lost:
	case <-time.After(signal):
		t.Fatal("the set was not told that a member was lost")
	}
	return mm, []string{names[0], names[2]}
}

// heldBy reports which of names Redis says mm's owner holds.
func heldBy(t *testing.T, l *mutex.Locker, mm *mutex.MultiMutex, names []string) []string {
	t.Helper()
	var out []string
	for _, name := range names {
		info, err := newMutex(t, l, name).Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.Owner == mm.Owner() {
			out = append(out, name)
		}
	}
	return out
}

// TestMultiLossNotErased: a set whose member was lost is lost as a set.
// A nested Lock returns the loss and starts nothing (the lost member is
// not taken afresh, so Err and Lost keep the loss), and one Unlock gives
// back what the other members still hold, whatever the nesting.
func TestMultiLossNotErased(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{WatchdogLease: 600 * time.Millisecond})

	t.Run("nested Lock returns the loss", func(t *testing.T) {
		mm, rest := lostMember(t, l, srv, 1)
		for _, lock := range []func(context.Context) error{mm.Lock, mm.TryLock} {
			if err := lock(ctx); !errors.Is(err, mutex.ErrLost) {
				t.Fatalf("Lock of a set with a lost member = %v, want ErrLost", err)
			}
		}
		if !errors.Is(mm.Err(), mutex.ErrLost) {
			t.Fatalf("Err() after the nested Lock = %v, want the loss kept", mm.Err())
		}
		select {
		case <-mm.Lost():
		default:
			t.Fatal("Lost() open again after the nested Lock: the loss was erased")
		}
		if mm.Holds() != 0 {
			t.Fatalf("Holds() of a lost set = %d, want 0", mm.Holds())
		}
		if got := heldBy(t, l, mm, mm.Names()); len(got) != len(rest) {
			t.Fatalf("the set holds %v in Redis, want only the members not lost %v", got, rest)
		}
		err := mm.Unlock(ctx)
		if !errors.Is(err, mutex.ErrNotHeld) || !errors.Is(err, mutex.ErrLost) {
			t.Fatalf("Unlock of a lost set = %v, want ErrNotHeld and ErrLost", err)
		}
		if got := heldBy(t, l, mm, mm.Names()); len(got) != 0 {
			t.Fatalf("after Unlock, the set still holds %v in Redis", got)
		}
		// Released: the set can be locked afresh.
		if err := mm.Lock(ctx); err != nil {
			t.Fatalf("Lock after the lost set's Unlock = %v", err)
		}
		if mm.Err() != nil || mm.Holds() != 1 {
			t.Fatalf("fresh hold: Err %v, Holds %d; want nil, 1", mm.Err(), mm.Holds())
		}
		if err := mm.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("Lock then one Unlock leaves nothing held", func(t *testing.T) {
		mm, _ := lostMember(t, l, srv, 1)
		mm.Lock(ctx) // the loss (checked above); before the fix, nil
		mm.Unlock(ctx)
		if mm.Holds() != 0 {
			t.Fatalf("Holds() = %d, want 0", mm.Holds())
		}
		if got := heldBy(t, l, mm, mm.Names()); len(got) != 0 {
			t.Fatalf("Holds() is 0 but the set still holds %v in Redis (renewed by the watchdog)", got)
		}
	})
	t.Run("nested holds all given back", func(t *testing.T) {
		mm, _ := lostMember(t, l, srv, 2)
		err := mm.Unlock(ctx)
		if !errors.Is(err, mutex.ErrLost) {
			t.Fatalf("Unlock of a lost set = %v, want ErrLost", err)
		}
		if got := heldBy(t, l, mm, mm.Names()); len(got) != 0 {
			t.Fatalf("after one Unlock of a lost set held twice, the set still holds %v in Redis", got)
		}
		if err := mm.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
			t.Fatalf("second Unlock = %v, want ErrNotHeld", err)
		}
	})
	t.Run("nested Lock finds a member gone", func(t *testing.T) {
		// The client has not noticed yet (the key was deleted between
		// renewals): the nested Lock finds it, and leaves every count as
		// it was.
		l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{}) // 30 s lease: no renewal during the test
		p := "mmloss:" + t.Name() + ":"
		mm := newMulti(t, l, []string{p + "a", p + "b", p + "c"})
		if err := mm.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := srv.Do("DEL", lockKey(mm.Names()[1])); err != nil {
			t.Fatal(err)
		}
		if err := mm.Lock(ctx); !errors.Is(err, mutex.ErrLost) {
			t.Fatalf("nested Lock with a member gone = %v, want ErrLost", err)
		}
		if err := mm.Lock(ctx); !errors.Is(err, mutex.ErrLost) {
			t.Fatalf("second nested Lock = %v, want ErrLost again", err)
		}
		if err := mm.Unlock(ctx); !errors.Is(err, mutex.ErrLost) {
			t.Fatalf("Unlock = %v, want ErrLost", err)
		}
		if got := heldBy(t, l, mm, mm.Names()); len(got) != 0 {
			t.Fatalf("after Unlock, the set still holds %v in Redis", got)
		}
	})
}

// TestMultiTryLockDoesNotWaitForLock: the set's Lock, TryLock and Unlock
// run one at a time, so that the members' counts move together; a TryLock
// must still not wait while another Lock of the set waits for a name.
func TestMultiTryLockDoesNotWaitForLock(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, redistest.Client(t, redistest.Single(t).Addr()), mutex.Options{})
	p := "mmtry:" + t.Name() + ":"
	mm := newMulti(t, l, []string{p + "a", p + "b"})
	first, last := mm.Names()[0], mm.Names()[1]
	blocker := newMutex(t, l, last)
	if err := blocker.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- mm.Lock(lctx) }()
	if !redistest.WaitFor(ctx, signal, func() bool {
		in, _ := newMutex(t, l, first).Info(ctx)
		return in.Owner == mm.Owner()
	}) {
		t.Fatal("the set's Lock never took its first name")
	}
	tctx, tcancel := context.WithTimeout(ctx, signal)
	defer tcancel()
	if err := mm.TryLock(tctx); !errors.Is(err, mutex.ErrNotObtained) || tctx.Err() != nil {
		t.Fatalf("TryLock while the set's Lock waits = %v (ctx %v), want ErrNotObtained at once", err, tctx.Err())
	}
	if err := blocker.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("the set's Lock = %v", err)
	}
	if err := mm.TryLock(ctx); err != nil || mm.Holds() != 2 {
		t.Fatalf("TryLock of the held set = %v, Holds %d; want it nested, 2", err, mm.Holds())
	}
	for range 2 {
		if err := mm.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDoDropsHoldItsUnlockFailedFor: Do took the hold, so when its final
// release fails cleanly (here a release script that answers an error, as a
// TRYAGAIN does while a slot moves) nobody will release it again: the
// watchdog must stop renewing the hold, and the server's lease then ends
// it. Before, the hold stayed counted and was renewed for as long as the
// Locker lived (Mutex.Do until an earlier fix; RWMutex.Do and RDo and
// MultiMutex.Do until this test). Each case checks that another Locker
// can take the lock within a few leases.
func TestDoDropsHoldItsUnlockFailedFor(t *testing.T) {
	ctx := context.Background()
	const lease = 300 * time.Millisecond
	// Only an Unlock fails: mutex_release also gives back abandoned
	// attempts (mode "a").
	fail := map[string]string{
		"mutex_release":   "if ARGV[1] == 'u' or ARGV[1] == 'U' then return redis.error_reply('TRYAGAIN test') end\n",
		"rwmutex_unlock":  "do return redis.error_reply('TRYAGAIN test') end\n",
		"rwmutex_runlock": "do return redis.error_reply('TRYAGAIN test') end\n",
	}
	for _, tc := range []struct {
		name, script, anchor string
		do                   func(l *mutex.Locker, name string, fn func(context.Context) error) (holds func() int64, err error)
		try                  func(l *mutex.Locker, name string) error
	}{
		{
			name: "Mutex", script: "mutex_release", anchor: "local mode = ARGV[1]",
			do: func(l *mutex.Locker, name string, fn func(context.Context) error) (func() int64, error) {
				m := newMutex(t, l, name)
				return m.Holds, m.Do(ctx, fn)
			},
			try: func(l *mutex.Locker, name string) error { return newMutex(t, l, name).TryLock(ctx) },
		},
		{
			name: "RWMutex.Do", script: "rwmutex_unlock", anchor: "local h = redis.call('HMGET', KEYS[1], 'o', 'f', 'r', 'e', 'q')",
			do: func(l *mutex.Locker, name string, fn func(context.Context) error) (func() int64, error) {
				rw := newRW(t, l, name)
				return func() int64 { w, _ := rw.Holds(); return w }, rw.Do(ctx, fn)
			},
			try: func(l *mutex.Locker, name string) error { return newRW(t, l, name).TryLock(ctx) },
		},
		{
			name: "RWMutex.RDo", script: "rwmutex_runlock", anchor: "local function num(x)",
			do: func(l *mutex.Locker, name string, fn func(context.Context) error) (func() int64, error) {
				rw := newRW(t, l, name)
				return func() int64 { _, r := rw.Holds(); return r }, rw.RDo(ctx, fn)
			},
			try: func(l *mutex.Locker, name string) error { return newRW(t, l, name).TryLock(ctx) },
		},
		{
			name: "MultiMutex", script: "mutex_release", anchor: "local mode = ARGV[1]",
			do: func(l *mutex.Locker, name string, fn func(context.Context) error) (func() int64, error) {
				mm := newMulti(t, l, []string{name + "-a", name + "-b"})
				return mm.Holds, mm.Do(ctx, fn)
			},
			try: func(l *mutex.Locker, name string) error {
				return newMulti(t, l, []string{name + "-a", name + "-b"}).TryLock(ctx)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.NewServer(t)
			sc, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()), scriptcache.WithFS(
				redistest.MutatedScripts(t, tc.script, tc.anchor, fail[tc.script]+tc.anchor)))
			if err != nil {
				t.Fatal(err)
			}
			l, err := mutex.NewLocker(sc, mutex.Options{WatchdogLease: lease})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			other := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{})
			holds, err := tc.do(l, "do-drop", func(context.Context) error { return nil })
			if err == nil || !strings.Contains(err.Error(), "TRYAGAIN") {
				t.Fatalf("Do = %v, want the release's TRYAGAIN", err)
			}
			if h := holds(); h != 0 {
				t.Fatalf("holds after Do = %d, want 0", h)
			}
			// Renewed every lease/3, a hold kept counted would never
			// expire; a dropped one ends within its lease.
			var last error
			if !redistest.WaitFor(ctx, 10*lease, func() bool {
				last = tc.try(other, "do-drop")
				return last == nil
			}) {
				t.Fatalf("another Locker cannot take the lock %v after Do's release failed (last: %v): the hold is still renewed", 10*lease, last)
			}
		})
	}
}

// TestNestedDoKeepsHoldItsUnlockFailedFor: the other side of
// TestDoDropsHoldItsUnlockFailedFor. A Do inside a hold the caller took
// did not take that hold: when its release fails, the caller still holds
// the lock and will release it, so the hold is neither declared lost nor
// dropped from the count. (Only releases of a nested hold fail here.)
func TestNestedDoKeepsHoldItsUnlockFailedFor(t *testing.T) {
	ctx := context.Background()
	fail := map[string]string{
		"mutex_release":  "if (ARGV[1] == 'u' or ARGV[1] == 'U') and ARGV[5] then return redis.error_reply('TRYAGAIN test') end\n",
		"rwmutex_unlock": "if ARGV[2] ~= '1' then return redis.error_reply('TRYAGAIN test') end\n",
	}
	type held interface {
		Lock(ctx context.Context) error
		Do(ctx context.Context, fn func(ctx context.Context) error) error
		Lost() <-chan struct{}
		Err() error
	}
	for _, tc := range []struct {
		name, script, anchor string
		lock                 func(l *mutex.Locker) (held, func() int64)
	}{
		{
			name: "Mutex", script: "mutex_release", anchor: "local mode = ARGV[1]",
			lock: func(l *mutex.Locker) (held, func() int64) {
				m := newMutex(t, l, "nested-do")
				return m, m.Holds
			},
		},
		{
			name: "RWMutex", script: "rwmutex_unlock", anchor: "local h = redis.call('HMGET', KEYS[1], 'o', 'f', 'r', 'e', 'q')",
			lock: func(l *mutex.Locker) (held, func() int64) {
				rw := newRW(t, l, "nested-do")
				return rw, func() int64 { w, _ := rw.Holds(); return w }
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.NewServer(t)
			sc, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()), scriptcache.WithFS(
				redistest.MutatedScripts(t, tc.script, tc.anchor, fail[tc.script]+tc.anchor)))
			if err != nil {
				t.Fatal(err)
			}
			l, err := mutex.NewLocker(sc, mutex.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Close)
			m, holds := tc.lock(l)
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			err = m.Do(ctx, func(context.Context) error { return nil })
			// The release is sent again on TRYAGAIN until its context
			// (a lease) ends, and an attempt out at that moment ends
			// with the deadline instead (seen under a loaded package
			// run).
			if err == nil || !strings.Contains(err.Error(), "TRYAGAIN") && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("nested Do = %v, want the release's TRYAGAIN (or its context's end)", err)
			}
			select {
			case <-m.Lost():
				t.Fatalf("the caller's hold was declared lost (%v) after a nested Do's release failed", m.Err())
			default:
			}
			if err := m.Err(); err != nil {
				t.Fatalf("Err = %v after a nested Do's release failed, want nil: the caller still holds the lock", err)
			}
			if h := holds(); h == 0 {
				t.Fatal("holds after a nested Do's failed release = 0, want the caller's hold still counted")
			}
		})
	}
}
