package semaphore

// White-box tests: they set up Redis state or timings that the public API
// cannot produce on demand. TestMain is in semaphore_test.go.

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

const internalWait = 10 * time.Second // bounds waits for things that must happen

func internalManager(t *testing.T, addr string, opts Options) *Manager {
	t.Helper()
	client := redistest.Client(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), internalWait)
	defer cancel()
	sc, err := scriptcache.New(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManager(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// TestOwnExpiredGrantWrittenBack (S2): a retried id whose earlier grant
// expired, but was not among the 16 expired permits reclaimed first, is
// dropped by the acquire script. If the retry is then refused, the lower
// weight in use must still be stored, or the semaphore shrinks for good.
func TestOwnExpiredGrantWrittenBack(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	m := internalManager(t, srv.Addr(), Options{})
	s, err := m.NewSemaphore("s2", 25)
	if err != nil {
		t.Fatal(err)
	}
	// 16 expired permits of weight 1 (scores 1..16), the retried id "own"
	// of weight 2 expired after them, and a live permit of weight 3.
	hset := []string{"HSET", s.keys[0], ":used", "21", ":cap", "25", "own", "2", "live", "3"}
	zadd := []string{"ZADD", s.keys[1], "17", "own", strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10), "live"}
	for i := 1; i <= 16; i++ {
		id := "old" + strconv.Itoa(i)
		hset = append(hset, id, "1")
		zadd = append(zadd, strconv.Itoa(i), id)
	}
	for _, cmd := range [][]string{hset, zadd} {
		if _, err := srv.Do(cmd...); err != nil {
			t.Fatal(err)
		}
	}
	// Only "live" is held (3 of 25): a retry of "own" for 23 does not fit.
	r, err := s.call(ctx, "own", 23)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != 0 || r.used != 3 {
		t.Fatalf("retry of an expired id = %+v, want status 0 with 3 in use", r)
	}
	if got, err := s.Available(ctx); err != nil || got != 22 {
		t.Fatalf("Available = %d, %v; want 22 (25 less the live permit's 3)", got, err)
	}
}
