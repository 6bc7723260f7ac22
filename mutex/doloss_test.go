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
	"testing"

	"github.com/sluicekit/sluice/internal/redistest"
	"github.com/sluicekit/sluice/mutex"
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
