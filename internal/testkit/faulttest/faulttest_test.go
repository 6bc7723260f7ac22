package faulttest

import (
	"context"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestMain stops the servers and then fails the run if any goroutine of a
// proxy, client, Locker or Manager outlived its test (goleak).
func TestMain(m *testing.M) { redistest.Main(m) }

// newRueidisCache builds the caches under test on rueidis, the core's
// client.
func newRueidisCache(t testing.TB, addr string, o ClientOptions) *scriptcache.Cache {
	t.Helper()
	opt := rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true}
	if o.Quiet {
		// rueidis PINGs a connection idle for Dialer.KeepAlive (1 s by
		// default): when that PING's reply is the one dropped, later calls
		// wait behind it and never reach Redis (a dead connection, not a
		// lost reply). With several pipelining connections it picks one at
		// random per call, and one dialed while replies are dropped never
		// finishes its handshake, so the request would never be sent.
		opt.Dialer.KeepAlive = -1
		opt.PipelineMultiplex = -1 // 2^0: one connection
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("client for %s: %v", addr, err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), signalWait)
	defer cancel()
	sc, err := scriptcache.New(ctx, c)
	if err != nil {
		t.Fatalf("scriptcache.New: %v", err)
	}
	return sc
}

// TestFaults runs every scenario on rueidis; module
// github.com/sluicekit/sluice/goredis runs them on go-redis.
func TestFaults(t *testing.T) { Run(t, newRueidisCache) }
