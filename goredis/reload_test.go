package goredis_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice/goredis"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// reloadFS holds one script that shows how often it ran.
var reloadFS = fstest.MapFS{
	"incr.lua": {Data: []byte("-- incr: INCR KEYS[1]\nreturn redis.call('INCR', KEYS[1])\n")},
}

// reloadBound bounds how long after its context ends a call may return on a
// loaded 2-core machine with -race; the go-redis ReadTimeout the tests set
// (10 s, which an application with slow scripts may well choose) is far
// above it.
const reloadBound = 3 * time.Second

const reloadReadTimeout = 10 * time.Second

// pauseOnReload is the go-redis Client, except that the server stops
// answering (SIGSTOP) just before the scripts are loaded again after
// NOSCRIPT: the moment a failover or a restart makes the likeliest.
type pauseOnReload struct {
	*goredis.Client
	srv      *redistest.Server
	loads    atomic.Int32
	pausedAt atomic.Int64
}

func (p *pauseOnReload) LoadScripts(ctx context.Context, bodies ...string) error {
	if p.loads.Add(1) == 2 { // the first load is New's
		if err := p.srv.Pause(); err == nil {
			p.pausedAt.Store(time.Now().UnixNano())
		}
	}
	return p.Client.LoadScripts(ctx, bodies...)
}

// TestReloadHonoursContext: a script call returns when its
// context ends (the adapter runs Eval in a goroutine for that reason). The
// reload after NOSCRIPT is part of the same Exec, with the caller's
// context: on a server that stops answering at that moment it must not
// hold the caller until go-redis's ReadTimeout.
func TestReloadHonoursContext(t *testing.T) {
	srv := redistest.NewServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: reloadReadTimeout})
	t.Cleanup(func() { rdb.Close() })
	w, err := goredis.Wrap(rdb)
	if err != nil {
		t.Fatal(err)
	}
	client := &pauseOnReload{Client: w, srv: srv}
	sc, err := scriptcache.NewFrom(context.Background(), client, scriptcache.WithFS(reloadFS))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := sc.Script("incr")
	if err := s.Exec(context.Background(), []string{"warm"}, nil).Error(); err != nil {
		t.Fatal(err)
	}
	if err := srv.FlushScripts(); err != nil {
		t.Fatal(err)
	}
	resume := srv.Resumer(t)
	defer resume()

	const budget = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	type result struct {
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		err := s.Exec(ctx, []string{"reload"}, nil).Error()
		done <- result{err, time.Now()}
	}()
	var res result
	select {
	case res = <-done:
	case <-time.After(budget + reloadBound):
		if client.pausedAt.Load() == 0 {
			t.Fatal("the reload did not pause the server")
		}
		t.Errorf("Exec with a %v context still running %v after it was called: the reload after NOSCRIPT ignores the caller's context on a hung server", budget, budget+reloadBound)
		resume()
		res = <-done
		t.Logf("Exec returned %v after it was called, once the server was resumed: %v", res.at.Sub(start), res.err)
		return
	}
	paused := client.pausedAt.Load()
	if paused == 0 {
		t.Fatalf("Exec returned %v without reloading: no NOSCRIPT after the flush?", res.err)
	}
	if !time.Unix(0, paused).Before(start.Add(budget)) {
		t.Skip("the server was paused only after the context had ended: inconclusive")
	}
	if !errors.Is(res.err, context.DeadlineExceeded) {
		t.Errorf("Exec on a server hung during the reload = %v, want DeadlineExceeded", res.err)
	}
}
