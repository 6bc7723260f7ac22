// Package semlin_test checks histories of the fair semaphore, recorded on a
// real server, against a sequential model (porcupine). It lives in the
// harness module so that porcupine is not a requirement of the core module.
package semlin_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// signalWait bounds waits for things that must happen; generous for a
// loaded machine.
const signalWait = 10 * time.Second

// forTargets runs f as a subtest on a single server and on a cluster.
func forTargets(t *testing.T, f func(t *testing.T, addrs []string)) {
	t.Run("single", func(t *testing.T) { f(t, []string{redistest.Single(t).Addr()}) })
	t.Run("cluster", func(t *testing.T) { f(t, redistest.SharedCluster(t).Addrs()) })
}

// uniqueName is a semaphore name no other test uses.
func uniqueName(t testing.TB) string {
	return strings.ReplaceAll(t.Name(), "/", ":") + ":" + uuid.NewString()[:8]
}
