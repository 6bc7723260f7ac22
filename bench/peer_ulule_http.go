//go:build peers

package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"time"

	ulule "github.com/ulule/limiter/v3"
	"github.com/ulule/limiter/v3/drivers/middleware/stdlib"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"
)

// ulule/limiter's net/http middleware (drivers/middleware/stdlib) with its
// Redis store, at the same rate per client address as sluice's middleware
// (a fixed window of a second instead of GCRA). It reads the client address
// from X-Forwarded-For, which it trusts from any peer (it has no list of
// trusted proxies); IPv6 addresses are keyed by /64, as sluice's are.
func init() {
	httpPeers = append(httpPeers, func(ctx context.Context, s *server, ns string) (*httpTarget, error) {
		client := s.goRedis()
		store, err := ululeredis.NewStoreWithOptions(client, ulule.StoreOptions{Prefix: ns + "ulule"})
		if err != nil {
			_ = client.Close()
			return nil, err
		}
		l := ulule.New(store, ulule.Rate{Period: time.Second, Limit: httpRate},
			ulule.WithTrustForwardHeader(true), ulule.WithIPv6Mask(net.CIDRMask(64, 128)))
		srv := httptest.NewServer(stdlib.NewMiddleware(l).Handler(http.HandlerFunc(okHandler)))
		return &httpTarget{name: "ulule/limiter middleware (fixed)", url: srv.URL,
			close: func() { srv.Close(); _ = client.Close() }}, nil
	})
}
