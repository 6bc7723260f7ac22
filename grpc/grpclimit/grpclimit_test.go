package grpclimit

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/ratelimit"
)

func TestMain(m *testing.M) { redistest.Main(m) }

var runs atomic.Int64

func newLimiter(t *testing.T, addr string, opts ratelimit.Options) *ratelimit.Limiter {
	t.Helper()
	sc, err := sluice.New(context.Background(), redistest.Client(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	// New for each run of a test, so that tests survive -count=N.
	opts.Prefix = "test:" + strings.NewReplacer("{", "(", "}", ")").Replace(t.Name()) + ":" + strconv.FormatInt(runs.Add(1), 10) + ":"
	l, err := ratelimit.New(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// serve starts a gRPC server with the health service behind ic's
// interceptors on a loopback port, and returns a client of it; both are
// stopped when t ends.
func serve(t *testing.T, ic *Interceptors) healthpb.HealthClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary), grpc.StreamInterceptor(ic.Stream))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() { srv.Serve(lis); close(done) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); srv.Stop(); <-done })
	return healthpb.NewHealthClient(conn)
}

func newInterceptors(t *testing.T, l *ratelimit.Limiter, opts Options) *Interceptors {
	t.Helper()
	if opts.OnError == nil {
		opts.OnError = func(_ context.Context, _ string, err error) { t.Errorf("OnError: %v", err) }
	}
	ic, err := New(l, opts)
	if err != nil {
		t.Fatal(err)
	}
	return ic
}

// retryDelay returns the RetryInfo delay of a ResourceExhausted error.
func retryDelay(t *testing.T, err error) time.Duration {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		t.Fatalf("error %v; want ResourceExhausted", err)
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.RetryDelay.AsDuration()
		}
	}
	t.Fatalf("status %v has no RetryInfo", st)
	return 0
}

func TestUnaryAndStream(t *testing.T) {
	l := newLimiter(t, redistest.Single(t).Addr(), ratelimit.Options{Algorithm: ratelimit.FixedWindow, Limit: ratelimit.PerHour(2)})
	c := serve(t, newInterceptors(t, l, Options{}))
	ctx := context.Background()
	for i := range 2 {
		if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("call %d: %v; want allowed", i+1, err)
		}
	}
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
	if d := retryDelay(t, err); d <= 0 || d > time.Hour {
		t.Errorf("RetryInfo delay %v; want in (0, 1h]", d)
	}
	// Streams share the peer's key: the limit is spent.
	ws, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = ws.Recv()
	}
	retryDelay(t, err)
}

func TestStreamCountedOnce(t *testing.T) {
	l := newLimiter(t, redistest.Single(t).Addr(), ratelimit.Options{Algorithm: ratelimit.FixedWindow, Limit: ratelimit.PerHour(1)})
	c := serve(t, newInterceptors(t, l, Options{}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ws, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Recv(); err != nil {
		t.Fatalf("first stream: %v; want its first message", err)
	}
	ws2, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = ws2.Recv()
	}
	retryDelay(t, err)
}

func TestMetadataKey(t *testing.T) {
	l := newLimiter(t, redistest.Single(t).Addr(), ratelimit.Options{Algorithm: ratelimit.FixedWindow, Limit: ratelimit.PerHour(1)})
	c := serve(t, newInterceptors(t, l, Options{MetadataKey: "X-API-Key"}))
	call := func(key string) error {
		ctx := context.Background()
		if key != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", key)
		}
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	for _, k := range []string{"a", "b", ""} {
		if err := call(k); err != nil {
			t.Fatalf("first call with key %q: %v; want allowed", k, err)
		}
	}
	for _, k := range []string{"a", "b", ""} {
		retryDelay(t, call(k))
	}
}

func TestPolicies(t *testing.T) {
	l := newLimiter(t, redistest.Single(t).Addr(), ratelimit.Options{Limit: ratelimit.PerSecond(1)})
	ps, err := ratelimit.NewPolicies(
		ratelimit.Policy{Name: "hour", Algorithm: ratelimit.FixedWindow, Limit: ratelimit.PerHour(1)},
		ratelimit.Policy{Name: "day", Algorithm: ratelimit.FixedWindow, Limit: ratelimit.Limit{Rate: 10, Period: 24 * time.Hour}},
	)
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, newInterceptors(t, l, Options{PolicyFunc: func(context.Context, string) (*ratelimit.Policies, error) { return ps, nil }}))
	if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Check(context.Background(), &healthpb.HealthCheckRequest{})
	retryDelay(t, err)
	st, _ := status.FromError(err)
	var subjects []string
	for _, d := range st.Details() {
		if qf, ok := d.(*errdetails.QuotaFailure); ok {
			for _, v := range qf.Violations {
				subjects = append(subjects, v.Subject)
			}
		}
	}
	if len(subjects) != 1 || subjects[0] != "policy:hour" {
		t.Errorf("QuotaFailure subjects %v; want [policy:hour]", subjects)
	}
}

func TestRedisDown(t *testing.T) {
	srv := redistest.NewServer(t)
	l := newLimiter(t, srv.Addr(), ratelimit.Options{Limit: ratelimit.PerHour(1)})
	srv.Kill()
	quiet := func(context.Context, string, error) {}
	open := serve(t, newInterceptors(t, l, Options{OnError: quiet}))
	closed := serve(t, newInterceptors(t, l, Options{OnError: quiet, Fallback: ratelimit.FallbackClosed}))
	if _, err := open.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("open with Redis down: %v; want the call served", err)
	}
	if _, err := closed.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("closed with Redis down: %v; want Unavailable", err)
	}
}

func TestNewValidation(t *testing.T) {
	l := newLimiter(t, redistest.Single(t).Addr(), ratelimit.Options{Limit: ratelimit.PerHour(1)})
	setsOnly := newLimiter(t, redistest.Single(t).Addr(), ratelimit.Options{})
	for _, tt := range []struct {
		name string
		l    *ratelimit.Limiter
		opts Options
	}{
		{"nil limiter", nil, Options{}},
		{"no limit, no PolicyFunc", setsOnly, Options{}},
		{"negative timeout", l, Options{Timeout: -1}},
		{"unknown fallback", l, Options{Fallback: 3}},
		{"local keys without local", l, Options{LocalKeys: 5}},
		{"bad ipv4 prefix", l, Options{IPv4PrefixLen: 33}},
		{"negative ipv6 prefix", l, Options{IPv6PrefixLen: -1}},
	} {
		if ic, err := New(tt.l, tt.opts); !errors.Is(err, ratelimit.ErrInvalidOptions) || ic != nil {
			t.Errorf("%s: %v; want ErrInvalidOptions", tt.name, err)
		}
	}
}

// TestFallbackLocal slows Redis past the timeout: with FallbackLocal a
// client still gets only its limit, with the error told once.
func TestFallbackLocal(t *testing.T) {
	srv := redistest.NewServer(t)
	p, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	l := newLimiter(t, p.Addr(), ratelimit.Options{Algorithm: ratelimit.FixedWindow, Limit: ratelimit.PerHour(2)})
	var errs atomic.Int64
	c := serve(t, newInterceptors(t, l, Options{
		Fallback: ratelimit.FallbackLocal, Timeout: 20 * time.Millisecond, LocalHold: time.Hour,
		OnError: func(context.Context, string, error) { errs.Add(1) },
	}))
	// No reply can come sooner than the proxy's latency.
	p.SetLatency(200*time.Millisecond, 0)
	served := 0
	for range 6 {
		_, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err == nil {
			served++
		} else {
			retryDelay(t, err)
		}
	}
	if served != 2 || errs.Load() != 1 {
		t.Errorf("with Redis slow: %d of 6 calls served, %d errors; want 2 and 1", served, errs.Load())
	}
}

// TestSemanticErrorInternal is issue 22 item 6 for the interceptors: an
// error that is no outage (a key holding another type of value, a KeyFunc
// that finds no key) ends the call with codes.Internal under every
// Fallback, is told to OnError, and a Redis one to the observer. Such
// calls used to be served unchecked (FallbackOpen) or decided locally.
func TestSemanticErrorInternal(t *testing.T) {
	srv := redistest.Single(t)
	var events atomic.Int64
	sc, err := sluice.New(context.Background(), redistest.Client(t, srv.Addr()), sluice.WithObserver(sluice.ObserverFunc(func(e sluice.Event) {
		if e.Kind == sluice.EventFallback && e.Source == sluice.SourceFailClosed && e.Err != nil && !ratelimit.Unavailable(e.Err) {
			events.Add(1)
		}
	})))
	if err != nil {
		t.Fatal(err)
	}
	prefix := "test:" + strings.NewReplacer("{", "(", "}", ")").Replace(t.Name()) + ":" + strconv.FormatInt(runs.Add(1), 10) + ":"
	l, err := ratelimit.New(sc, ratelimit.Options{Limit: ratelimit.PerHour(100), Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	// The default key of a loopback peer.
	if _, err := srv.Do("RPUSH", l.RedisKey("127.0.0.1"), "x"); err != nil {
		t.Fatal(err)
	}
	noKey := func(context.Context, string) (string, error) { return "", ErrNoKey }
	for _, fb := range []ratelimit.Fallback{ratelimit.FallbackOpen, ratelimit.FallbackClosed, ratelimit.FallbackLocal} {
		for _, c := range []struct {
			name    string
			keyFunc func(context.Context, string) (string, error)
			events  int64
		}{{"WRONGTYPE", nil, 1}, {"no key", noKey, 0}} {
			var told atomic.Int64
			before := events.Load()
			client := serve(t, newInterceptors(t, l, Options{Fallback: fb, KeyFunc: c.keyFunc, OnError: func(_ context.Context, _ string, err error) {
				if !ratelimit.Unavailable(err) {
					told.Add(1)
				}
			}}))
			if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Internal {
				t.Errorf("%v, %s: %v; want Internal", fb, c.name, err)
			}
			if told.Load() != 1 || events.Load()-before != c.events {
				t.Errorf("%v, %s: %d errors told, %d observed; want 1 and %d", fb, c.name, told.Load(), events.Load()-before, c.events)
			}
		}
	}
}
