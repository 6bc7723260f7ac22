package goredis_test

import (
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice/goredis"
	"github.com/sluicekit/sluice/internal/testkit/clienttest"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// newClient returns a go-redis client of addrs, closed when t ends: a
// *redis.Client for one address, a *redis.ClusterClient for several.
func newClient(protocol int) clienttest.NewClient { return newClientWith(protocol, false) }

// newClientWith is newClient with ContextTimeoutEnabled as given.
func newClientWith(protocol int, ctxTimeout bool) clienttest.NewClient {
	return func(t testing.TB, addrs []string) scriptcache.Client {
		t.Helper()
		var rdb redis.UniversalClient
		if len(addrs) == 1 {
			rdb = redis.NewClient(&redis.Options{Addr: addrs[0], Protocol: protocol, ContextTimeoutEnabled: ctxTimeout})
		} else {
			rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Protocol: protocol, ContextTimeoutEnabled: ctxTimeout})
		}
		t.Cleanup(func() { rdb.Close() })
		c, err := goredis.Wrap(rdb)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

// TestClient runs the client suite on go-redis with RESP3, go-redis's
// default, where Lua booleans and doubles come back as RESP3 types.
func TestClient(t *testing.T) { clienttest.Run(t, newClient(3)) }

// TestClientContextTimeout runs it with ContextTimeoutEnabled, where a
// call with a deadline runs in its caller's goroutine and go-redis ends it
// at the deadline (testEvalCancel: it returns the deadline's error, not
// go-redis's timeout).
func TestClientContextTimeout(t *testing.T) { clienttest.Run(t, newClientWith(3, true)) }

// TestClientCoalesced runs it with one round trip in flight at a time, so
// that every call that comes while another is under way (a watchdog
// renewal during a Lock, a waiter's retry, a release) goes out in a
// pipeline of queued calls: the path coalescing takes under load.
func TestClientCoalesced(t *testing.T) {
	newC := newClient(3)
	clienttest.Run(t, func(t testing.TB, addrs []string) scriptcache.Client {
		c := newC(t, addrs).(*goredis.Client)
		goredis.SetMaxInFlight(c, 1)
		return c
	})
}

// TestClientRESP2 runs it with RESP2.
func TestClientRESP2(t *testing.T) {
	if testing.Short() {
		t.Skip("RESP3 is enough in short mode")
	}
	clienttest.Run(t, newClient(2))
}

func TestWrapRefuses(t *testing.T) {
	if _, err := goredis.Wrap(nil); !errors.Is(err, goredis.ErrNilClient) {
		t.Errorf("Wrap(nil) = %v, want ErrNilClient", err)
	}
	if _, err := goredis.Wrap((*redis.Client)(nil)); !errors.Is(err, goredis.ErrNilClient) {
		t.Errorf("Wrap(nil *Client) = %v, want ErrNilClient", err)
	}
	if _, err := goredis.Wrap((*redis.ClusterClient)(nil)); !errors.Is(err, goredis.ErrNilClient) {
		t.Errorf("Wrap(nil *ClusterClient) = %v, want ErrNilClient", err)
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	if _, err := goredis.Wrap(ring); !errors.Is(err, goredis.ErrRing) {
		t.Errorf("Wrap(ring) = %v, want ErrRing", err)
	}
}
