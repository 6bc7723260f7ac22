package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// TestSetCapacityKeptAfterRelease: a capacity set by SetCapacity is kept
// for CapacityRetention after the semaphore's last release, also when the
// release leaves other permits stored (whose holders may have died: they
// will neither release nor renew). Permits of a 2 h fixed lease, with the
// keys' expiry moved back by hand an hour, as if SetCapacity and the
// grants had been an hour ago; a release must then move it forward again.
// Unfair (semaphore_release) and fair (semaphore_queue's release).
func TestSetCapacityKeptAfterRelease(t *testing.T) {
	for _, fair := range []bool{false, true} {
		t.Run(map[bool]string{false: "unfair", true: "fair"}[fair], func(t *testing.T) {
			ctx := context.Background()
			srv := redistest.Single(t)
			e := newEnv(t, []string{srv.Addr()}, semaphore.Options{Lease: 2 * time.Hour, Fair: fair})
			s := e.sem(t, uniqueName(t), 3)
			if err := s.SetCapacity(ctx, 2); err != nil {
				t.Fatal(err)
			}
			a, b := acquire(t, s, 1), acquire(t, s, 1)
			defer b.Release(ctx)
			keys := []string{keyspace.Key(semaphore.DefaultPrefix, s.Name(), ""), keyspace.Key(semaphore.DefaultPrefix, s.Name(), ":e")}
			hourAgo := (semaphore.CapacityRetention - time.Hour).Milliseconds()
			for _, k := range keys {
				if err := e.client.Do(ctx, e.client.B().Pexpire().Key(k).Milliseconds(hourAgo).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.Release(ctx); err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				ttl, err := e.client.Do(ctx, e.client.B().Pttl().Key(k).Build()).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				// A minute of slack for a loaded machine; the old expiry is
				// an hour short.
				if got := time.Duration(ttl) * time.Millisecond; got < semaphore.CapacityRetention-time.Minute {
					t.Errorf("%s expires in %v after a release, want CapacityRetention (%v)", k, got, semaphore.CapacityRetention)
				}
			}
			if n := available(t, s); n != 1 {
				t.Errorf("Available = %d, want 1 of the set capacity 2", n)
			}
		})
	}
}
