package scriptcache_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestObserveReload: a NOSCRIPT reload is reported to the observer and
// logged at Info.
func TestObserveReload(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	var mu sync.Mutex
	var events []scriptcache.Event
	obs := scriptcache.ObserverFunc(func(e scriptcache.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	})
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	sc, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()), scriptcache.WithFS(testFS), scriptcache.WithObserver(obs), scriptcache.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	if sc.Observer() == nil {
		t.Fatal("Observer() = nil with an observer and a logger")
	}
	s, err := sc.Script("echo")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s.Exec(ctx, []string{"k"}, []string{"1"}).ToString(); err != nil || v != "k1" {
		t.Fatalf("Exec = %q, %v", v, err)
	}
	if err := srv.FlushScripts(); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Exec(ctx, []string{"k"}, []string{"2"}).ToString(); err != nil || v != "k2" {
		t.Fatalf("Exec after SCRIPT FLUSH = %q, %v", v, err)
	}
	mu.Lock()
	got := events
	mu.Unlock()
	if len(got) != 1 || got[0].Kind != scriptcache.EventScriptReload || got[0].Name != "echo" || got[0].Primitive != "script" || got[0].Err != nil {
		t.Fatalf("events %+v; want one reload of echo", got)
	}
	if l := logs.String(); !strings.Contains(l, "level=INFO") || !strings.Contains(l, "script reloaded") || !strings.Contains(l, "name=echo") {
		t.Errorf("log %q; want an Info record of the reload", l)
	}
}

// TestNoObserver: without options the Cache has no observer, so the
// primitives build no events.
func TestNoObserver(t *testing.T) {
	sc, err := scriptcache.New(context.Background(), miniClient(t), scriptcache.WithFS(testFS))
	if err != nil {
		t.Fatal(err)
	}
	if o := sc.Observer(); o != nil {
		t.Fatalf("Observer() = %v; want nil", o)
	}
}
