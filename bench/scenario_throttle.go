package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"time"

	"github.com/sluicekit/sluice/ratelimit"
)

// throttleScenario: per-IP HTTP throttling. An in-process HTTP server on
// loopback runs ratelimit.Middleware behind a "proxy" it trusts (loopback),
// so each simulated client is told apart by its X-Forwarded-For address.
// A few polite clients stay under the limit; one floods. The polite ones must
// never be denied, and the flooder must get no more than the limit allows.
func throttleScenario(ctx context.Context, s *server, ns string, quick bool) scenario {
	sc := scenario{Name: "per-IP HTTP throttling"}
	const ratePerSec, politeRate, politeClients, floodConns = 10, 4, 3, 8
	dur := 2 * time.Second
	if quick {
		dur = time.Second
	}
	cache, client, err := openCache(ctx, s)
	if err != nil {
		sc.Err = err.Error()
		return sc
	}
	defer client.Close()
	l, err := ratelimit.New(cache, ratelimit.Options{
		Algorithm: ratelimit.GCRA,
		Limit:     ratelimit.PerSecond(ratePerSec),
		Prefix:    ns + "http:",
	})
	if err != nil {
		sc.Err = err.Error()
		return sc
	}
	mw := ratelimit.MustNewMiddleware(l, ratelimit.MiddlewareOptions{
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")},
	})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})))
	defer srv.Close()
	transport := &http.Transport{MaxIdleConnsPerHost: floodConns + politeClients}
	defer transport.CloseIdleConnections()
	hc := &http.Client{Transport: transport, Timeout: 5 * time.Second}

	// tally counts one client's answers; its goroutines share it.
	type tally struct {
		mu                     sync.Mutex
		allowed, denied, other int
	}
	get := func(ip string, t *tally) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		req.Header.Set("X-Forwarded-For", ip)
		resp, err := hc.Do(req)
		t.mu.Lock()
		defer t.mu.Unlock()
		if err != nil {
			t.other++
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			t.allowed++
		case http.StatusTooManyRequests:
			t.denied++
		default:
			t.other++
		}
	}

	polite := make([]tally, politeClients)
	var flood tally
	const floodIP = "198.51.100.66"
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(dur)
	for i := range polite {
		wg.Go(func() {
			ip := fmt.Sprintf("203.0.113.%d", 10+i)
			tick := time.NewTicker(time.Second / politeRate)
			defer tick.Stop()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				get(ip, &polite[i])
				<-tick.C
			}
		})
	}
	for range floodConns {
		wg.Go(func() {
			for n := 0; n < 100_000 && time.Now().Before(deadline) && ctx.Err() == nil; n++ {
				get(floodIP, &flood)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	sc.Lines = append(sc.Lines, fmt.Sprintf("GCRA %d/s per client IP (burst %d), %.1fs, in-process server behind a trusted proxy", ratePerSec, ratePerSec, elapsed.Seconds()))
	ok := true
	for i := range polite {
		t := &polite[i]
		who := fmt.Sprintf("client 203.0.113.%d (polite, %d req/s):", 10+i, politeRate)
		sc.Lines = append(sc.Lines, fmt.Sprintf("%-46s %6d allowed %7d denied %d failed", who, t.allowed, t.denied, t.other))
		ok = ok && t.denied == 0 && t.other == 0 && t.allowed > 0
	}
	most := ratePerSec + int(float64(ratePerSec)*elapsed.Seconds()) + 1
	who := fmt.Sprintf("client %s (flooding, %d connections):", floodIP, floodConns)
	sc.Lines = append(sc.Lines, fmt.Sprintf("%-46s %6d allowed %7d denied %d failed (%.0f req/s)",
		who, flood.allowed, flood.denied, flood.other, float64(flood.allowed+flood.denied)/elapsed.Seconds()))
	ok = ok && flood.other == 0 && flood.allowed <= most && flood.denied > 0
	sc.Lines = append(sc.Lines, fmt.Sprintf("check: polite clients never denied; flooder allowed %d <= burst + rate x time = %d", flood.allowed, most))
	sc.OK = ok
	return sc
}
