package goredis_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice/goredis"
	"github.com/sluicekit/sluice/internal/testkit/faulttest"
	"github.com/sluicekit/sluice/scriptcache"
)

// newFaultCache returns a cache on a go-redis client of the server (or
// fault proxy) at addr, closed when t ends, with go-redis's defaults.
// ClientOptions.Quiet needs nothing more: go-redis sends nothing on an
// idle connection (its health check before reuse only peeks at the
// socket), and it sends a call on a connection of its pool that no other
// call is using.
func newFaultCache(t testing.TB, addr string, o faulttest.ClientOptions) *scriptcache.Cache {
	return newFaultCacheWith(false)(t, addr, o)
}

// newFaultCacheWith is newFaultCache with ContextTimeoutEnabled as given.
func newFaultCacheWith(ctxTimeout bool) func(t testing.TB, addr string, _ faulttest.ClientOptions) *scriptcache.Cache {
	return func(t testing.TB, addr string, _ faulttest.ClientOptions) *scriptcache.Cache {
		t.Helper()
		rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: ctxTimeout})
		t.Cleanup(func() { rdb.Close() })
		sc, err := goredis.New(context.Background(), rdb)
		if err != nil {
			t.Fatal(err)
		}
		return sc
	}
}

// TestFaultsCoalesced runs them with one round trip in flight at a time
// (see TestClientCoalesced): no false loss under latency although a
// renewal may wait for the call in flight, losses signalled under a
// blackhole, no call sent twice after a lost reply.
func TestFaultsCoalesced(t *testing.T) {
	faulttest.Run(t, func(t testing.TB, addr string, _ faulttest.ClientOptions) *scriptcache.Cache {
		t.Helper()
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { rdb.Close() })
		c, err := goredis.Wrap(rdb)
		if err != nil {
			t.Fatal(err)
		}
		goredis.SetMaxInFlight(c, 1)
		sc, err := scriptcache.NewFrom(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		return sc
	})
}

// TestFaults runs the fault scenarios (latency, blackhole, lost replies,
// pub/sub reset, SCRIPT FLUSH storm, kill -9 restart) with the primitives
// on go-redis: the suite the core runs on rueidis.
func TestFaults(t *testing.T) { faulttest.Run(t, newFaultCache) }

// TestFaultsContextTimeout runs them with ContextTimeoutEnabled: calls
// with deadlines run in their callers' goroutines, and Close must still
// not wait for a server that stopped answering.
func TestFaultsContextTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("the default options are enough in short mode")
	}
	faulttest.Run(t, newFaultCacheWith(true))
}
