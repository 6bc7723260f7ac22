package failover_test

import (
	"context"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/failover"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestSentinelRueidis runs the Sentinel failover scenario with a rueidis
// client that finds the primary through the sentinels.
func TestSentinelRueidis(t *testing.T) {
	failover.RunSentinel(t, func(t testing.TB, sentinelAddrs []string, masterName string) *scriptcache.Cache {
		t.Helper()
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress:  sentinelAddrs,
			Sentinel:     rueidis.SentinelOption{MasterSet: masterName},
			DisableCache: true,
		})
		if err != nil {
			t.Fatalf("rueidis sentinel client for %v: %v", sentinelAddrs, err)
		}
		t.Cleanup(c.Close)
		sc, err := scriptcache.New(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		return sc
	})
}
