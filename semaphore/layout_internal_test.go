package semaphore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestRenewKeepsKeysUntilX: a grant trusts the hash's ':x' to know that
// both keys live long enough, instead of asking (PTTL). So a renewal must
// never set their expiry before ':x', although its own permits, and every
// permit listed, end before it: a grant of a 1 min lease sets ':x' a
// sixteenth of that lease after its permit's end, and a renewal of a 3 s
// permit then finds the latest permit ending before ':x'.
func TestRenewKeepsKeysUntilX(t *testing.T) {
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
	long := internalManager(t, srv.Addr(), Options{Lease: time.Minute})
	short := internalManager(t, srv.Addr(), Options{Lease: 3 * time.Second}) // renewed by hand below
	name := uniqueInternal("renew-x")
	sl, err := long.NewSemaphore(name, 4)
	if err != nil {
		t.Fatal(err)
	}
	ss, err := short.NewSemaphore(name, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sl.Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	p, err := ss.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	x, err := strconv.ParseInt(do("HGET", sl.keys[0], ":x"), 10, 64)
	if err != nil {
		t.Fatalf("':x' after a grant: %v", err)
	}
	errs := make([]error, 1)
	if err := short.renewPermits(ctx, []any{p}, errs); err != nil || errs[0] != nil {
		t.Fatalf("renewal: %v, %v", err, errs[0])
	}
	for _, k := range sl.keys[:2] {
		at, _ := strconv.ParseInt(do("PEXPIRETIME", k), 10, 64)
		if at < x {
			t.Errorf("%s expires at %d after the renewal, before ':x' %d", k, at, x)
		}
	}
}

// TestGrantNeverShortensKeysExpiry: ':x' is only a floor of the keys'
// expiry (the fair queue's grants, renewals and releases move the expiry
// later without writing it), so a grant that finds ':x' missing or too
// early must not set an expiry before the one the keys have: a permit of a
// 1 min lease would otherwise vanish with its keys a short lease later.
// The fair case is the one seen: TestInfo's fair permit (30 s watchdog
// lease) lost its keys about 107 ms after a 100 ms grant on the same name.
func TestGrantNeverShortensKeysExpiry(t *testing.T) {
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
	for _, tc := range []struct {
		name  string
		fair  bool
		stale bool // ':x' rewritten to a time already past (it stays a floor)
	}{
		{name: "fair grant, no x", fair: true},
		{name: "unfair grant, stale x", stale: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			long := internalManager(t, srv.Addr(), Options{Lease: time.Minute, Fair: tc.fair})
			short := internalManager(t, srv.Addr(), Options{Lease: 100 * time.Millisecond})
			name := uniqueInternal("grant-x")
			sl, err := long.NewSemaphore(name, 4)
			if err != nil {
				t.Fatal(err)
			}
			ss, err := short.NewSemaphore(name, 4)
			if err != nil {
				t.Fatal(err)
			}
			p, err := sl.Acquire(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			if tc.stale {
				do("HSET", sl.keys[0], ":x", "1")
			}
			if _, err := ss.Acquire(ctx, 1); err != nil {
				t.Fatal(err)
			}
			end, err := strconv.ParseFloat(do("ZSCORE", sl.keys[1], p.ID()), 64)
			if err != nil {
				t.Fatalf("the 1 min permit's expiry: %v", err)
			}
			for _, k := range sl.keys[:2] {
				at, _ := strconv.ParseInt(do("PEXPIRETIME", k), 10, 64)
				if float64(at) < end {
					t.Errorf("%s expires at %d after the 100 ms grant, %.0f ms before the 1 min permit it lists", k, at, end-float64(at))
				}
			}
		})
	}
}

// TestChannelNamedAfterHash: semaphore_acquire and semaphore_release are
// sent the hash and the sorted set alone and publish on KEYS[1] .. ':w',
// which must be the channel the waiters subscribe to (keys[2]), for every
// name, the escaped ones too.
func TestChannelNamedAfterHash(t *testing.T) {
	srv := redistest.NewServer(t)
	m := internalManager(t, srv.Addr(), Options{Prefix: "p:"})
	for _, name := range []string{"a", "}b", "~c", "d{e}f", "{}"} {
		s, err := m.NewSemaphore(name, 1)
		if err != nil {
			t.Fatal(err)
		}
		if want := s.keys[0] + ":w"; s.keys[2] != want {
			t.Errorf("%q: channel %q, want %q (the hash's name + \":w\")", name, s.keys[2], want)
		}
	}
}
