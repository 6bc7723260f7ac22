package mutex_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// recorder keeps the events an Observer is told.
type recorder struct {
	mu     sync.Mutex
	events []scriptcache.Event
}

func (r *recorder) Observe(e scriptcache.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// take returns the events so far, of kinds other than subscription, and
// forgets them.
func (r *recorder) take() []scriptcache.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []scriptcache.Event
	for _, e := range r.events {
		if e.Kind != scriptcache.EventSubscription {
			out = append(out, e)
		}
	}
	r.events = nil
	return out
}

func observedLocker(t *testing.T, client rueidis.Client, rec *recorder, opts mutex.Options) *mutex.Locker {
	t.Helper()
	sc, err := scriptcache.New(context.Background(), client, scriptcache.WithObserver(rec))
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

// expect checks that got are events of the kinds want, in order, each of
// primitive prim and lock name.
func expect(t *testing.T, got []scriptcache.Event, prim, name string, want ...scriptcache.EventKind) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("events %+v; want kinds %v", got, want)
	}
	for i, e := range got {
		if e.Kind != want[i] || e.Primitive != prim || e.Name != name {
			t.Fatalf("event %d = %+v; want %v of %s %q", i, e, want[i], prim, name)
		}
	}
}

func TestObserveMutex(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	l := observedLocker(t, redistest.Client(t, redistest.Single(t).Addr()), rec, mutex.Options{WatchdogLease: 300 * time.Millisecond})
	name := "observe:" + t.Name()
	a, b := newMutex(t, l, name), newMutex(t, l, name)

	// Lock, a nested Lock, two Unlocks: one acquisition, one release.
	for range 2 {
		if err := a.Lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := a.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ev := rec.take()
	expect(t, ev, "mutex", name, scriptcache.EventAcquired, scriptcache.EventReleased)
	if ev[0].Wait <= 0 || ev[0].Weight != 1 || ev[0].Handoff || ev[1].Hold <= 0 {
		t.Errorf("events %+v: want a wait, weight 1, no hand-off, a hold", ev)
	}

	// A TryLock and a Lock that times out while a holds it.
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("TryLock = %v", err)
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err := b.Lock(tctx)
	cancel()
	if !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("Lock = %v", err)
	}
	ev = rec.take()
	expect(t, ev, "mutex", name, scriptcache.EventAcquired, scriptcache.EventAcquireFailed, scriptcache.EventAcquireFailed)
	if ev[1].Reason != scriptcache.ReasonBusy || ev[1].Err == nil {
		t.Errorf("TryLock's event %+v: want reason busy with the error", ev[1])
	}
	if ev[2].Reason != scriptcache.ReasonTimeout || ev[2].Wait <= 0 {
		t.Errorf("timed-out Lock's event %+v: want reason timeout and the wait", ev[2])
	}

	// Forced free: the watchdog finds it gone, and the event comes before
	// the holder is told.
	if _, err := b.ForceUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Lost():
	case <-time.After(signal):
		t.Fatal("loss not signalled")
	}
	ev = rec.take()
	expect(t, ev, "mutex", name, scriptcache.EventLost)
	if ev[0].Reason != scriptcache.ReasonGone || !errors.Is(ev[0].Err, mutex.ErrLost) || ev[0].Hold <= 0 {
		t.Errorf("loss event %+v: want reason gone, ErrLost and the hold time", ev[0])
	}
}

func TestObserveFairHandoff(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	l := observedLocker(t, redistest.Client(t, redistest.Single(t).Addr()), rec, mutex.Options{Fair: true})
	name := "observe:" + t.Name()
	a, b := newMutex(t, l, name), newMutex(t, l, name)
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Lock(ctx) }()
	if !redistest.WaitFor(ctx, signal, func() bool { in, err := a.Info(ctx); return err == nil && in.Queued == 1 }) {
		t.Fatal("the waiter did not queue")
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var acquired []scriptcache.Event
	for _, e := range rec.take() {
		if e.Kind == scriptcache.EventAcquired {
			acquired = append(acquired, e)
		}
	}
	if len(acquired) != 2 || acquired[0].Handoff || !acquired[1].Handoff {
		t.Fatalf("acquisitions %+v: want the first taken, the second handed over", acquired)
	}
}

func TestObserveRWAndMulti(t *testing.T) {
	ctx := context.Background()
	rec := &recorder{}
	l := observedLocker(t, redistest.Client(t, redistest.Single(t).Addr()), rec, mutex.Options{})
	name := "observe:" + t.Name()
	rw, err := l.NewRWMutex(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := rw.RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.RUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rw.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	other, err := l.NewRWMutex(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.TryRLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("TryRLock = %v", err)
	}
	if err := rw.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	ev := rec.take()
	expect(t, ev, "rwmutex", name, scriptcache.EventAcquired, scriptcache.EventReleased,
		scriptcache.EventAcquired, scriptcache.EventAcquireFailed, scriptcache.EventReleased)
	if ev[3].Reason != scriptcache.ReasonBusy {
		t.Errorf("TryRLock's event %+v: want reason busy", ev[3])
	}

	mm, err := l.NewMultiMutex([]string{"one:" + name})
	if err != nil {
		t.Fatal(err)
	}
	if err := mm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := mm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	expect(t, rec.take(), "multimutex", "one:"+name, scriptcache.EventAcquired, scriptcache.EventReleased)
}
