package semaphore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestRenewPermitsOneCall calls the watchdog's batched renewal directly,
// with no timing involved: permits of three semaphores, interleaved, two of
// them through a second Semaphore value of the same name, in one script
// call. Each permit gets its own answer: a deleted one, one expired on the
// server and those of a semaphore whose keys were deleted are gone and not
// brought back; the others get the renewing Manager's lease, and their
// keys' expiry follows, or the retention of a capacity set by SetCapacity.
func TestRenewPermitsOneCall(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	do := func(args ...string) string {
		t.Helper()
		out, err := srv.Do(args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return out
	}
	// The permits are taken with a fixed 5 s lease (nothing renews them in
	// the background) and renewed by hand by a Manager of 60 s leases.
	short := internalManager(t, srv.Addr(), Options{Lease: 5 * time.Second})
	long := internalManager(t, srv.Addr(), Options{WatchdogLease: time.Minute})
	prefix := "renew:" + uniqueInternal(t.Name()) + ":"
	var sems []*Semaphore
	for _, name := range []string{"a", "b", "c"} {
		s, err := short.NewSemaphore(prefix+name, 10)
		if err != nil {
			t.Fatal(err)
		}
		sems = append(sems, s)
	}
	if err := sems[1].SetCapacity(ctx, 10); err != nil {
		t.Fatal(err)
	}
	const perSem = 4
	var ps []*Permit // interleaved: a, b, c, a, b, c, ...
	for range perSem {
		for _, s := range sems {
			p, err := s.Acquire(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			ps = append(ps, p)
		}
	}
	twin, err := short.NewSemaphore(prefix+"a", 10) // the same semaphore seen twice
	if err != nil {
		t.Fatal(err)
	}
	ps[3].s, ps[9].s = twin, twin

	deleted, expired := ps[0], ps[4] // of a and of b
	do("ZREM", sems[0].keys[1], deleted.id)
	do("ZADD", sems[1].keys[1], "XX", "1", expired.id)
	do("DEL", sems[2].keys[0], sems[2].keys[1])

	items := make([]any, len(ps))
	for i, p := range ps {
		items[i] = p
	}
	errs := make([]error, len(items))
	before := scriptCalls(t, srv)
	if err := long.renewPermits(ctx, items, errs); err != nil {
		t.Fatal(err)
	}
	if calls := scriptCalls(t, srv) - before; calls != 1 {
		t.Errorf("%d script calls to renew %d permits, want 1", calls, len(items))
	}
	nowMs := func() int64 {
		tm := strings.Fields(do("TIME"))
		sec, _ := strconv.ParseInt(tm[0], 10, 64)
		us, _ := strconv.ParseInt(tm[1], 10, 64)
		return sec*1000 + us/1000
	}
	now := nowMs()
	for i, p := range ps {
		gone := p == deleted || p == expired || p.s.name == prefix+"c"
		if gone {
			if !errors.Is(errs[i], errRenewGone) {
				t.Errorf("permit %d of %s: %v, want gone", i, p.s.name, errs[i])
			}
		} else if errs[i] != nil {
			t.Errorf("permit %d of %s: %v, want renewed", i, p.s.name, errs[i])
		}
		score := do("ZSCORE", p.s.keys[1], p.id)
		switch {
		case p == expired:
			if score != "1" {
				t.Errorf("expired permit's score %q, want 1: not brought back", score)
			}
		case gone:
			if score != "" {
				t.Errorf("gone permit %d of %s has score %q, want none", i, p.s.name, score)
			}
		default:
			exp, _ := strconv.ParseInt(score, 10, 64)
			if left := exp - now; left < 55_000 || left > 60_000 {
				t.Errorf("permit %d of %s expires in %d ms, want the 60 s lease", i, p.s.name, left)
			}
		}
	}
	if n := do("EXISTS", sems[2].keys[0], sems[2].keys[1]); n != "0" {
		t.Errorf("%s keys of the deleted semaphore came back", n)
	}
	for _, k := range sems[0].keys[:2] {
		if ms, _ := strconv.ParseInt(do("PTTL", k), 10, 64); ms < 55_000 || ms > 60_000 {
			t.Errorf("PTTL %s = %d ms, want the 60 s lease of its latest permit", k, ms)
		}
	}
	for _, k := range sems[1].keys[:2] {
		if ms, _ := strconv.ParseInt(do("PTTL", k), 10, 64); ms < CapacityRetention.Milliseconds()-5_000 {
			t.Errorf("PTTL %s = %d ms, want the retention of its set capacity", k, ms)
		}
	}
}

// scriptCalls returns how many EVALSHA and EVAL calls srv has run.
func scriptCalls(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	info, err := srv.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if ok && (name == "cmdstat_evalsha" || name == "cmdstat_eval") {
			calls, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			n += calls
		}
	}
	return n
}
