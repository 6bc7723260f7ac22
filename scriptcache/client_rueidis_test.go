package scriptcache_test

import (
	"context"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/clienttest"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestRueidisClient runs the client suite that every scriptcache.Client
// runs (the go-redis adapter too) on the rueidis client of New.
func TestRueidisClient(t *testing.T) {
	clienttest.Run(t, func(t testing.TB, addrs []string) scriptcache.Client {
		t.Helper()
		sc, err := scriptcache.New(context.Background(), redistest.Client(t, addrs...))
		if err != nil {
			t.Fatal(err)
		}
		return sc.Client()
	})
}
