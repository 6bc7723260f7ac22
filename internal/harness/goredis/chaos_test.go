package goredis_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice/goredis"
	"github.com/sluicekit/sluice/internal/harness/chaos"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestChaos runs the core's fault harness (internal/chaos) with the
// primitives on go-redis: one seed of the short run on a single server
// behind fault proxies. SLUICE_CHAOS_SEED, SLUICE_CHAOS and
// SLUICE_CHAOS_FAULTS work as in the core's TestChaos, and
// -run 'TestChaos/cluster' runs seeds on a cluster.
func TestChaos(t *testing.T) {
	chaos.Suite(t,
		chaos.Variant{Name: "single", Seeds: []uint64{1}, Config: chaos.Config{Client: chaosClient, RouteClient: smallPool}},
		chaos.Variant{Name: "cluster", Config: chaos.Config{Client: chaosClient, RouteClient: smallPool, Cluster: true}},
		// ContextTimeoutEnabled, which the README recommends: calls with a
		// deadline run in their callers' goroutines.
		chaos.Variant{Name: "single-deadlines", Seeds: []uint64{1}, Config: chaos.Config{Client: chaosClientDeadlines, RouteClient: smallPool}},
	)
}

// chaosClient builds a node's script cache on go-redis. The harness
// blackholes a node's proxy for up to two leases (4 s): go-redis must not
// wait for such a server forever. The adapter returns when the caller's
// context ends, but the call itself and its pooled connection go on until
// ReadTimeout (WriteTimeout for a send), and a dial until DialTimeout: a
// lease each, so that the pool recovers soon after a fault ends, and a
// second for the dial, which Close's bound counts on. MaxRetries -1: the
// adapter already sends scripts as commands go-redis never retries; the
// rest (SCRIPT LOAD, PING) are not retried either, so that no call outlives
// its timeout by retries.
func chaosClient(ctx context.Context, addrs []string, cluster bool) (*scriptcache.Cache, func(), error) {
	return chaosClientWith(ctx, addrs, cluster, false)
}

// chaosClientDeadlines is chaosClient with ContextTimeoutEnabled.
func chaosClientDeadlines(ctx context.Context, addrs []string, cluster bool) (*scriptcache.Cache, func(), error) {
	return chaosClientWith(ctx, addrs, cluster, true)
}

func chaosClientWith(ctx context.Context, addrs []string, cluster, deadlines bool) (*scriptcache.Cache, func(), error) {
	const lease = 2 * time.Second // chaos.Config's default Lease
	var rdb redis.UniversalClient
	if cluster {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DialTimeout: time.Second,
			ReadTimeout: lease, WriteTimeout: lease, MaxRetries: -1, ContextTimeoutEnabled: deadlines})
	} else {
		rdb = redis.NewClient(&redis.Options{Addr: addrs[0], DialTimeout: time.Second,
			ReadTimeout: lease, WriteTimeout: lease, MaxRetries: -1, ContextTimeoutEnabled: deadlines})
	}
	sc, err := goredis.New(ctx, rdb)
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	return sc, func() { rdb.Close() }, nil
}

// smallPool is the client of a node's rate-limit routes, gRPC server and
// Checker: go-redis with a pool of two connections and a PoolTimeout
// shorter than the routes' Timeout (200 ms), so that a slowed or
// blackholed network, which holds both connections for ReadTimeout,
// exhausts the pool: go-redis then answers redis.ErrPoolTimeout, an
// outage that the routes' fallbacks must decide.
func smallPool(ctx context.Context, addrs []string, cluster bool) (*scriptcache.Cache, func(), error) {
	const lease = 2 * time.Second
	var rdb redis.UniversalClient
	if cluster {
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DialTimeout: time.Second, ReadTimeout: lease, WriteTimeout: lease,
			MaxRetries: -1, PoolSize: 2, PoolTimeout: 50 * time.Millisecond})
	} else {
		rdb = redis.NewClient(&redis.Options{Addr: addrs[0], DialTimeout: time.Second, ReadTimeout: lease, WriteTimeout: lease,
			MaxRetries: -1, PoolSize: 2, PoolTimeout: 50 * time.Millisecond})
	}
	sc, err := goredis.New(ctx, rdb)
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	return sc, func() { rdb.Close() }, nil
}
