package ratelimit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// countReplies makes l count the script replies it decodes (it replaces
// l.afterReply).
func countReplies(l *Limiter) *atomic.Int64 {
	var n atomic.Int64
	l.afterReply = func(string, Result) { n.Add(1) }
	return &n
}

// TestWaitSleepsRetryAfter checks that Wait sleeps the server's
// RetryAfter between tries: each try after a denial comes at least that
// long after it (a lower bound no load can break: timers never fire
// early), and a Wait ends allowed within a handful of tries.
func TestWaitSleepsRetryAfter(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	for _, algo := range algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			l := newLimiter(t, sc, Options{Algorithm: algo, Limit: Limit{Rate: 1, Period: 50 * time.Millisecond}, DisableDenyCache: true})
			type try struct {
				at  time.Time
				res Result
			}
			var mu sync.Mutex
			var tries []try
			l.afterReply = func(_ string, res Result) {
				mu.Lock()
				tries = append(tries, try{time.Now(), res})
				mu.Unlock()
			}
			for i := range 3 {
				allow(t, l, "k", 1) // spend the limit, so Wait usually waits
				mu.Lock()
				tries = tries[:0]
				mu.Unlock()
				res, err := l.Wait(context.Background(), "k", 1)
				if err != nil || !res.Allowed {
					t.Fatalf("Wait %d: %+v, %v; want allowed", i+1, res, err)
				}
				mu.Lock()
				got := append([]try(nil), tries...)
				mu.Unlock()
				if len(got) < 1 || len(got) > 10 || !got[len(got)-1].res.Allowed {
					t.Fatalf("Wait %d made %d tries, the last %+v; want 1 to 10 ending allowed", i+1, len(got), got[len(got)-1].res)
				}
				for j := 1; j < len(got); j++ {
					want := max(got[j-1].res.RetryAfter, minWait)
					if gap := got[j].at.Sub(got[j-1].at); gap < want {
						t.Errorf("Wait %d: try %d came %v after a denial with RetryAfter %v; want at least that", i+1, j+1, gap, want)
					}
				}
			}
		})
	}
}

// TestWaitGivesUp checks the three ways Wait fails without sleeping for
// nothing: a cost that never fits, a deadline before the request could
// pass, and a context cancelled while it sleeps.
func TestWaitGivesUp(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	l := newLimiter(t, sc, Options{Limit: PerHour(2)})
	calls := countReplies(l)
	if _, err := l.Wait(context.Background(), "k", 3); !errors.Is(err, ErrCostTooHigh) || calls.Load() != 0 {
		t.Fatalf("Wait(cost 3) with burst 2: %v after %d calls; want ErrCostTooHigh and no call", err, calls.Load())
	}
	for range 2 {
		allow(t, l, "k", 1)
	}
	// A deadline well before the half hour the key is denied for.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before := calls.Load()
	res, err := l.Wait(ctx, "k", 1)
	if !errors.Is(err, ErrNotAllowed) || !errors.Is(err, context.DeadlineExceeded) || res.Allowed || res.RetryAfter < 29*time.Minute {
		t.Fatalf("Wait with a 1m deadline: %+v, %v; want the denial and ErrNotAllowed, DeadlineExceeded", res, err)
	}
	if n := calls.Load() - before; n != 1 {
		t.Errorf("Wait with a 1m deadline made %d calls; want 1", n)
	}
	// No deadline: cancelled once the denial is in, so while it sleeps.
	l2 := newLimiter(t, sc, Options{Limit: PerHour(2), DisableDenyCache: true})
	allow(t, l2, "k", 2)
	ctx2, cancel2 := context.WithCancel(context.Background())
	var once sync.Once
	l2.afterReply = func(string, Result) { once.Do(cancel2) }
	if _, err := l2.Wait(ctx2, "k", 1); !errors.Is(err, ErrNotAllowed) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait cancelled: %v; want ErrNotAllowed and context.Canceled", err)
	}
}

// TestWaitPolicies checks WaitPolicies against two policies, the second of
// which decides the wait, and that waiters share the limit: 4 goroutines
// each wait for 3 requests at 1 per 20ms, burst 1.
func TestWaitPolicies(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	l := newLimiter(t, sc, Options{Limit: PerSecond(1)})
	ps := newPolicies(t,
		Policy{Name: "hour", Algorithm: FixedWindow, Limit: PerHour(1000)},
		Policy{Name: "fast", Limit: Limit{Rate: 1, Period: 20 * time.Millisecond}},
	)
	calls := countReplies(l)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 3 {
				if d, err := l.WaitPolicies(context.Background(), "k", 1, ps); err != nil || !d.Allowed {
					t.Errorf("WaitPolicies: %+v, %v; want allowed", d, err)
				}
			}
		})
	}
	wg.Wait()
	d := allowPolicies(t, l, "k", 0, ps)
	if d.Results[0].Remaining != 1000-12 {
		t.Errorf("hour policy: %d remaining; want %d (12 allowed, denials not counted)", d.Results[0].Remaining, 1000-12)
	}
	// Every request was tried at least once; waiters that did not sleep
	// between tries would make thousands over the 220ms this takes.
	if n := calls.Load(); n < 12 || n > 1000 {
		t.Errorf("%d tries for 12 requests; want 12 to 1000", n)
	}
}
