package semaphore_test

import (
	"context"
	"testing"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// TestReleaseLastPermitInMigratingSlot: the release of a semaphore's last
// permit succeeds while its slot is being migrated away, its keys still
// on the owner.
//
// A script may touch only keys its node holds while the slot migrates: a
// key it deleted itself is refused too ("Script attempted to access a non
// local key"), and the script stops there, its earlier writes made. The
// release removed the permit (and with it the permits' key) and then
// counted the permits left: refused, with the permit gone and neither the
// keys removed nor the waiters woken (the chaos harness, a cluster seed
// with a migrate fault).
//
// With a capacity set (SetCapacity), the last release keeps the state
// hash with the capacity alone: the hash is deleted and written again,
// which the migrating slot refuses the same way.
func TestReleaseLastPermitInMigratingSlot(t *testing.T) {
	for _, tt := range []struct {
		name     string
		setCap   bool
		keysLeft int64
	}{
		{"capacity of the call", false, 0},
		{"capacity set", true, 1},
	} {
		t.Run(tt.name, func(t *testing.T) { releaseInMigratingSlot(t, tt.setCap, tt.keysLeft) })
	}
}

func releaseInMigratingSlot(t *testing.T, setCap bool, keysLeft int64) {
	c := redistest.SharedCluster(t)
	e := newEnv(t, c.Addrs(), semaphore.Options{})
	name := uniqueName(t)
	s := e.sem(t, name, 2)
	if setCap {
		if err := s.SetCapacity(context.Background(), 3); err != nil {
			t.Fatal(err)
		}
	}
	p := acquire(t, s, 1)

	c.StartKeyMigration(t, keyspace.Key(e.prefix, name, ""))

	if err := p.Release(context.Background()); err != nil {
		t.Fatalf("Release of the last permit while its slot migrates: %v", err)
	}
	if n := e.keysLeft(t, name); n != keysLeft {
		t.Errorf("%d keys of the semaphore left after its last permit's release, want %d", n, keysLeft)
	}
}

// TestReclaimLastPermitInMigratingSlot: a call that reclaims a
// semaphore's last permits, all expired (their holder crashed), succeeds
// while the slot migrates, whatever it does next: grant (TryAcquire) or
// only report (Available), with and without a capacity set. Reclaiming the
// last permit removes the permits' key, and the call must not touch that
// key, or a hash it deleted, again (see
// TestReleaseLastPermitInMigratingSlot).
func TestReclaimLastPermitInMigratingSlot(t *testing.T) {
	for _, tt := range []struct {
		name    string
		setCap  bool
		grant   int64 // permits to take (0: Available)
		hashLen int64 // fields left in the state hash
	}{
		{"grant", false, 1, 2},                       // ':cap', ':x'
		{"grant, capacity set", true, 1, 3},          // and ':set'
		{"grant of the whole capacity", false, 3, 4}, // ':cap', ':x', the weight, ':h'
		{"report", false, 0, 0},
		{"report, capacity set", true, 0, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := redistest.SharedCluster(t)
			e := newEnv(t, c.Addrs(), semaphore.Options{})
			name := uniqueName(t)
			s := e.sem(t, name, 3)
			ctx := context.Background()
			hash, permits := keyspace.Key(e.prefix, name, ""), keyspace.Key(e.prefix, name, ":e")
			fields := []string{":cap", "3", ":x", "99999999999999"}
			if tt.setCap {
				fields = append(fields, ":set", "60000")
			}
			// Two expired permits, one of weight 2 (the state a crashed
			// holder leaves).
			fields = append(fields, "heavy", "2", ":h", "1")
			for _, cmd := range [][]string{
				append([]string{"HSET", hash}, fields...),
				{"ZADD", permits, "1", "dead", "2", "heavy"},
				{"PEXPIRE", hash, "120000"},
				{"PEXPIRE", permits, "120000"},
			} {
				if err := e.client.Do(ctx, e.client.B().Arbitrary(cmd...).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			end := c.StartKeyMigration(t, hash)

			var p *semaphore.Permit
			if tt.grant > 0 {
				var err error
				if p, err = s.TryAcquire(ctx, tt.grant); err != nil {
					t.Fatalf("TryAcquire past the last permits, expired, while the slot migrates: %v", err)
				}
				defer p.Release(ctx)
			} else if n, err := s.Available(ctx); err != nil || n != 3 {
				t.Fatalf("Available past the last permits, expired, while the slot migrates = %d, %v; want 3", n, err)
			}
			end() // (a key read while the slot migrates may be redirected)
			ids, err := e.client.Do(ctx, e.client.B().Zrange().Key(permits).Min("0").Max("-1").Build()).AsStrSlice()
			if err != nil {
				t.Fatal(err)
			}
			if tt.grant > 0 {
				if len(ids) != 1 || ids[0] != p.ID() {
					t.Errorf("permits listed %q, want only %q", ids, p.ID())
				}
			} else if len(ids) != 0 {
				t.Errorf("permits listed %q, want none", ids)
			}
			n, err := e.client.Do(ctx, e.client.B().Hlen().Key(hash).Build()).AsInt64()
			if err != nil || n != tt.hashLen {
				f, _ := e.client.Do(ctx, e.client.B().Hgetall().Key(hash).Build()).AsStrMap()
				t.Errorf("state hash %v (%d fields, %v), want %d fields", f, n, err, tt.hashLen)
			}
			// A hash kept expires when its ':x' says (a floor of its
			// expiry, which the call set).
			if tt.hashLen > 0 {
				x, err := e.client.Do(ctx, e.client.B().Hget().Key(hash).Field(":x").Build()).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				at, err := e.client.Do(ctx, e.client.B().Pexpiretime().Key(hash).Build()).AsInt64()
				if err != nil || at != x {
					t.Errorf("state hash expires at %d (%v), its ':x' is %d: want them equal", at, err, x)
				}
			}
			// The grant counted, the expired permits' weight gone.
			want := 3 - tt.grant
			if free, err := s.Available(ctx); err != nil || free != want {
				t.Errorf("Available after = %d, %v; want %d", free, err, want)
			}
		})
	}
}
