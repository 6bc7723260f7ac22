package ratelimit

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// apiKeyFunc keys requests by a client-supplied API key, the usual custom
// KeyFunc (MiddlewareOptions.KeyFunc documents this use).
func apiKeyFunc(r *http.Request) (string, error) {
	return "api:" + r.Header.Get("X-Api-Key"), nil
}

// TestLongKeyIsLimited: a client that picks its key (an API key header)
// sends one longer than keyspace.MaxNameLen. The Limiter refuses such keys
// with ErrInvalidKey; before boundKey, the middlewares' default FallbackOpen
// then served every request of that client unchecked, with Redis healthy.
// The key must be limited like any other, and a short key spelling out the
// long key's digest must not share its count.
func TestLongKeyIsLimited(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	long := strings.Repeat("A", 1100)

	t.Run("rate middleware", func(t *testing.T) {
		l := newLimiter(t, sc, Options{Algorithm: FixedWindow, Limit: PerMinute(1)})
		var errs errRecorder
		h := MustNewMiddleware(l, MiddlewareOptions{KeyFunc: apiKeyFunc, OnError: errs.record, Timeout: answerTimeout})(okHandler)
		// A well-behaved short key is limited: the set-up works.
		if w := serve(h, request("198.51.100.1:1", "X-Api-Key", "short")); w.Code != 200 {
			t.Fatalf("short key, request 1: status %d; want 200", w.Code)
		}
		if w := serve(h, request("198.51.100.1:1", "X-Api-Key", "short")); w.Code != 429 {
			t.Fatalf("short key, request 2: status %d; want 429", w.Code)
		}
		served := 0
		for range 20 {
			if w := serve(h, request("198.51.100.1:1", "X-Api-Key", long)); w.Code == 200 {
				served++
			}
		}
		if served != 1 {
			t.Errorf("a client with a %d-byte key was served %d of 20 requests under a limit of 1/min; want 1 (errors reported: %v)", len(long), served, firstErr(errs.list()))
		}
		// The key the long one is counted under, sent as it is by
		// another client: a count of its own.
		forged := strings.TrimPrefix(boundKey("api:"+long, maxKeyLen), "api:")
		if w := serve(h, request("198.51.100.2:1", "X-Api-Key", forged)); w.Code != 200 {
			t.Errorf("a key spelling out another key's digest: status %d; want 200 (a count of its own)", w.Code)
		}
		if errs := errs.list(); len(errs) > 0 {
			t.Errorf("errors reported: %v", errs)
		}
	})

	t.Run("concurrency middleware", func(t *testing.T) {
		mgr, err := semaphore.NewManager(sc, semaphore.Options{Prefix: testPrefix(t) + "sem:"})
		if err != nil {
			t.Fatal(err)
		}
		defer mgr.Close()
		var errs errRecorder
		mw, err := NewConcurrencyMiddleware(mgr, ConcurrencyOptions{Limit: 1, KeyFunc: apiKeyFunc, OnError: errs.record})
		if err != nil {
			t.Fatal(err)
		}
		entered := make(chan struct{}, 8)
		release := make(chan struct{})
		h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			<-release
		}))
		// One request holds the only slot of its key...
		var wg sync.WaitGroup
		codes := make(chan int, 2)
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes <- serve(h, request("198.51.100.1:1", "X-Api-Key", long)).Code
		}()
		select {
		case <-entered:
		case <-time.After(20 * time.Second):
			close(release)
			wg.Wait()
			t.Fatal("first request never reached the handler")
		}
		// ...so a second one of the same key must be refused.
		second := make(chan int, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			second <- serve(h, request("198.51.100.1:1", "X-Api-Key", long)).Code
		}()
		var code int
		select {
		case code = <-second:
		case <-entered:
			code = 200 // it is in the handler: served past the limit
		case <-time.After(20 * time.Second):
		}
		close(release)
		wg.Wait()
		if code != 429 {
			t.Errorf("second in-flight request of a %d-byte key under Limit 1: status %d; want 429 (errors reported: %v)", len(long), code, firstErr(errs.list()))
		}
		if c := <-codes; c != 200 {
			t.Errorf("first request of the long key: status %d; want 200", c)
		}
	})
}

func TestBoundKey(t *testing.T) {
	const limit = 16
	long := strings.Repeat("k", limit+1)
	tests := []struct {
		name, key string
		digest    bool
	}{
		{"short", "client", false},
		{"at the limit", strings.Repeat("k", limit), false},
		{"over the limit", long, true},
		{"marked", "~#short", true},
		{"marked like a digest", boundKey(long, limit), true},
		{"tilde alone", "~x", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := boundKey(tt.key, limit)
			if !tt.digest {
				if got != tt.key {
					t.Fatalf("boundKey(%q) = %q, want the key itself", tt.key, got)
				}
				return
			}
			if !strings.HasPrefix(got, digestMark) || len(got) != len(digestMark)+43 || got == tt.key {
				t.Fatalf("boundKey(%q) = %q, want %q and 43 base64url bytes, not the key", tt.key, got, digestMark)
			}
			if again := boundKey(tt.key, limit); again != got {
				t.Fatalf("boundKey is not deterministic: %q then %q", got, again)
			}
		})
	}
}

func firstErr(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return errs[0]
}
