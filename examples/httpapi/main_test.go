package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestHTTPAPI runs the program against a throwaway redis-server and checks
// what it promises: a flooding client IP gets its burst and then 429s while
// another IP is served; a third request of an IP with two in flight is
// refused until one of them ends; and /metrics shows sluice's series.
func TestHTTPAPI(t *testing.T) {
	srv := redistest.NewServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	addrs, done := make(chan net.Addr, 1), make(chan error, 1)
	const rate, burst = 5, 20
	go func() {
		done <- run(ctx, config{redis: srv.Addr(), listen: "127.0.0.1:0", proxies: "127.0.0.1/32",
			rate: rate, burst: burst, inFlight: 2, prefix: "test:"}, func(a net.Addr) { addrs <- a })
	}()
	var base string
	select {
	case a := <-addrs:
		base = "http://" + a.String()
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run after shutdown: %v", err)
		}
	})

	// get returns the status and header of a response whose body it has
	// read and closed.
	type reply struct {
		StatusCode int
		Header     http.Header
	}
	get := func(ctx context.Context, ip, path string) (*reply, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			return nil, err
		}
		// The test connects from 127.0.0.1, the trusted proxy, so the
		// header names the client.
		req.Header.Set("X-Forwarded-For", ip)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return &reply{resp.StatusCode, resp.Header}, nil
	}
	mustGet := func(ip, path string) *reply {
		t.Helper()
		resp, err := get(context.Background(), ip, path)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	// Rate: the flooder gets its burst, and at most what the rate earns
	// while it floods.
	start, allowed := time.Now(), 0
	for range 2 * burst {
		resp := mustGet("203.0.113.1", "/work")
		switch resp.StatusCode {
		case http.StatusOK:
			allowed++
		case http.StatusTooManyRequests:
			if resp.Header.Get("Retry-After") == "" {
				t.Errorf("429 without Retry-After: %v", resp.Header)
			}
		default:
			t.Fatalf("flood: status %d", resp.StatusCode)
		}
	}
	if most := burst + int(time.Since(start).Seconds()*rate) + 1; allowed < burst || allowed > most {
		t.Errorf("flooder allowed %d of %d, want %d to %d", allowed, 2*burst, burst, most)
	}
	if resp := mustGet("203.0.113.2", "/work"); resp.StatusCode != http.StatusOK {
		t.Errorf("another IP during the flood: status %d, want 200", resp.StatusCode)
	}

	// In flight: two long requests of one IP, then a third is refused by
	// the concurrency middleware (its RateLimit field names that policy).
	// The permits held are read from the metrics: acquisitions minus
	// releases, as the otel observer counts them.
	slow, stopSlow := context.WithCancel(context.Background())
	defer stopSlow()
	slowDone := make(chan int, 2)
	for range 2 {
		go func() {
			resp, err := get(slow, "198.51.100.9", "/work?ms=10000")
			if err != nil {
				slowDone <- 0
				return
			}
			slowDone <- resp.StatusCode
		}()
	}
	if !waitFor(t, func() bool { return heldPermits(t, base) == 2 }) {
		t.Fatalf("the two long requests never held their permits (%v held)", heldPermits(t, base))
	}
	resp := mustGet("198.51.100.9", "/work")
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(strings.Join(resp.Header.Values("RateLimit"), ","), "concurrency") {
		t.Errorf("third request with two in flight: %d %v, want 429 naming the concurrency policy", resp.StatusCode, resp.Header)
	}
	if resp := mustGet("203.0.113.2", "/work"); resp.StatusCode != http.StatusOK {
		t.Errorf("another IP meanwhile: status %d, want 200", resp.StatusCode)
	}
	stopSlow()
	for range 2 {
		if code := <-slowDone; code != 0 {
			t.Errorf("a long request ended with %d before it was cancelled", code)
		}
	}
	if !waitFor(t, func() bool { return mustGet("198.51.100.9", "/work").StatusCode == http.StatusOK }) {
		t.Fatal("the IP was not served again after its long requests ended")
	}

	// Metrics: sluice's series in a Prometheus scrape.
	body := scrape(t, base)
	for _, want := range []string{`sluice_ratelimit_decisions_total{allowed="false"`, `sluice_ratelimit_decisions_total{allowed="true"`,
		"sluice_semaphore_hold_seconds_count", "sluice_semaphore_failures_total"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grep(body, "sluice_"))
		}
	}
}

// waitFor polls cond every 50ms for up to 10 s, for states that another
// goroutine's HTTP request brings about.
func waitFor(t *testing.T, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func scrape(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// heldPermits is the number of semaphore permits held now, from the
// metrics: acquisitions (the wait histogram's count) minus releases (the
// hold histogram's count).
func heldPermits(t *testing.T, base string) float64 {
	t.Helper()
	sum := func(body, name string) float64 {
		var n float64
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, name+"{") || strings.HasPrefix(l, name+" ") {
				f := strings.Fields(l)
				v, err := strconv.ParseFloat(f[len(f)-1], 64)
				if err != nil {
					t.Fatalf("metrics line %q: %v", l, err)
				}
				n += v
			}
		}
		return n
	}
	body := scrape(t, base)
	return sum(body, "sluice_semaphore_wait_seconds_count") - sum(body, "sluice_semaphore_hold_seconds_count")
}

func grep(s, prefix string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			fmt.Fprintln(&b, l)
		}
	}
	return b.String()
}
