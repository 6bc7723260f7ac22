package linearizability

import (
	"context"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// newRueidisCache builds the helpers' caches on rueidis, the core's client.
func newRueidisCache(t testing.TB, addrs []string, opts ...scriptcache.Option) *scriptcache.Cache {
	t.Helper()
	sc, err := scriptcache.New(context.Background(), redistest.Client(t, addrs...), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// TestLinearizable records and checks the histories of mutex, semaphore
// and rate limiter on rueidis; module github.com/sluicekit/sluice/goredis
// runs the same on go-redis.
func TestLinearizable(t *testing.T) { Run(t, newRueidisCache) }
