package semaphore

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestNoneFreeWaitHint: semaphore_acquire answers a refusal with no permit
// free as one integer, -1 - wait, and call must read back exactly that
// wait: 0 when expired permits remain to reclaim (the header: the caller
// simply calls again, and the next call reclaims them and is granted), else
// the milliseconds until the earliest live permit ends, never past it.
// Both on a real server, with the states written by hand: 18 expired
// permits on a capacity of 1 (16 reclaimed per call, 2 still in use) and
// one live permit. A mutant of fromInteger that read +1 - v made every
// such wait 2 ms longer: a waiter slept 3 ms before the call that would
// have been made at once; no test read the hint.
func TestNoneFreeWaitHint(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	m := internalManager(t, srv.Addr(), Options{})
	client := redistest.Client(t, srv.Addr())
	serverMs := func() int64 {
		t.Helper()
		tm, err := client.Do(ctx, client.B().Time().Build()).AsStrSlice()
		if err != nil || len(tm) != 2 {
			t.Fatalf("TIME = %v, %v", tm, err)
		}
		s, _ := strconv.ParseInt(tm[0], 10, 64)
		us, _ := strconv.ParseInt(tm[1], 10, 64)
		return s*1000 + us/1000
	}
	do := func(cmd ...string) {
		t.Helper()
		if _, err := srv.Do(cmd...); err != nil {
			t.Fatal(err)
		}
	}

	expired, err := m.NewSemaphore("hint-expired", 1)
	if err != nil {
		t.Fatal(err)
	}
	zadd := []string{"ZADD", expired.keys[1]}
	for i := 1; i <= 18; i++ {
		zadd = append(zadd, strconv.Itoa(i), "old"+strconv.Itoa(i))
	}
	do("HSET", expired.keys[0], ":cap", "1")
	do(zadd...)
	r, err := expired.call(ctx, "a", 1, tryOnce)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != 0 || r.wait != 0 {
		t.Fatalf("a call behind 18 expired permits = %+v, want status 0 and wait 0 (call again at once: 2 remain to reclaim)", r)
	}
	if r, err := expired.call(ctx, "a", 1, tryOnce); err != nil || r.status != 1 {
		t.Fatalf("the call again = %+v, %v; want granted (the last 2 reclaimed)", r, err)
	}

	live, err := m.NewSemaphore("hint-live", 1)
	if err != nil {
		t.Fatal(err)
	}
	end := serverMs() + 60_000
	do("HSET", live.keys[0], ":cap", "1")
	do("ZADD", live.keys[1], strconv.FormatInt(end, 10), "holder")
	before := serverMs()
	r, err = live.call(ctx, "b", 1, tryOnce)
	after := serverMs()
	if err != nil {
		t.Fatal(err)
	}
	if r.status != 0 || r.wait > end-before || r.wait < end-after {
		t.Fatalf("a call while the one permit is held = %+v, want status 0 and a wait between %d and %d ms (until it ends)", r, end-after, end-before)
	}
}
