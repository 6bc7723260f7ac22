package mutex_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// TestErrorText checks representative errors read the package's name once
// ("mutex: not held: lock lost: ...", not "mutex: not held: mutex: lock
// lost: ...") while errors.Is finds every sentinel they wrap.
func TestErrorText(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l := newLocker(t, client, mutex.Options{})
	name := func(t *testing.T) string { return "errtext:" + t.Name() }
	for _, tc := range []struct {
		what string
		err  func(t *testing.T) error
		want string // %s is the name
		is   []error
	}{
		{"unlock after a force unlock", func(t *testing.T) error {
			m := newMutex(t, l, name(t))
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := newMutex(t, l, name(t)).ForceUnlock(ctx); err != nil {
				t.Fatal(err)
			}
			return m.Unlock(ctx)
		}, `mutex: not held: lock lost: "%s": found not held at unlock`, []error{mutex.ErrNotHeld, mutex.ErrLost}},
		{"unlock after Close", func(t *testing.T) error {
			l := newLocker(t, client, mutex.Options{})
			m := newMutex(t, l, name(t))
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			l.Close()
			return m.Unlock(ctx)
		}, `mutex: not held: lock lost: "%s": locker closed: lease keeper closed`, []error{mutex.ErrNotHeld, mutex.ErrLost, mutex.ErrClosed}},
		{"write unlock after a force unlock", func(t *testing.T) error {
			rw, err := l.NewRWMutex(name(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := rw.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := rw.ForceUnlock(ctx); err != nil {
				t.Fatal(err)
			}
			return rw.Unlock(ctx)
		}, `mutex: not held: lock lost: "%s" (write): found not held at unlock`, []error{mutex.ErrNotHeld, mutex.ErrLost}},
		{"set unlock after a member's force unlock", func(t *testing.T) error {
			mm, err := l.NewMultiMutex([]string{name(t) + ":a", name(t) + ":b"})
			if err != nil {
				t.Fatal(err)
			}
			if err := mm.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := newMutex(t, l, name(t)+":a").ForceUnlock(ctx); err != nil {
				t.Fatal(err)
			}
			return mm.Unlock(ctx)
		}, `mutex: not held: lock lost: "%s:a": found not held at unlock`, []error{mutex.ErrNotHeld, mutex.ErrLost}},
		{"try lock of a held lock", func(t *testing.T) error {
			if err := newMutex(t, l, name(t)).Lock(ctx); err != nil {
				t.Fatal(err)
			}
			return newMutex(t, l, name(t)).TryLock(ctx)
		}, `mutex: not obtained: "%s" is held`, []error{mutex.ErrNotObtained}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			err := tc.err(t)
			if err == nil {
				t.Fatal("no error")
			}
			want := strings.ReplaceAll(tc.want, "%s", name(t))
			if got := err.Error(); got != want {
				t.Errorf("got %q; want %q", got, want)
			}
			for _, s := range tc.is {
				if !errors.Is(err, s) {
					t.Errorf("errors.Is(%q, %v) = false", err, s)
				}
			}
			if n := strings.Count(err.Error(), "mutex: "); n != 1 {
				t.Errorf("%q names the package %d times; want once", err, n)
			}
		})
	}
}
