package redistest

import (
	"strconv"
	"strings"
	"testing"

	"github.com/sluicekit/sluice/internal/keyspace"
)

// TestMigrateSlot moves a slot with keys in it: the keys reach the new
// owner with their TTLs, the old owner keeps none, and every node names
// the new owner. It also pins what keeps a migration from leaving keys
// behind: an owner refuses SETSLOT NODE while it holds keys of the slot.
func TestMigrateSlot(t *testing.T) {
	Skip(t)
	c, err := StartCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	slot := int(keyspace.Slot("{m0}"))
	from, err := c.Owner(slot)
	if err != nil {
		t.Fatal(err)
	}
	to := c.Nodes[0]
	if to == from {
		to = c.Nodes[1]
	}
	for i := range 5 {
		if _, err := from.Do("SET", "k{m0}"+strconv.Itoa(i), "v", "PX", "60000"); err != nil {
			t.Fatal(err)
		}
	}
	toID, _ := to.Do("CLUSTER", "MYID")
	if _, err := from.Do("CLUSTER", "SETSLOT", strconv.Itoa(slot), "NODE", toID); err == nil || !strings.Contains(err.Error(), "keys") {
		t.Fatalf("SETSLOT NODE on an owner with keys: %v, want a refusal", err)
	}
	steps := 0
	if err := c.MigrateSlot(slot, to, 2, func() { steps++ }); err != nil {
		t.Fatal(err)
	}
	if steps != 3 {
		t.Errorf("between called %d times, want 3 (5 keys, 2 at a time)", steps)
	}
	if n, _ := from.Do("CLUSTER", "COUNTKEYSINSLOT", strconv.Itoa(slot)); n != "0" {
		t.Errorf("old owner keeps %s keys", n)
	}
	if n, _ := to.Do("CLUSTER", "COUNTKEYSINSLOT", strconv.Itoa(slot)); n != "5" {
		t.Errorf("new owner has %s keys, want 5", n)
	}
	if ttl, _ := to.Do("PTTL", "k{m0}0"); ttl == "-1" || ttl == "-2" {
		t.Errorf("PTTL after the move: %s", ttl)
	}
	for _, n := range c.Nodes {
		out, err := n.Do("CLUSTER", "NODES")
		if got := slotOwner(out, slot); err != nil || got != to.Addr() {
			t.Errorf("%s sees %q (%v) own the slot, want %s", n.Addr(), got, err, to.Addr())
		}
	}
}
