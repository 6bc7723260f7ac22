package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

func newMulti(t testing.TB, l *mutex.Locker, names []string, opts ...mutex.LockOption) *mutex.MultiMutex {
	t.Helper()
	mm, err := l.NewMultiMutex(names, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mm
}

func TestMultiLockUnlock(t *testing.T) {
	ctx := context.Background()
	for _, tg := range allTargets() {
		t.Run(tg.name, func(t *testing.T) {
			l := newLocker(t, clientFor(t, tg), mutex.Options{})
			p := "multi:" + t.Name() + ":"
			names := []string{p + "c", p + "a", p + "b"}
			mm := newMulti(t, l, names)
			if err := mm.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			for i, tok := range mm.Tokens() {
				if tok <= 0 {
					t.Fatalf("Tokens()[%d] = %d, want > 0", i, tok)
				}
			}
			for _, name := range names {
				m := newMutex(t, l, name)
				if err := m.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
					t.Fatalf("TryLock(%q) while the set holds it = %v, want ErrNotObtained", name, err)
				}
				if info, _ := m.Info(ctx); info.Owner != mm.Owner() {
					t.Fatalf("Info(%q).Owner = %q, want the set's %q", name, info.Owner, mm.Owner())
				}
			}
			// Nested: a second Lock nests in every member.
			if err := mm.Lock(ctx); err != nil || mm.Holds() != 2 {
				t.Fatalf("nested Lock = %v with %d holds, want 2", err, mm.Holds())
			}
			for range 2 {
				if err := mm.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for _, name := range names {
				m := newMutex(t, l, name)
				if err := m.TryLock(ctx); err != nil {
					t.Fatalf("TryLock(%q) after the set's Unlock = %v", name, err)
				}
				m.Unlock(ctx)
			}
			if err := mm.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
				t.Fatalf("extra Unlock = %v, want ErrNotHeld", err)
			}
		})
	}
}

// TestMultiAllOrNothing: when one name is held elsewhere, TryLock and a
// Lock whose context ends leave none of the other names held.
func TestMultiAllOrNothing(t *testing.T) {
	ctx := context.Background()
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			l := newLocker(t, clientFor(t, tg), mutex.Options{})
			p := "multi-aon:" + t.Name() + ":"
			names := []string{p + "a", p + "b", p + "c", p + "d"}
			mm := newMulti(t, l, names)
			// Hold the name locked last, so the set takes the others first.
			last := mm.Names()[len(names)-1]
			other := newMutex(t, l, last)
			if err := other.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if err := mm.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
				t.Fatalf("TryLock with %q held = %v, want ErrNotObtained", last, err)
			}
			short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			err := mm.Lock(short)
			cancel()
			if !errors.Is(err, mutex.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Lock with %q held = %v, want ErrNotObtained and DeadlineExceeded", last, err)
			}
			if mm.Holds() != 0 || slices.ContainsFunc(mm.Tokens(), func(t int64) bool { return t != 0 }) {
				t.Fatalf("after failing, Holds %d, Tokens %v; want nothing", mm.Holds(), mm.Tokens())
			}
			for _, name := range mm.Names()[:len(names)-1] {
				if info, _ := newMutex(t, l, name).Info(ctx); info.Held {
					t.Fatalf("%q left held after a failed multi-lock: %+v", name, info)
				}
			}
			select {
			case <-mm.Lost():
			default:
				t.Fatal("Lost of a set not held is not closed")
			}
			other.Unlock(ctx)
			lctx, cancel := context.WithTimeout(ctx, signal)
			defer cancel()
			if err := mm.Lock(lctx); err != nil {
				t.Fatal(err)
			}
			mm.Unlock(ctx)
		})
	}
}

// TestMultiNoDeadlock: goroutines with Lockers of their own lock
// overlapping sets listed in opposite orders, many times. Without the
// canonical order they would deadlock (each holding a name the other
// waits for, for the 30 s lease and again); with it all finish. Every
// name sees one holder at a time.
func TestMultiNoDeadlock(t *testing.T) {
	const workers, rounds, ring = 6, 12, 4
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			addrs := tg.addrs(t)
			ctx, cancel := context.WithTimeout(context.Background(), 4*signal)
			defer cancel()
			p := "multi-dl:" + t.Name() + ":"
			check := redistest.Client(t, addrs...)
			var wg sync.WaitGroup
			for i := range workers {
				l := newLocker(t, redistest.Client(t, addrs...), mutex.Options{})
				var names []string
				for k := range 3 {
					names = append(names, p+strconv.Itoa((i+k)%ring))
				}
				if i%2 == 1 {
					slices.Reverse(names)
				}
				mm := newMulti(t, l, names)
				wg.Go(func() {
					for range rounds {
						if err := mm.Lock(ctx); err != nil {
							t.Errorf("worker %d %v: %v", i, names, err)
							return
						}
						for _, name := range names {
							gauge := "{" + name + "}:holders"
							if n, _ := check.Do(ctx, check.B().Incr().Key(gauge).Build()).AsInt64(); n != 1 {
								t.Errorf("%s: %d holders at once", name, n)
							}
						}
						for _, name := range names {
							check.Do(ctx, check.B().Decr().Key("{"+name+"}:holders").Build())
						}
						if err := mm.Unlock(context.Background()); err != nil {
							t.Errorf("worker %d: Unlock: %v", i, err)
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

// TestMultiCrossSlot: on a cluster, a set whose names live on different
// nodes is locked in slot order and held on every node.
func TestMultiCrossSlot(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, redistest.Client(t, redistest.SharedCluster(t).Addrs()...), mutex.Options{})
	// Names spread over the three nodes' slot ranges (0-5460, 5461-10921,
	// 10922-16383), listed out of slot order.
	var names []string
	var want []uint16
	for i := 0; len(names) < 6; i++ {
		name := "xslot:" + strconv.Itoa(i)
		slot := keyspace.Slot(keyspace.Key(mutex.DefaultPrefix, name, ""))
		if node := int(slot) / 5461; node == (5-len(names))%3 {
			names = append(names, name)
			want = append(want, slot)
		}
	}
	mm := newMulti(t, l, names)
	slices.Sort(want)
	for i, name := range mm.Names() {
		if got := keyspace.Slot(keyspace.Key(mutex.DefaultPrefix, name, "")); got != want[i] {
			t.Fatalf("Names() = %v, not in slot order", mm.Names())
		}
	}
	if err := mm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if info, err := newMutex(t, l, name).Info(ctx); err != nil || info.Owner != mm.Owner() {
			t.Fatalf("Info(%q) = %+v, %v; want held by the set", name, info, err)
		}
	}
	if err := mm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMultiLoss: one member's key is deleted; the set's Lost closes and
// Unlock releases the members that remain.
func TestMultiLoss(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{WatchdogLease: 600 * time.Millisecond})
	mm := newMulti(t, l, []string{"ml-a", "ml-b", "ml-c"})
	if err := mm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lost := mm.Lost()
	if again := mm.Lost(); again != lost {
		t.Fatal("Lost returned a different channel for the same hold")
	}
	srv.Do("DEL", lockKey("ml-b"))
	select {
	case <-lost:
	case <-time.After(signal):
		t.Fatal("the set was not told that a member was lost")
	}
	if !errors.Is(mm.Err(), mutex.ErrLost) {
		t.Fatalf("Err() = %v, want ErrLost", mm.Err())
	}
	err := mm.Unlock(ctx)
	if !errors.Is(err, mutex.ErrNotHeld) || !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("Unlock after a member's loss = %v, want ErrNotHeld and ErrLost", err)
	}
	for _, name := range []string{"ml-a", "ml-c"} {
		if info, _ := newMutex(t, l, name).Info(ctx); info.Held {
			t.Fatalf("%q still held after Unlock: %+v", name, info)
		}
	}
	// A clean hold after that: Lost is a fresh channel, and Unlock ends
	// its watcher (goleak in TestMain checks).
	if err := mm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-mm.Lost():
		t.Fatal("Lost closed for a fresh hold")
	default:
	}
	if err := mm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestMultiBadInput(t *testing.T) {
	l := newLocker(t, miniClient(t), mutex.Options{})
	many := make([]string, mutex.MaxMultiNames+1)
	for i := range many {
		many[i] = fmt.Sprint("n", i)
	}
	for _, c := range []struct {
		names []string
		want  error
	}{
		{nil, mutex.ErrInvalidOptions},
		{[]string{}, mutex.ErrInvalidOptions},
		{many, mutex.ErrInvalidOptions},
		{[]string{"a", ""}, mutex.ErrInvalidName},
		{[]string{"a", strings.Repeat("x", 2000)}, mutex.ErrInvalidName},
		{[]string{"a", "b", "a"}, mutex.ErrInvalidName},
	} {
		if _, err := l.NewMultiMutex(c.names); !errors.Is(err, c.want) {
			t.Errorf("NewMultiMutex(%d names) = %v, want %v", len(c.names), err, c.want)
		}
	}
	if _, err := l.NewMultiMutex([]string{"a"}, mutex.WithOwner("")); !errors.Is(err, mutex.ErrInvalidOptions) {
		t.Errorf("WithOwner(\"\") = %v, want ErrInvalidOptions", err)
	}
	if _, err := l.NewMultiMutex(many[:mutex.MaxMultiNames]); err != nil {
		t.Errorf("NewMultiMutex(%d names) = %v, want nil", mutex.MaxMultiNames, err)
	}
}

// TestMultiDo: Do runs fn with every name held; a member lost while fn
// runs ends fn's context and Do reports the loss.
func TestMultiDo(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{WatchdogLease: 600 * time.Millisecond})
	mm := newMulti(t, l, []string{"md-a", "md-b"})
	err := mm.Do(ctx, func(ctx context.Context) error {
		if err := newMutex(t, l, "md-b").TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
			t.Errorf("member inside Do = %v, want ErrNotObtained", err)
		}
		return nil
	})
	if err != nil || mm.Holds() != 0 {
		t.Fatalf("Do = %v, Holds %d; want nil, 0", err, mm.Holds())
	}
	err = mm.Do(ctx, func(hctx context.Context) error {
		srv.Do("DEL", lockKey("md-a"))
		select {
		case <-hctx.Done():
		case <-time.After(signal):
			t.Error("the set's context did not end at a member's loss")
		}
		return nil
	})
	if !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("Do with a member lost = %v, want ErrLost", err)
	}
	if info, _ := newMutex(t, l, "md-b").Info(ctx); info.Held {
		t.Fatalf("the other member left held: %+v", info)
	}
}
