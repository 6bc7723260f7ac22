package sluiceotel_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/rueidis"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/mutex"
	sluiceotel "github.com/sluicekit/sluice/otel"
	"github.com/sluicekit/sluice/ratelimit"
)

// Export sluice's metrics to Prometheus: an OpenTelemetry MeterProvider
// with the Prometheus exporter, the sluice observer on the script cache,
// and /metrics served by promhttp. The example takes a lock and asks a rate
// limiter twice, then prints the sluice series of one scrape (without the
// otel_scope labels).
func Example_prometheus() {
	ctx := context.Background()
	// An in-process Redis stand-in, so that the example runs anywhere; use
	// your Redis's address instead.
	srv, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	// OpenTelemetry with the Prometheus exporter.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		log.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(ctx)

	// The observer goes on the script cache; everything built on it reports.
	obs, err := sluiceotel.New(mp, sluiceotel.Options{})
	if err != nil {
		log.Fatal(err)
	}
	sc, err := sluice.New(ctx, client, sluice.WithObserver(obs))
	if err != nil {
		log.Fatal(err)
	}
	locks, err := mutex.NewLocker(sc, mutex.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	m, err := locks.NewMutex("report")
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	if err := m.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	lim, err := ratelimit.New(sc, ratelimit.Options{Limit: ratelimit.PerMinute(1)})
	if err != nil {
		log.Fatal(err)
	}
	for range 2 {
		if _, err := lim.Allow(ctx, "client-1"); err != nil {
			log.Fatal(err)
		}
	}

	// Scrape /metrics as Prometheus would.
	hs := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer hs.Close()
	resp, err := http.Get(hs.URL + "/metrics")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	scope := regexp.MustCompile(`otel_scope_[a-z_]+="[^"]*",?`)
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		line := lines.Text()
		if strings.HasPrefix(line, "sluice_") && (strings.Contains(line, "_count{") || strings.Contains(line, "_total{")) {
			fmt.Println(strings.Replace(scope.ReplaceAllString(line, ""), ",}", "}", 1))
		}
	}
	// Output:
	// sluice_lock_hold_seconds_count{primitive="mutex"} 1
	// sluice_lock_wait_seconds_count{primitive="mutex"} 1
	// sluice_ratelimit_decisions_total{allowed="false",source="redis"} 1
	// sluice_ratelimit_decisions_total{allowed="true",source="redis"} 1
}
