package goredis_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice/goredis"
	"github.com/sluicekit/sluice/internal/testkit/failover"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestSentinel runs the Sentinel failover scenario (kill -9 of the primary,
// promotion of a lagging replica, with and without ReplicaAcks) through
// go-redis's failover client, which finds the primary through the
// sentinels and follows it.
func TestSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary, a replica and three sentinels")
	}
	failover.RunSentinel(t, func(t testing.TB, sentinelAddrs []string, masterName string) *scriptcache.Cache {
		t.Helper()
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName:    masterName,
			SentinelAddrs: sentinelAddrs,
		})
		t.Cleanup(func() { rdb.Close() })
		sc, err := goredis.New(context.Background(), rdb)
		if err != nil {
			t.Fatal(err)
		}
		return sc
	})
}
