package ratelimit

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestChecker checks the transport-neutral decision: Redis's answer, the
// deny cache, a cancelled caller still decided, and the local fallback
// while Redis is slow.
func TestChecker(t *testing.T) {
	l, p := slowLimiter(t, Options{Algorithm: FixedWindow, Limit: PerHour(2)})
	var local atomic.Int64
	c, err := NewChecker(l, CheckerOptions{Timeout: 20 * time.Millisecond, FallbackLocal: true, LocalHold: time.Hour,
		OnLocal: func(context.Context, error) { local.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	// A caller whose context is already cancelled is still decided: the
	// check runs under a context of its own.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	c.c.timeout = time.Minute // the first calls must reach Redis, however loaded the machine
	for i := range 2 {
		if d, err := c.Check(cancelled, "k", nil); err != nil || !d.Allowed || len(d.Results) != 1 || d.Results[0].Remaining != 1-i {
			t.Fatalf("call %d: %+v, %v; want allowed with %d remaining", i+1, d, err, 1-i)
		}
	}
	if d, err := c.Check(context.Background(), "k", nil); err != nil || d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("call 3: %+v, %v; want denied", d, err)
	}
	// Redis slow: another key is decided locally, limited to its burst.
	c.c.timeout = 20 * time.Millisecond
	p.SetLatency(200*time.Millisecond, 0)
	allowed := 0
	for range 5 {
		d, err := c.Check(context.Background(), "other", nil)
		if err != nil {
			t.Fatalf("with Redis slow: %v; want the local decision", err)
		}
		if d.Allowed {
			allowed++
		}
	}
	if allowed != 2 || local.Load() != 1 {
		t.Errorf("with Redis slow: %d of 5 allowed, %d errors told; want 2 and 1", allowed, local.Load())
	}
	if _, err := NewChecker(nil, CheckerOptions{}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("NewChecker(nil): %v; want ErrInvalidOptions", err)
	}
	for _, opts := range []CheckerOptions{{Timeout: -1}, {LocalKeys: 5}, {FallbackLocal: true, LocalHold: -1}, {FallbackLocal: true, LocalKeys: -1}} {
		if _, err := NewChecker(l, opts); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("NewChecker(%+v): %v; want ErrInvalidOptions", opts, err)
		}
	}
	// Without the local fallback, Check returns Redis's error.
	strict, err := NewChecker(l, CheckerOptions{Timeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strict.Check(context.Background(), "third", nil); err == nil {
		t.Errorf("without FallbackLocal, Redis slow: no error; want Redis's")
	}
}
