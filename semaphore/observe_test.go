package semaphore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// recorder keeps the events an Observer is told, but subscription ones.
type recorder struct {
	mu     sync.Mutex
	events []scriptcache.Event
}

func (r *recorder) Observe(e scriptcache.Event) {
	if e.Kind == scriptcache.EventSubscription {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) take() []scriptcache.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}

// TestObserveSemaphore checks every event a Semaphore reports, named after
// the semaphore, or after WithEventName's name when given (the errors
// they carry still name the semaphore).
func TestObserveSemaphore(t *testing.T) {
	for _, event := range []string{"", "pool"} {
		t.Run("event="+event, func(t *testing.T) { testObserveSemaphore(t, event) })
	}
}

func testObserveSemaphore(t *testing.T, event string) {
	ctx := context.Background()
	rec := &recorder{}
	sc, err := scriptcache.New(ctx, redistest.Client(t, redistest.Single(t).Addr()), scriptcache.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := semaphore.NewManager(sc, semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	name := uniqueName(t)
	var opts []semaphore.Option
	wantName := name
	if event != "" {
		opts, wantName = append(opts, semaphore.WithEventName(event)), event
	}
	s, err := mgr.NewSemaphore(name, 3, opts...)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryAcquire(ctx, 2); !errors.Is(err, semaphore.ErrNotObtained) {
		t.Fatalf("TryAcquire = %v", err)
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = s.Acquire(tctx, 2)
	cancel()
	if !errors.Is(err, semaphore.ErrNotObtained) {
		t.Fatalf("Acquire = %v", err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// A permit held when the Manager closes is lost; the event comes
	// before the holder is told.
	p, err = s.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	mgr.Close()
	select {
	case <-p.Lost():
	case <-time.After(signalWait):
		t.Fatal("loss not signalled")
	}
	ev := rec.take()
	want := []struct {
		kind   scriptcache.EventKind
		weight int64
		reason string
	}{
		{scriptcache.EventAcquired, 2, ""},
		{scriptcache.EventAcquireFailed, 2, scriptcache.ReasonBusy},
		{scriptcache.EventAcquireFailed, 2, scriptcache.ReasonTimeout},
		{scriptcache.EventReleased, 2, ""},
		{scriptcache.EventAcquired, 1, ""},
		{scriptcache.EventLost, 1, scriptcache.ReasonClosed},
	}
	if len(ev) != len(want) {
		t.Fatalf("events %+v; want %d", ev, len(want))
	}
	for i, e := range ev {
		w := want[i]
		if e.Kind != w.kind || e.Weight != w.weight || e.Reason != w.reason || e.Primitive != "semaphore" || e.Name != wantName {
			t.Errorf("event %d = %+v; want %v of weight %d, reason %q, name %q", i, e, w.kind, w.weight, w.reason, wantName)
		}
	}
	if ev[0].Wait <= 0 || ev[3].Hold <= 0 || !errors.Is(ev[5].Err, semaphore.ErrLost) || !strings.Contains(ev[5].Err.Error(), name) {
		t.Errorf("events %+v: want a wait, a hold and the loss's error, naming the semaphore", ev)
	}
}

func TestWithEventNameRefused(t *testing.T) {
	sc, err := scriptcache.New(context.Background(), redistest.Client(t, redistest.Single(t).Addr()))
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := semaphore.NewManager(sc, semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr.Close()
	for _, name := range []string{"", strings.Repeat("x", 1025)} {
		if _, err := mgr.NewSemaphore(uniqueName(t), 1, semaphore.WithEventName(name)); !errors.Is(err, semaphore.ErrInvalidOptions) {
			t.Errorf("WithEventName of %d bytes: %v; want ErrInvalidOptions", len(name), err)
		}
	}
}
