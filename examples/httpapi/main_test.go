package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/redistest"
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

	get := func(ctx context.Context, ip, path string) (*http.Response, error) {
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
		return resp, nil
	}
	mustGet := func(ip, path string) *http.Response {
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
	slow, stopSlow := context.WithCancel(context.Background())
	defer stopSlow()
	slowDone := make(chan struct{}, 2)
	for range 2 {
		go func() {
			defer func() { slowDone <- struct{}{} }()
			_, _ = get(slow, "198.51.100.9", "/work?ms=10000")
		}()
	}
	refused := waitFor(t, func() bool {
		resp := mustGet("198.51.100.9", "/work")
		return resp.StatusCode == http.StatusTooManyRequests &&
			strings.Contains(strings.Join(resp.Header.Values("RateLimit"), ","), "concurrency")
	})
	if !refused {
		t.Fatal("a third request with two in flight was never refused by the in-flight limit")
	}
	stopSlow()
	<-slowDone
	<-slowDone
	if !waitFor(t, func() bool { return mustGet("198.51.100.9", "/work").StatusCode == http.StatusOK }) {
		t.Fatal("the IP was not served again after its long requests ended")
	}

	// Metrics: sluice's series in a Prometheus scrape.
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`sluice_ratelimit_decisions_total{allowed="false"`, `sluice_ratelimit_decisions_total{allowed="true"`,
		"sluice_semaphore_hold_seconds_count", "sluice_semaphore_failures_total"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grep(string(body), "sluice_"))
		}
	}
}

// waitFor polls cond every 200ms (the limit's rate, so that polling never
// runs out of the IP's budget) for up to 10 s, for states that another
// goroutine's HTTP request brings about.
func waitFor(t *testing.T, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
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
