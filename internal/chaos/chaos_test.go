package chaos

import (
	"testing"

	"github.com/sluicekit/sluice/internal/redistest"
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
