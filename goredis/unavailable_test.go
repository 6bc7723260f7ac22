package goredis_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice/goredis"
	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestPoolExhaustedUnavailable holds every connection of a go-redis pool on
// a blackholed Redis (issue 31, item 4): the next call cannot get a
// connection, and go-redis says so with ErrPoolTimeout (a full pool that
// waited) or ErrPoolExhausted (MaxActiveConns reached). Both mean that
// Redis cannot answer now, so ratelimit.Unavailable must say true and a
// middleware with FallbackLocal must answer, not refuse with 500: whoever
// can slow Redis would otherwise take the service down exactly when the
// fallback exists for it.
func TestPoolExhaustedUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts redis.Options
		want error
	}{
		{"PoolTimeout", redis.Options{PoolSize: 1, PoolTimeout: 50 * time.Millisecond}, redis.ErrPoolTimeout},
		{"PoolExhausted", redis.Options{PoolSize: 2, MaxActiveConns: 1}, redis.ErrPoolExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.NewServer(t)
			proxy, err := faultproxy.New(srv.Addr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { proxy.Close() })
			opts := tc.opts
			opts.Addr = proxy.Addr()
			rdb := redis.NewClient(&opts)
			t.Cleanup(func() { rdb.Close() })
			sc, err := goredis.New(context.Background(), rdb)
			if err != nil {
				t.Fatal(err)
			}
			l, err := ratelimit.New(sc, ratelimit.Options{Limit: ratelimit.PerHour(1000), DisableDenyCache: true})
			if err != nil {
				t.Fatal(err)
			}
			proxy.Blackhole(true)
			// The one connection goes to a command of the application's
			// that waits for its reply (go-redis's ReadTimeout ends it).
			held := make(chan error, 1)
			go func() { held <- rdb.Get(context.Background(), "holder").Err() }()
			t.Cleanup(func() {
				proxy.Blackhole(false)
				<-held
			})
			if !redistest.WaitFor(context.Background(), 10*time.Second, func() bool { return rdb.PoolStats().TotalConns == 1 && rdb.PoolStats().IdleConns == 0 }) {
				t.Fatalf("the holder never took the connection: %+v", rdb.PoolStats())
			}

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err = l.Allow(ctx, "k")
			if !errors.Is(err, tc.want) {
				t.Fatalf("Allow with the pool held = %v; want an error wrapping %v", err, tc.want)
			}
			if !ratelimit.Unavailable(err) {
				t.Errorf("Unavailable(%v) = false; want true: the pool is held by calls to a Redis that does not answer", err)
			}
			if !errors.Is(err, scriptcache.ErrUnavailable) {
				t.Errorf("Allow = %v; want it to wrap scriptcache.ErrUnavailable", err)
			}

			// The middleware, which has its own timeout, sees the same.
			mw, err := ratelimit.NewMiddleware(l, ratelimit.MiddlewareOptions{
				Fallback: ratelimit.FallbackLocal,
				Timeout:  10 * time.Second, // past PoolTimeout: the pool answers first
				OnError:  func(*http.Request, error) {},
			})
			if err != nil {
				t.Fatal(err)
			}
			h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
			var codes []int
			for range 4 {
				w := httptest.NewRecorder()
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				r.RemoteAddr = "192.0.2.1:1234"
				h.ServeHTTP(w, r)
				codes = append(codes, w.Code)
			}
			for _, c := range codes {
				if c != http.StatusOK {
					t.Errorf("FallbackLocal with the pool held answered %v; want 200 each time (the local limiter allows 1000/h)", codes)
					break
				}
			}
		})
	}
}

// TestClosedClientNotUnavailable: a go-redis client its owner has closed
// is a programming error, not an outage: no fallback may answer for it.
func TestClosedClientNotUnavailable(t *testing.T) {
	srv := redistest.Single(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	sc, err := goredis.New(context.Background(), rdb)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ratelimit.New(sc, ratelimit.Options{Limit: ratelimit.PerHour(10)})
	if err != nil {
		t.Fatal(err)
	}
	rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = l.Allow(ctx, "k")
	if !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("Allow on a closed client = %v; want redis.ErrClosed", err)
	}
	if ratelimit.Unavailable(err) {
		t.Errorf("Unavailable(%v) = true; want false: the client was closed by its owner", err)
	}
}
