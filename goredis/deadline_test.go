package goredis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice/goredis"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestEvalReturnsAtDeadline pins what Eval reports when a call with a
// deadline (ContextTimeoutEnabled: go-redis runs it in the caller's
// goroutine) returns at or past that deadline, an instant the test picks
// with the adapter's clock. A reply that arrived is the answer, whatever
// the clock says: a value, a nil and an error reply from the server alike.
// Only a failure to send or read is reported as the deadline, and only
// once the deadline has passed.
func TestEvalReturnsAtDeadline(t *testing.T) {
	addr := redistest.Single(t).Addr()
	newClient := func(t *testing.T, late bool) (*goredis.Client, *redis.Client, context.Context) {
		t.Helper()
		rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { rdb.Close() })
		c, err := goredis.Wrap(rdb)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		t.Cleanup(cancel)
		d, _ := ctx.Deadline()
		if late {
			goredis.SetClock(c, func() time.Time { return d })
		} else {
			goredis.SetClock(c, func() time.Time { return d.Add(-time.Nanosecond) })
		}
		return c, rdb, ctx
	}

	t.Run("value", func(t *testing.T) {
		c, _, ctx := newClient(t, true)
		n, err := c.Eval(ctx, "", "return 7", nil, nil).AsInt64()
		if err != nil || n != 7 {
			t.Fatalf("Eval at the deadline = %d, %v; want the reply, 7", n, err)
		}
	})
	t.Run("nil", func(t *testing.T) {
		c, _, ctx := newClient(t, true)
		if err := c.Eval(ctx, "", "return nil", nil, nil).Error(); err != nil {
			t.Fatalf("Eval of a nil reply at the deadline: %v, want no error", err)
		}
	})
	t.Run("error reply", func(t *testing.T) {
		c, _, ctx := newClient(t, true)
		r := c.Eval(ctx, "", "return redis.error_reply('BAD late')", nil, nil)
		if !r.ServerError() || errors.Is(r.Error(), context.DeadlineExceeded) {
			t.Fatalf("Eval of an error reply at the deadline: %v (server error %v), want the server's error", r.Error(), r.ServerError())
		}
	})
	t.Run("failure after the deadline", func(t *testing.T) {
		c, rdb, ctx := newClient(t, true)
		rdb.Close()
		if err := c.Eval(ctx, "", "return 1", nil, nil).Error(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Eval failing at the deadline: %v, want context.DeadlineExceeded", err)
		}
	})
	t.Run("failure before the deadline", func(t *testing.T) {
		c, rdb, ctx := newClient(t, false)
		rdb.Close()
		err := c.Eval(ctx, "", "return 1", nil, nil).Error()
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Eval failing before the deadline: %v, want the client's own error", err)
		}
	})
}
