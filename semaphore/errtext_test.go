package semaphore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// TestErrorText checks representative errors read the package's name once
// ("semaphore: permit not held: permit lost: ...", not "semaphore: permit
// not held: semaphore: permit lost: ...") while errors.Is finds every
// sentinel they wrap.
func TestErrorText(t *testing.T) {
	ctx := context.Background()
	addrs := []string{redistest.Single(t).Addr()}
	e := newEnv(t, addrs, semaphore.Options{})
	for _, tc := range []struct {
		what string
		err  func(t *testing.T, name string) error
		want string // %s is the name
		is   []error
	}{
		{"release after the key was deleted", func(t *testing.T, name string) error {
			p := acquire(t, e.sem(t, name, 2), 1)
			if err := e.client.Do(ctx, e.client.B().Del().Key(keyspace.Key(e.prefix, name, "")).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			return p.Release(ctx)
		}, `semaphore: permit not held: permit lost: "%s": found not held at release`, []error{semaphore.ErrNotHeld, semaphore.ErrLost}},
		{"loss by Close", func(t *testing.T, name string) error {
			e := newEnv(t, addrs, semaphore.Options{})
			p := acquire(t, e.sem(t, name, 2), 1)
			e.mgr.Close()
			return waitLost(t, p)
		}, `semaphore: permit lost: "%s": manager closed: lease keeper closed`, []error{semaphore.ErrLost, semaphore.ErrClosed}},
		{"release of a permit lost by Close, then deleted", func(t *testing.T, name string) error {
			e := newEnv(t, addrs, semaphore.Options{})
			p := acquire(t, e.sem(t, name, 2), 1)
			e.mgr.Close()
			waitLost(t, p)
			if err := e.client.Do(ctx, e.client.B().Del().Key(keyspace.Key(e.prefix, name, "")).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			return p.Release(ctx)
		}, `semaphore: permit not held: permit lost: "%s": manager closed: lease keeper closed`, []error{semaphore.ErrNotHeld, semaphore.ErrLost, semaphore.ErrClosed}},
		{"try acquire of a full semaphore", func(t *testing.T, name string) error {
			s := e.sem(t, name, 1)
			acquire(t, s, 1)
			_, err := s.TryAcquire(ctx, 1)
			return err
		}, `semaphore: not obtained: "%s" has fewer than 1 permits free`, []error{semaphore.ErrNotObtained}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			name := uniqueName(t)
			err := tc.err(t, name)
			if err == nil {
				t.Fatal("no error")
			}
			want := strings.ReplaceAll(tc.want, "%s", name)
			if got := err.Error(); got != want {
				t.Errorf("got %q; want %q", got, want)
			}
			for _, s := range tc.is {
				if !errors.Is(err, s) {
					t.Errorf("errors.Is(%q, %v) = false", err, s)
				}
			}
			if n := strings.Count(err.Error(), "semaphore: "); n != 1 {
				t.Errorf("%q names the package %d times; want once", err, n)
			}
		})
	}
}
