package notify

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// recorder keeps the events an Observer is told.
type recorder struct {
	mu     sync.Mutex
	events []scriptcache.Event
}

func (r *recorder) Observe(e scriptcache.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) reasons() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		if e.Kind != scriptcache.EventSubscription || e.Primitive != "mutex" || e.Name != "{n}:observed" {
			return []string{"unexpected event"}
		}
		out = append(out, e.Reason)
	}
	return out
}

// TestObserveSubscription: a subscription back after a drop, and a refused
// one, are reported before the waiters hear of them.
func TestObserveSubscription(t *testing.T) {
	srv := redistest.NewServer(t)
	if _, err := srv.Do("ACL", "SETUSER", "u", "on", ">pw", "~*", "+@all", "allchannels"); err != nil {
		t.Fatal(err)
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true, Username: "u", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	rec := &recorder{}
	hc := hubClient(t, client)
	h := NewObserved(hc, false, rec, scriptcache.PrimitiveMutex, nil)
	defer h.Close()
	ch := "{n}:observed"
	w, err := h.Subscribe(ch, 1)
	if err != nil {
		t.Fatal(err)
	}
	ready(t, w)
	if _, err := srv.Do("CLIENT", "KILL", "USER", "u"); err != nil {
		t.Fatal(err)
	}
	woken(t, w)
	w.Close()
	// rueidis re-subscribes inside one Subscribe call, so the drop itself
	// may not be seen; the return is.
	got := rec.reasons()
	if len(got) == 2 && got[0] == scriptcache.ReasonDropped {
		got = got[1:]
	}
	if len(got) != 1 || got[0] != scriptcache.ReasonResubscribed {
		t.Fatalf("reasons %v; want [dropped] resubscribed", rec.reasons())
	}
	h.Close() // its lingering subscription would be refused too
	n := len(rec.reasons())
	// Channels taken away: the next subscription is refused.
	if _, err := srv.Do("ACL", "SETUSER", "u", "resetchannels"); err != nil {
		t.Fatal(err)
	}
	h2 := NewObserved(hc, false, rec, scriptcache.PrimitiveMutex, nil)
	defer h2.Close()
	w2, err := h2.Subscribe(ch, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Leave()
	if err := w2.Ready(context.Background(), time.Hour); !errors.Is(err, ErrSubscribe) {
		t.Fatalf("Ready = %v, want ErrSubscribe", err)
	}
	if got := rec.reasons(); len(got) != n+1 || got[n] != scriptcache.ReasonRefused {
		t.Fatalf("reasons %v; want refused last", got)
	}
}
