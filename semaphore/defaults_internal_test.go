package semaphore

import (
	"testing"

	"github.com/sluicekit/sluice/internal/lease"
)

// TestDefaultsMatchLease checks that the defaults this package documents
// (written as values so that go doc shows them) are the ones the lease
// configuration applies to a zero Options.
func TestDefaultsMatchLease(t *testing.T) {
	if DefaultWatchdogLease != lease.DefaultWatchdogLease || DefaultReplicaTimeout != lease.DefaultReplicaTimeout {
		t.Fatalf("defaults %v, %v; the lease package applies %v, %v",
			DefaultWatchdogLease, DefaultReplicaTimeout, lease.DefaultWatchdogLease, lease.DefaultReplicaTimeout)
	}
}
