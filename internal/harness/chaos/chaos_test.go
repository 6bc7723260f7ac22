package chaos

import (
	"strconv"
	"testing"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestChaos runs the harness on rueidis: two seeds on a single server
// behind fault proxies, one on a 3-master cluster of its own (see Suite
// for the soak and the replay of one seed). The go-redis module runs it
// on go-redis.
func TestChaos(t *testing.T) {
	Suite(t,
		Variant{Name: "single", Seeds: []uint64{1, 2}},
		Variant{Name: "cluster", Seeds: []uint64{1}, Config: Config{Cluster: true}},
	)
}

// TestResourcesSpread: on a cluster as redistest.StartCluster(3) splits
// it, the lock names lie on three masters (so MultiMutex sets span slots
// and nodes), and every master owns some resource.
func TestResourcesSpread(t *testing.T) {
	master := func(res string) int { return int(keyspace.Slot(holderKeys(res)[0])) / (16384 / 3) }
	locks := map[int]bool{}
	for i := range lockNames {
		locks[master("m"+strconv.Itoa(i))] = true
	}
	if len(locks) != 3 {
		t.Errorf("lock names on masters %v, want all three", locks)
	}
	all := map[int]bool{}
	for _, res := range resources {
		all[master(res)] = true
	}
	if len(all) != 3 {
		t.Errorf("resources on masters %v, want all three", all)
	}
}
