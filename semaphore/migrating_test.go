package semaphore_test

import (
	"context"
	"strconv"
	"strings"
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

	key := keyspace.Key(e.prefix, name, "")
	slot, err := e.client.Do(context.Background(), e.client.B().ClusterKeyslot().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	from, err := c.Owner(int(slot))
	if err != nil {
		t.Fatal(err)
	}
	to := c.Nodes[0]
	if to == from {
		to = c.Nodes[1]
	}
	fromID, err := from.Do("CLUSTER", "MYID")
	if err != nil {
		t.Fatal(err)
	}
	toID, err := to.Do("CLUSTER", "MYID")
	if err != nil {
		t.Fatal(err)
	}
	sl := strconv.Itoa(int(slot))
	if _, err := to.Do("CLUSTER", "SETSLOT", sl, "IMPORTING", strings.TrimSpace(fromID)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { to.Do("CLUSTER", "SETSLOT", sl, "STABLE") })
	if _, err := from.Do("CLUSTER", "SETSLOT", sl, "MIGRATING", strings.TrimSpace(toID)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { from.Do("CLUSTER", "SETSLOT", sl, "STABLE") })

	if err := p.Release(context.Background()); err != nil {
		t.Fatalf("Release of the last permit while its slot migrates: %v", err)
	}
	if n := e.keysLeft(t, name); n != keysLeft {
		t.Errorf("%d keys of the semaphore left after its last permit's release, want %d", n, keysLeft)
	}
}
