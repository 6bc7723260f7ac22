// Command sluice-ratelimit is a rate limit service for Envoy (and Istio,
// Contour, Gloo/kgateway, Emissary): envoy.service.ratelimit.v3 over gRPC,
// configured in envoyproxy/ratelimit's YAML format, deciding with sluice
// (package github.com/sluicekit/sluice/envoy/rls): every descriptor of a
// request in one atomic script, and a denied request counted in none.
//
//	go run ./cmd/sluice-ratelimit
//
// starts on an embedded miniredis with an example configuration, gRPC on
// :8081; then, from another shell,
//
//	go run ./cmd/sluice-ratelimit query -domain example -d org=acme -d user=alice
//
// asks it. With -redis (single server, cluster seed list, or sentinels
// with -sentinel-master) it runs on Redis; -config names the YAML files or
// directories, reloaded when they change. Every flag can also be set in
// the environment: SLUICE_RL_ and the flag's name in capitals with '_' for
// '-' (SLUICE_RL_REDIS=10.0.0.5:6379); the Redis password is read only
// from SLUICE_RL_REDIS_PASSWORD.
package main

import (
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/rueidis"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/envoy/rls"
	sluiceotel "github.com/sluicekit/sluice/otel"
	"github.com/sluicekit/sluice/ratelimit"
)

//go:embed example.yaml
var exampleConfig []byte

// envPrefix starts the environment variable of every flag.
const envPrefix = "SLUICE_RL_"

type config struct {
	grpcAddr, metricsAddr           string
	configPaths                     string
	redis, sentinelMaster, username string
	redisTLS                        bool
	prefix                          string
	timeout, reloadInterval, grace  time.Duration
	fallbackLocal, shadow, check    bool
	headers                         string
	maxRequestBytes                 int
	logFormat, logLevel             string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "query" {
		if err := query(os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "sluice-ratelimit query:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-ratelimit:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, getenv func(string) string) (config, error) {
	var c config
	fs := flag.NewFlagSet("sluice-ratelimit", flag.ContinueOnError)
	fs.StringVar(&c.grpcAddr, "grpc-addr", ":8081", "gRPC listen `address` (ShouldRateLimit, health, reflection)")
	fs.StringVar(&c.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on http://`address`/metrics; empty: none")
	fs.StringVar(&c.configPaths, "config", "", "comma-separated YAML `files or directories` (envoyproxy/ratelimit's format); empty: the built-in example")
	fs.StringVar(&c.redis, "redis", "", "comma-separated Redis `addresses`: a server, a cluster's seed list, or sentinels with -sentinel-master; empty: an embedded miniredis")
	fs.StringVar(&c.sentinelMaster, "sentinel-master", "", "the master set `name`: -redis lists sentinels")
	fs.StringVar(&c.username, "redis-username", "", "Redis ACL user (the password comes from "+envPrefix+"REDIS_PASSWORD)")
	fs.BoolVar(&c.redisTLS, "redis-tls", false, "connect to Redis with TLS (system roots)")
	fs.StringVar(&c.prefix, "prefix", "sluice:envoy:", "prefix of every Redis key")
	fs.DurationVar(&c.timeout, "timeout", ratelimit.DefaultTimeout, "bound on the wait for Redis per request")
	fs.BoolVar(&c.fallbackLocal, "fallback-local", false, "while Redis is unavailable, decide with in-process buckets (per process) instead of answering UNAVAILABLE")
	fs.BoolVar(&c.shadow, "shadow-mode", false, "decide and count, but answer OK to every request (global shadow mode)")
	fs.StringVar(&c.headers, "headers", "none", "response headers: none, ietf (RateLimit-Policy, RateLimit), x-ratelimit (X-RateLimit-*), both")
	fs.IntVar(&c.maxRequestBytes, "max-request-bytes", rls.DefaultMaxRequestBytes, "largest total of a request's keys and values")
	fs.DurationVar(&c.reloadInterval, "reload-interval", rls.DefaultInterval, "how often the configuration files are checked for changes")
	fs.DurationVar(&c.grace, "shutdown-grace", 10*time.Second, "on SIGTERM, how long calls in flight may take before the server stops")
	fs.StringVar(&c.logFormat, "log-format", "text", "text or json")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.check, "check", false, "load the configuration, print its domains and exit")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		env := envPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(env); v != "" && !set[f.Name] && err == nil {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
		}
	})
	return c, err
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	c, err := parseFlags(args, getenv)
	if err != nil {
		return err
	}
	log, err := newLogger(c, stdout)
	if err != nil {
		return err
	}
	headers, ok := map[string]rls.Headers{"none": rls.NoHeaders, "ietf": rls.IETFHeaders, "x-ratelimit": rls.XRateLimitHeaders, "both": rls.BothHeaders}[c.headers]
	if !ok {
		return fmt.Errorf("-headers %q: want none, ietf, x-ratelimit or both", c.headers)
	}
	if c.check {
		cfg, err := loadConfig(c)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, "configuration ok; domains:", strings.Join(cfg.Domains(), ", "))
		return nil
	}

	// Metrics: OpenTelemetry to a Prometheus registry; sluice's observer
	// (decisions by source, fallbacks) and the service's own counters.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background()) //nolint:errcheck // nothing left to tell
	obs, err := sluiceotel.New(mp, sluiceotel.Options{})
	if err != nil {
		return err
	}
	metrics, err := rls.NewMetrics(mp)
	if err != nil {
		return err
	}

	client, closeRedis, err := connect(c, getenv, log)
	if err != nil {
		return err
	}
	defer closeRedis()
	sc, err := sluice.New(ctx, client, sluice.WithObserver(obs), sluice.WithLogger(log))
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	limiter, err := ratelimit.New(sc, ratelimit.Options{Prefix: c.prefix})
	if err != nil {
		return err
	}

	var svc atomic.Pointer[rls.Service]
	cfg, current, closeWatch, err := watchConfig(c, log, metrics, func(cfg *rls.Config) {
		if s := svc.Load(); s != nil {
			s.SetConfig(cfg)
		}
	})
	if err != nil {
		return err
	}
	defer closeWatch()
	s, err := rls.New(limiter, cfg, rls.Options{
		Timeout: c.timeout, FallbackLocal: c.fallbackLocal, ShadowMode: c.shadow,
		Headers: headers, MaxRequestBytes: c.maxRequestBytes, Logger: log, Metrics: metrics,
	})
	if err != nil {
		return err
	}
	svc.Store(s)
	// A reload between the first load and svc.Store found no service.
	s.SetConfig(current())

	gs := grpc.NewServer()
	rlspb.RegisterRateLimitServiceServer(gs, s)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	lis, err := net.Listen("tcp", c.grpcAddr)
	if err != nil {
		return err
	}
	var httpSrv *http.Server
	if c.metricsAddr != "" {
		mlis, err := net.Listen("tcp", c.metricsAddr)
		if err != nil {
			lis.Close()
			return err
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go httpSrv.Serve(mlis) //nolint:errcheck // ends with Shutdown below
		log.Info("serving metrics", "addr", mlis.Addr().String())
		defer httpSrv.Shutdown(context.Background()) //nolint:errcheck // best effort at exit
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(rlspb.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	log.Info("serving gRPC", "addr", lis.Addr().String(), "domains", strings.Join(s.Config().Domains(), ","))

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	// Draining: health checks say NOT_SERVING at once (load balancers stop
	// sending), calls in flight finish, new ones are refused; after the
	// grace period whatever is left is cut.
	log.Info("shutting down", "grace", c.grace.String())
	hs.Shutdown()
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(c.grace):
		log.Warn("grace period over, stopping calls in flight")
		gs.Stop()
		<-stopped
	}
	if err := <-served; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	log.Info("stopped")
	return nil
}

func newLogger(c config, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, fmt.Errorf("-log-level %q: %w", c.logLevel, err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch c.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("-log-format %q: want text or json", c.logFormat)
}

// loadConfig loads -config, or the built-in example.
func loadConfig(c config) (*rls.Config, error) {
	if c.configPaths == "" {
		return rls.Parse(rls.File{Name: "example.yaml (built in)", Data: exampleConfig})
	}
	return rls.Load(strings.Split(c.configPaths, ",")...)
}

// watchConfig loads the configuration and, for files, watches them. It
// returns the first configuration, a function that returns the last good
// one, and one that stops the watching.
func watchConfig(c config, log *slog.Logger, m *rls.Metrics, apply func(*rls.Config)) (*rls.Config, func() *rls.Config, func(), error) {
	if c.configPaths == "" {
		cfg, err := loadConfig(c)
		if err != nil {
			return nil, nil, nil, err
		}
		log.Info("configuration: the built-in example (-config names files)", "domains", strings.Join(cfg.Domains(), ","))
		m.Reload(true)
		return cfg, func() *rls.Config { return cfg }, func() {}, nil
	}
	w, err := rls.Watch(strings.Split(c.configPaths, ","), rls.WatchOptions{
		Interval: c.reloadInterval,
		OnLoad: func(cfg *rls.Config) {
			log.Info("configuration loaded", "domains", strings.Join(cfg.Domains(), ","))
			m.Reload(true)
			apply(cfg)
		},
		OnError: func(err error) {
			log.Error("configuration not loaded; the last good one stays", "err", err)
			m.Reload(false)
		},
	})
	if err != nil {
		return nil, nil, nil, err
	}
	return w.Config(), w.Config, w.Close, nil
}

// connect returns a client of -redis, or of an embedded miniredis.
func connect(c config, getenv func(string) string, log *slog.Logger) (rueidis.Client, func(), error) {
	if c.redis == "" {
		m, err := miniredis.Run()
		if err != nil {
			return nil, nil, err
		}
		log.Warn("no -redis given: running on an embedded miniredis, in this process only (counts are lost at exit)", "addr", m.Addr())
		// miniredis has no client tracking, and RESP3 push frames confuse
		// it.
		client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true, AlwaysRESP2: true})
		if err != nil {
			m.Close()
			return nil, nil, err
		}
		return client, func() { client.Close(); m.Close() }, nil
	}
	opt := rueidis.ClientOption{
		InitAddress: strings.Split(c.redis, ","),
		Username:    c.username,
		Password:    getenv(envPrefix + "REDIS_PASSWORD"),
		// Counters are written by scripts; nothing is read that a cache
		// would serve.
		DisableCache: true,
	}
	if c.sentinelMaster != "" {
		opt.Sentinel = rueidis.SentinelOption{MasterSet: c.sentinelMaster, Username: c.username, Password: opt.Password}
	}
	if c.redisTLS {
		opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, nil, fmt.Errorf("redis %s: %w", c.redis, err)
	}
	mode := "single"
	switch {
	case c.sentinelMaster != "":
		mode = "sentinel"
	case client.Mode() == rueidis.ClientModeCluster:
		mode = "cluster"
	}
	log.Info("redis", "addrs", c.redis, "mode", mode)
	return client, client.Close, nil
}
