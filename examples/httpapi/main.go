// Command httpapi is an HTTP API behind a trusted reverse proxy that limits
// each client IP twice: a rate (requests per second, GCRA) and a number of
// requests in flight at once, both counted in Redis so that every replica of
// the API shares them. sluice's metrics are exported to Prometheus on
// /metrics through OpenTelemetry.
//
//	go run ./httpapi -redis 127.0.0.1:6379
//	curl -H 'X-Forwarded-For: 203.0.113.7' 'http://127.0.0.1:8080/work?ms=200'
//	curl http://127.0.0.1:8080/metrics | grep sluice_
//
// The client IP is read from X-Forwarded-For only when the connection comes
// from a trusted proxy (-trusted-proxies, loopback by default, so curl on
// this machine plays the proxy); anyone else is limited by the address
// they connect from, whatever headers they send.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/rueidis"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicekit/sluice"
	sluiceotel "github.com/sluicekit/sluice/otel"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/semaphore"
)

// config is what the command line sets.
type config struct {
	redis    string // host:port of Redis
	listen   string // address to serve on; port 0 picks one
	proxies  string // comma-separated prefixes whose X-Forwarded-For is believed
	rate     int    // requests per second per client IP
	burst    int    // requests at once after a quiet spell
	inFlight int    // requests of one client IP in flight at once
	prefix   string // starts every Redis key, so that runs can be kept apart
}

func main() {
	c := config{}
	flag.StringVar(&c.redis, "redis", "127.0.0.1:6379", "Redis `host:port`")
	flag.StringVar(&c.listen, "listen", "127.0.0.1:8080", "address to serve on")
	flag.StringVar(&c.proxies, "trusted-proxies", "127.0.0.1/32,::1/128", "comma-separated `prefixes` of the proxies whose X-Forwarded-For is believed")
	flag.IntVar(&c.rate, "rate", 5, "requests per second per client IP")
	flag.IntVar(&c.burst, "burst", 10, "requests per client IP at once after a quiet spell")
	flag.IntVar(&c.inFlight, "in-flight", 2, "requests per client IP in flight at once")
	flag.StringVar(&c.prefix, "prefix", "example:httpapi:", "start of every Redis key")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, c, func(addr net.Addr) {
		log.Printf("serving on http://%s: /work?ms=N (limited), /metrics (Prometheus)", addr)
	})
	if err != nil {
		log.Fatal(err)
	}
}

// run serves until ctx ends, then shuts down gracefully. ready is called
// with the listening address once requests are accepted.
func run(ctx context.Context, c config, ready func(net.Addr)) error {
	var proxies []netip.Prefix
	for _, s := range strings.Split(c.proxies, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("-trusted-proxies: %w", err)
		}
		proxies = append(proxies, p)
	}

	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{c.redis}, DisableCache: true})
	if err != nil {
		return fmt.Errorf("redis %s: %w", c.redis, err)
	}
	defer client.Close()

	// Metrics: an OpenTelemetry MeterProvider exporting to a Prometheus
	// registry, and sluice's observer on the script cache, so that the
	// limiter and the semaphores built on it all report.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() {
		if err := mp.Shutdown(context.Background()); err != nil {
			log.Print(err)
		}
	}()
	obs, err := sluiceotel.New(mp, sluiceotel.Options{})
	if err != nil {
		return err
	}
	sc, err := sluice.New(ctx, client, sluice.WithObserver(obs))
	if err != nil {
		return fmt.Errorf("redis %s: %w", c.redis, err)
	}

	// The rate: GCRA, c.rate per second with a bucket of c.burst, per IP.
	limiter, err := ratelimit.New(sc, ratelimit.Options{
		Limit:  ratelimit.Limit{Rate: c.rate, Period: time.Second, Burst: c.burst},
		Prefix: c.prefix + "rl:",
	})
	if err != nil {
		return err
	}
	perIP, err := ratelimit.NewMiddleware(limiter, ratelimit.MiddlewareOptions{
		TrustedProxies: proxies,
		ClientIPHeader: ratelimit.XForwardedFor,
	})
	if err != nil {
		return err
	}

	// In flight: a permit of a Redis semaphore per request, per IP. The
	// Manager renews the permits of long requests and frees those of a
	// process that dies when their lease ends.
	mgr, err := semaphore.NewManager(sc, semaphore.Options{Prefix: c.prefix + "sem:"})
	if err != nil {
		return err
	}
	defer mgr.Close()
	inFlight, err := ratelimit.NewConcurrencyMiddleware(mgr, ratelimit.ConcurrencyOptions{
		Limit:          c.inFlight,
		TrustedProxies: proxies,
		ClientIPHeader: ratelimit.XForwardedFor,
	})
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	// The rate limit goes outside: a flooding client is refused before it
	// takes a permit, so it cannot hold the in-flight slots of its IP busy
	// with requests that the rate would refuse anyway.
	mux.Handle("GET /work", perIP(inFlight(http.HandlerFunc(work))))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })

	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if ready != nil {
		ready(ln.Addr())
	}
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdown)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// work stands for a handler that takes a while: ?ms=N, at most 10 s. It
// stops early when the client goes away, which frees its in-flight permit.
func work(w http.ResponseWriter, r *http.Request) {
	ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
	d := time.Duration(min(max(ms, 0), 10_000)) * time.Millisecond
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		fmt.Fprintf(w, "worked %s\n", d)
	case <-r.Context().Done():
	}
}
