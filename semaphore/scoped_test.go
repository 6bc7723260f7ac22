package semaphore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// deleteSemaphore removes the semaphore's permit keys behind its holders'
// backs, as an operator (or a restart without persistence) would.
func (e *env) deleteSemaphore(t testing.TB, name string) {
	t.Helper()
	for _, k := range []string{keyspace.Key(e.prefix, name, ""), keyspace.Key(e.prefix, name, ":e")} {
		if err := e.client.Do(context.Background(), e.client.B().Del().Key(k).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPermitContext: the context ends with the permit, its cause telling a
// release (ErrNotHeld) from a loss (ErrLost); one made for a permit that
// has ended is cancelled already.
func TestPermitContext(t *testing.T) {
	ctx := context.Background()
	addrs := []string{redistest.Single(t).Addr()}

	t.Run("released", func(t *testing.T) {
		e := newEnv(t, addrs, semaphore.Options{})
		p := acquire(t, e.sem(t, uniqueName(t), 2), 1)
		pctx, cancel := p.Context(ctx)
		defer cancel()
		if err := pctx.Err(); err != nil {
			t.Fatalf("Context of a held permit: Err = %v, want nil", err)
		}
		release(t, p)
		if cause := context.Cause(pctx); !errors.Is(cause, semaphore.ErrNotHeld) || errors.Is(cause, semaphore.ErrLost) {
			t.Fatalf("cause after Release = %v, want ErrNotHeld, not ErrLost", cause)
		}
		after, cancel2 := p.Context(ctx)
		defer cancel2()
		if cause := context.Cause(after); !errors.Is(cause, semaphore.ErrNotHeld) {
			t.Fatalf("Context after Release: cause = %v, want ErrNotHeld at once", cause)
		}
	})

	t.Run("lost", func(t *testing.T) {
		e := newEnv(t, addrs, semaphore.Options{WatchdogLease: time.Second})
		name := uniqueName(t)
		p := acquire(t, e.sem(t, name, 2), 1)
		pctx, cancel := p.Context(ctx)
		defer cancel()
		e.deleteSemaphore(t, name) // the next renewal finds it gone
		select {
		case <-pctx.Done():
		case <-time.After(signalWait):
			t.Fatal("Context not cancelled by the loss")
		}
		if cause := context.Cause(pctx); !errors.Is(cause, semaphore.ErrLost) || !errors.Is(cause, lease.ErrGone) {
			t.Fatalf("cause = %v, want ErrLost wrapping lease.ErrGone", cause)
		}
		after, cancel2 := p.Context(ctx)
		defer cancel2()
		if cause := context.Cause(after); !errors.Is(cause, semaphore.ErrLost) {
			t.Fatalf("Context after the loss: cause = %v, want ErrLost at once", cause)
		}
	})

	t.Run("release failed", func(t *testing.T) {
		e := newEnv(t, addrs, semaphore.Options{})
		p := acquire(t, e.sem(t, uniqueName(t), 2), 1)
		pctx, cancel := p.Context(ctx)
		defer cancel()
		gone, end := context.WithCancel(ctx)
		end()
		if err := p.Release(gone); err == nil {
			t.Fatal("Release with an ended context = nil, want its error")
		}
		// Not renewed any more: the permit is not to be counted on.
		if cause := context.Cause(pctx); !errors.Is(cause, semaphore.ErrNotHeld) {
			t.Fatalf("cause after a failed Release = %v, want ErrNotHeld", cause)
		}
		if p.Valid() || !p.HeldUntil().IsZero() {
			t.Fatalf("after a failed Release: Valid %v, HeldUntil %v; want false and the zero time", p.Valid(), p.HeldUntil())
		}
		if err := p.Release(ctx); err != nil && !errors.Is(err, semaphore.ErrNotHeld) {
			t.Fatalf("Release again = %v, want nil or ErrNotHeld", err)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		e := newEnv(t, addrs, semaphore.Options{})
		p := acquire(t, e.sem(t, uniqueName(t), 2), 1)
		pctx, cancel := p.Context(ctx)
		cancel()
		if !errors.Is(pctx.Err(), context.Canceled) || p.Err() != nil {
			t.Fatalf("after cancel: ctx.Err = %v, permit Err = %v, want Canceled and the permit untouched", pctx.Err(), p.Err())
		}
		release(t, p)
	})
}

// TestSemaphoreDo: Do returns fn's error and gives the permits back; a
// loss while fn ran is reported even when fn returns nil and only the
// final Release finds it; a failed Acquire does not run fn.
func TestSemaphoreDo(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{}) // 30 s lease: no renewal during a test
	errWork := errors.New("work failed")

	t.Run("fn's error", func(t *testing.T) {
		s := e.sem(t, uniqueName(t), 3)
		var during int64
		err := s.Do(ctx, 2, func(ctx context.Context) error {
			if ctx.Err() != nil {
				t.Errorf("fn's ctx already done: %v", ctx.Err())
			}
			during = available(t, s)
			return errWork
		})
		if err != errWork { //nolint:errorlint // fn's error itself, unwrapped, is what is checked
			t.Fatalf("Do = %v, want fn's error itself", err)
		}
		if during != 1 {
			t.Fatalf("Available during fn = %d, want 1 (2 of 3 held)", during)
		}
		wantAvailable(t, s, 3)
	})

	t.Run("lost, found at release", func(t *testing.T) {
		name := uniqueName(t)
		s := e.sem(t, name, 3)
		err := s.Do(ctx, 1, func(context.Context) error {
			e.deleteSemaphore(t, name)
			return nil
		})
		if !errors.Is(err, semaphore.ErrLost) {
			t.Fatalf("Do with the permit deleted while fn ran = %v, want ErrLost", err)
		}
	})

	t.Run("lost while fn ran", func(t *testing.T) {
		le := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{WatchdogLease: time.Second})
		name := uniqueName(t)
		s := le.sem(t, name, 3)
		err := s.Do(ctx, 1, func(ctx context.Context) error {
			le.deleteSemaphore(t, name)
			select {
			case <-ctx.Done(): // the watchdog found it gone
			case <-time.After(signalWait):
				t.Error("fn's ctx not cancelled by the loss")
			}
			return errWork
		})
		if !errors.Is(err, semaphore.ErrLost) || !errors.Is(err, errWork) || errors.Is(err, semaphore.ErrNotHeld) {
			t.Fatalf("Do = %v, want fn's error and ErrLost, once (not Release's ErrNotHeld)", err)
		}
	})

	t.Run("acquire fails", func(t *testing.T) {
		s := e.sem(t, uniqueName(t), 3)
		ran := false
		err := s.Do(ctx, 4, func(context.Context) error { ran = true; return nil })
		if !errors.Is(err, semaphore.ErrInvalidWeight) || ran {
			t.Fatalf("Do(4) of capacity 3 = %v, ran fn = %v; want ErrInvalidWeight without running fn", err, ran)
		}
	})
}

// TestOwnerLabel: WithOwner's label shows in Holders, on an unfair and on
// a fair semaphore, including a permit a fair release handed to a labelled
// waiter (its id travels in the grant message); unlabelled permits show
// none; bad labels are refused.
func TestOwnerLabel(t *testing.T) {
	ctx := context.Background()
	forTargets(t, func(t *testing.T, addrs []string) {
		for _, fair := range []bool{false, true} {
			e := newEnv(t, addrs, semaphore.Options{Fair: fair})
			name := uniqueName(t)
			plain := e.sem(t, name, 2)
			worker, err := e.mgr.NewSemaphore(name, 2, semaphore.WithOwner("host-1/worker-7"))
			if err != nil {
				t.Fatal(err)
			}
			a := acquire(t, worker, 1)
			b := acquire(t, plain, 1)
			if !strings.HasSuffix(a.ID(), "host-1/worker-7") || strings.Contains(b.ID(), "host") {
				t.Fatalf("labelled id %q, plain id %q: want the label in the first only", a.ID(), b.ID())
			}
			waiting := acquireAsync(ctx, worker, 1) // queued (fair) or waiting
			release(t, b)
			c := got(t, waiting, "labelled waiter")
			hs, err := plain.Holders(ctx)
			if err != nil {
				t.Fatal(err)
			}
			owners := map[string]string{}
			for _, h := range hs {
				owners[h.ID] = h.Owner
			}
			for _, p := range []*semaphore.Permit{a, c} {
				if o, ok := owners[p.ID()]; !ok || o != "host-1/worker-7" {
					t.Fatalf("fair=%v: Holders = %+v, want %s owned by host-1/worker-7", fair, hs, p.ID())
				}
			}
			release(t, a)
			release(t, c)
			d := acquire(t, plain, 1)
			hs, err = plain.Holders(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(hs) != 1 || hs[0].ID != d.ID() || hs[0].Owner != "" {
				t.Fatalf("fair=%v: Holders = %+v, want only %s, without an owner", fair, hs, d.ID())
			}
			release(t, d)
		}
	})
	e := newEnv(t, []string{redistest.Single(t).Addr()}, semaphore.Options{})
	for _, bad := range []string{"", "two words", "tab\there", "line\n", strings.Repeat("x", 129)} {
		if _, err := e.mgr.NewSemaphore("owner-check", 1, semaphore.WithOwner(bad)); !errors.Is(err, semaphore.ErrInvalidOptions) {
			t.Errorf("WithOwner(%q): err = %v, want ErrInvalidOptions", bad, err)
		}
	}
}

// TestInfo: Info reports the capacity in force, the weight and number of
// live permits, expired ones not reclaimed (without counting their
// weight), a set capacity, and the fair waiters queued.
func TestInfo(t *testing.T) {
	ctx := context.Background()
	forTargets(t, func(t *testing.T, addrs []string) {
		e := newEnv(t, addrs, semaphore.Options{Fair: true})
		short := newEnv(t, addrs, semaphore.Options{Lease: 100 * time.Millisecond})
		name := uniqueName(t)
		s := e.sem(t, name, 5)
		info := func() semaphore.Info {
			t.Helper()
			in, err := s.Info(ctx)
			if err != nil {
				t.Fatalf("Info: %v", err)
			}
			return in
		}
		if got, want := info(), (semaphore.Info{Capacity: 5, Available: 5}); got != want {
			t.Fatalf("Info of an unused semaphore = %+v, want %+v", got, want)
		}
		a := acquire(t, s, 3)
		b := acquire(t, s, 1)
		if got, want := info(), (semaphore.Info{Capacity: 5, Used: 4, Available: 1, Holders: 2}); got != want {
			t.Fatalf("Info with 3+1 held = %+v, want %+v", got, want)
		}
		waiter, stop := context.WithCancel(ctx)
		defer stop()
		waiting := acquireAsync(waiter, s, 2)
		e.waitQueued(t, name, 1)
		if got := info(); got.Queued != 1 {
			t.Fatalf("Info with a fair waiter = %+v, want Queued 1", got)
		}
		stop()
		if r := <-waiting; r.err == nil {
			t.Fatal("the waiter got a permit; want it to give up")
		}
		release(t, b)
		release(t, a)
		if !redistest.WaitFor(ctx, signalWait, func() bool { return info().Queued == 0 }) {
			t.Fatalf("Info = %+v after the waiter left, want Queued 0", info())
		}

		// Expired permits: not live, their weight not used.
		held := acquire(t, s, 1)
		acquire(t, short.sem(t, name, 5), 2)
		if !redistest.WaitFor(ctx, signalWait, func() bool { return info().Expired == 1 }) {
			t.Fatalf("Info = %+v, want the fixed-lease permit expired", info())
		}
		if got, want := info(), (semaphore.Info{Capacity: 5, Used: 1, Available: 4, Holders: 1, Expired: 1}); got != want {
			t.Fatalf("Info with one live permit and one expired = %+v, want %+v", got, want)
		}
		if err := s.SetCapacity(ctx, 8); err != nil {
			t.Fatal(err)
		}
		if got := info(); got.Capacity != 8 || !got.CapacitySet || got.Available != 7 {
			t.Fatalf("Info after SetCapacity(8) = %+v, want Capacity 8, CapacitySet, Available 7", got)
		}
		release(t, held)
	})
}
