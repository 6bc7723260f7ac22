package goredis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice/goredis"
	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

const incr = "return redis.call('INCR', KEYS[1])"

// lostReply sends INCR through call while the proxy drops the server's
// replies, resets the connection once the server has run it, and returns
// the counter afterwards: 1 if the call ran once, more if the client sent
// it again on a new connection.
func lostReply(t *testing.T, call func(rdb *redis.Client, key string) error) string {
	t.Helper()
	return lostReplyWith(t, false, call)
}

// lostReplyWith is lostReply on a client with ContextTimeoutEnabled as
// given.
func lostReplyWith(t *testing.T, ctxTimeout bool, call func(rdb *redis.Client, key string) error) string {
	t.Helper()
	srv := redistest.NewServer(t)
	proxy, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), PoolSize: 1, ContextTimeoutEnabled: ctxTimeout})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	const key = "noretry"
	proxy.DropReplies(true)
	done := make(chan error, 1)
	go func() { done <- call(rdb, key) }()
	if !redistest.WaitFor(context.Background(), 10*time.Second, func() bool {
		n, _ := srv.Do("GET", key)
		return n == "1"
	}) {
		t.Fatal("the script did not run")
	}
	// Reset before letting replies through again: the reply may still be
	// on its way to the proxy, and must not reach the client.
	proxy.ResetAll()
	proxy.DropReplies(false)
	select {
	case err := <-done:
		t.Logf("call after the lost reply: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the call did not return after its connection was reset")
	}
	n, err := srv.Do("GET", key)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestScriptNotRetried: a script whose reply was lost may have run, so the
// adapter must not let go-redis send it again (a reentrant lock would count
// two holds). Plain go-redis Eval, which go-redis retries, is the control.
func TestScriptNotRetried(t *testing.T) {
	got := lostReply(t, func(rdb *redis.Client, key string) error {
		c, err := goredis.Wrap(rdb)
		if err != nil {
			return err
		}
		r := c.Eval(context.Background(), "", incr, []string{key}, nil)
		if r.Error() != nil && r.ServerError() {
			t.Errorf("lost reply reported as a server error: %v", r.Error())
		}
		return r.Error()
	})
	if got != "1" {
		t.Errorf("counter after a lost reply = %s; the script ran more than once", got)
	}
	control := lostReply(t, func(rdb *redis.Client, key string) error {
		return rdb.Eval(context.Background(), incr, []string{key}).Err()
	})
	t.Logf("plain go-redis Eval after a lost reply: counter %s (above 1: go-redis sent it again)", control)
}

// TestScriptNotRetriedContextTimeout: with ContextTimeoutEnabled a call
// with a deadline runs in its caller's goroutine; a lost reply must not
// make go-redis send it again there either. (That such a call returns the
// deadline's error when the server stops answering is clienttest's
// testEvalCancel, run by TestClientContextTimeout.)
func TestScriptNotRetriedContextTimeout(t *testing.T) {
	got := lostReplyWith(t, true, func(rdb *redis.Client, key string) error {
		c, err := goredis.Wrap(rdb)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		r := c.Eval(ctx, "", incr, []string{key}, nil)
		if r.Error() != nil && r.ServerError() {
			t.Errorf("lost reply reported as a server error: %v", r.Error())
		}
		return r.Error()
	})
	if got != "1" {
		t.Errorf("counter after a lost reply = %s; the script ran more than once", got)
	}
}

// TestPipelineNotRetried: calls coalesced into a pipeline whose replies
// are lost may have run, so go-redis must not send the pipeline again
// either. Plain go-redis pipelined Evals, which go-redis retries, are the
// control.
func TestPipelineNotRetried(t *testing.T) {
	keys := []string{"pipe-a", "pipe-b", "pipe-c"}
	got := lostPipeline(t, keys, func(rdb *redis.Client) error {
		c, err := goredis.Wrap(rdb)
		if err != nil {
			return err
		}
		var errs []error
		for _, r := range goredis.EvalPipelined(c, incr, keys...) {
			if r.Error() != nil && r.ServerError() {
				t.Errorf("lost reply reported as a server error: %v", r.Error())
			}
			errs = append(errs, r.Error())
		}
		return errors.Join(errs...)
	})
	for i, n := range got {
		if n != "1" {
			t.Errorf("counter %s after a lost pipeline = %s; the call ran more than once", keys[i], n)
		}
	}
	control := lostPipeline(t, keys, func(rdb *redis.Client) error {
		_, err := rdb.Pipelined(context.Background(), func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.Eval(context.Background(), incr, []string{k})
			}
			return nil
		})
		return err
	})
	t.Logf("plain go-redis pipelined Evals after lost replies: counters %v (above 1: go-redis sent them again)", control)
}

// lostPipeline is lostReply for a pipeline of INCRs of keys: it returns
// the counters afterwards.
func lostPipeline(t *testing.T, keys []string, call func(rdb *redis.Client) error) []string {
	t.Helper()
	srv := redistest.NewServer(t)
	proxy, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), PoolSize: 1})
	t.Cleanup(func() { rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	proxy.DropReplies(true)
	done := make(chan error, 1)
	go func() { done <- call(rdb) }()
	if !redistest.WaitFor(context.Background(), 10*time.Second, func() bool {
		for _, k := range keys {
			if n, _ := srv.Do("GET", k); n != "1" {
				return false
			}
		}
		return true
	}) {
		t.Fatal("the pipeline did not run")
	}
	proxy.ResetAll()
	proxy.DropReplies(false)
	select {
	case err := <-done:
		t.Logf("pipeline after the lost replies: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the pipeline did not return after its connection was reset")
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		if out[i], err = srv.Do("GET", k); err != nil {
			t.Fatal(err)
		}
	}
	return out
}
