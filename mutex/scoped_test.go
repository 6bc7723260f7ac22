package mutex_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

func TestContext(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l := newLocker(t, client, mutex.Options{WatchdogLease: 300 * time.Millisecond})

	t.Run("not held", func(t *testing.T) {
		m := newMutex(t, l, "scoped:"+t.Name())
		hctx, cancel := m.Context(ctx)
		defer cancel()
		if hctx.Err() == nil || !errors.Is(context.Cause(hctx), mutex.ErrNotHeld) {
			t.Fatalf("Context with nothing held: err %v, cause %v; want cancelled with ErrNotHeld", hctx.Err(), context.Cause(hctx))
		}
	})
	t.Run("released", func(t *testing.T) {
		m := newMutex(t, l, "scoped:"+t.Name())
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Lock(ctx); err != nil { // nested: the context lives until the last Unlock
			t.Fatal(err)
		}
		hctx, cancel := m.Context(ctx)
		defer cancel()
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if hctx.Err() != nil {
			t.Fatalf("context ended after a partial Unlock: %v", context.Cause(hctx))
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if hctx.Err() == nil || !errors.Is(context.Cause(hctx), mutex.ErrNotHeld) {
			t.Fatalf("after the last Unlock: err %v, cause %v; want cancelled with ErrNotHeld", hctx.Err(), context.Cause(hctx))
		}
	})
	t.Run("lost", func(t *testing.T) {
		m := newMutex(t, l, "scoped:"+t.Name())
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		hctx, cancel := m.Context(ctx)
		defer cancel()
		if _, err := m.ForceUnlock(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-hctx.Done():
		case <-time.After(signal):
			t.Fatal("the context did not end when the hold was lost")
		}
		if !errors.Is(context.Cause(hctx), mutex.ErrLost) {
			t.Fatalf("cause = %v, want ErrLost", context.Cause(hctx))
		}
	})
}

func TestDo(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l := newLocker(t, client, mutex.Options{WatchdogLease: 300 * time.Millisecond})
	errWork := errors.New("work failed")

	t.Run("runs under the lock and unlocks", func(t *testing.T) {
		m := newMutex(t, l, "do:"+t.Name())
		other := newMutex(t, l, "do:"+t.Name())
		err := m.Do(ctx, func(ctx context.Context) error {
			if err := other.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
				t.Errorf("TryLock by another owner inside Do = %v, want ErrNotObtained", err)
			}
			return errWork
		})
		if !errors.Is(err, errWork) {
			t.Fatalf("Do = %v, want fn's error", err)
		}
		if m.Holds() != 0 {
			t.Fatalf("Holds after Do = %d, want 0", m.Holds())
		}
		if err := other.TryLock(ctx); err != nil {
			t.Fatalf("TryLock after Do = %v, want the lock free", err)
		}
		other.Unlock(ctx)
	})
	t.Run("lost while running", func(t *testing.T) {
		m := newMutex(t, l, "do:"+t.Name())
		err := m.Do(ctx, func(hctx context.Context) error {
			if _, err := m.ForceUnlock(ctx); err != nil {
				return err
			}
			<-hctx.Done() // the work notices the loss through its context
			return nil
		})
		if !errors.Is(err, mutex.ErrLost) {
			t.Fatalf("Do whose hold was lost = %v, want ErrLost", err)
		}
	})
	t.Run("lock fails", func(t *testing.T) {
		m := newMutex(t, l, "do:"+t.Name())
		holder := newMutex(t, l, "do:"+t.Name())
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		defer holder.Unlock(ctx)
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		ran := false
		if err := m.Do(short, func(context.Context) error { ran = true; return nil }); !errors.Is(err, mutex.ErrNotObtained) || ran {
			t.Fatalf("Do on a held lock = %v (ran %v), want ErrNotObtained without running", err, ran)
		}
	})
}

func TestExtend(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l := newLocker(t, client, mutex.Options{})

	m := newMutex(t, l, "extend", mutex.WithLease(500*time.Millisecond))
	if _, err := m.Extend(ctx, time.Minute); !errors.Is(err, mutex.ErrNotHeld) {
		t.Fatalf("Extend with nothing held = %v, want ErrNotHeld", err)
	}
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	until, err := m.Extend(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if until.Before(before.Add(50*time.Second)) || until.After(time.Now().Add(time.Minute)) {
		t.Fatalf("Extend returned %v, want about a minute from now", until)
	}
	if info, _ := m.Info(ctx); info.Remain < 50*time.Second {
		t.Fatalf("Info.Remain = %v after Extend, want about a minute", info.Remain)
	}
	// Past the original lease the hold is still there, on both sides.
	time.Sleep(700 * time.Millisecond)
	select {
	case <-m.Lost():
		t.Fatalf("lost after Extend: %v", m.Err())
	default:
	}
	for _, d := range []time.Duration{-time.Second, 0, time.Millisecond} {
		if _, err := m.Extend(ctx, d); !errors.Is(err, mutex.ErrInvalidOptions) {
			t.Errorf("Extend(%v) = %v, want ErrInvalidOptions", d, err)
		}
	}
	if _, err := m.ForceUnlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Extend(ctx, time.Minute); !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("Extend after the lock was released behind its back = %v, want ErrLost", err)
	}

	w := newMutex(t, l, "extend-watchdog")
	if err := w.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.Unlock(ctx)
	if _, err := w.Extend(ctx, time.Minute); !errors.Is(err, mutex.ErrNotFixed) {
		t.Fatalf("Extend of a watchdog lease = %v, want ErrNotFixed", err)
	}
}
