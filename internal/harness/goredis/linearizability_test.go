package goredis_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice/goredis"
	"github.com/sluicekit/sluice/internal/harness/linearizability"
	"github.com/sluicekit/sluice/scriptcache"
)

// newCache returns a cache on a go-redis client of addrs, closed when t
// ends: a *redis.Client for one address, a *redis.ClusterClient for
// several. go-redis's defaults otherwise (RESP3, pool, timeouts).
func newCache(t testing.TB, addrs []string, opts ...scriptcache.Option) *scriptcache.Cache {
	t.Helper()
	var rdb redis.UniversalClient
	if len(addrs) == 1 {
		rdb = redis.NewClient(&redis.Options{Addr: addrs[0]})
	} else {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	}
	t.Cleanup(func() { rdb.Close() })
	sc, err := goredis.New(context.Background(), rdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// TestLinearizable records histories of mutex, semaphore and every rate
// limiter run on go-redis by several processes (this test binary,
// re-executed: in them this test is the helper's body), on one server and
// on a cluster, and checks them with porcupine: the suite the core runs on
// rueidis.
func TestLinearizable(t *testing.T) { linearizability.Run(t, newCache) }
