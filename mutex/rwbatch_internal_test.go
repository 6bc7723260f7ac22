package mutex

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestRenewRWOneCall calls the watchdog's batched renewal of RWMutex holds
// directly, with no timing involved: write and read holds of four
// read-write locks, interleaved, in one script call. Each hold gets its
// own answer: a reader deleted from its set, a reader and a writer whose
// ends have passed, and both holds of a lock whose keys were deleted are
// gone and not brought back; the others get the lease again, from the
// server's time, and their keys' TTLs are stretched to it but never
// shortened.
func TestRenewRWOneCall(t *testing.T) {
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
	nowMs := func() int64 {
		tm := strings.Fields(do("TIME"))
		sec, _ := strconv.ParseInt(tm[0], 10, 64)
		us, _ := strconv.ParseInt(tm[1], 10, 64)
		return sec*1000 + us/1000
	}
	sc, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	// The watchdog's first renewal is 20 s away: only the call below renews.
	l, err := NewLocker(sc, Options{WatchdogLease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	prefix := "rwrenew:" + t.Name() + ":"
	newRW := func(name string) *RWMutex {
		t.Helper()
		rw, err := l.NewRWMutex(prefix + name)
		if err != nil {
			t.Fatal(err)
		}
		return rw
	}
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// a: a writer with its own read hold.
	// b: four readers (values of one name share its keys), one deleted
	//    from the readers set, one expired.
	// c: a writer with its own read hold, the lock's keys deleted.
	// d: a writer whose end has passed.
	wa := newRW("a")
	check(wa.Lock(ctx))
	check(wa.RLock(ctx))
	rb1, rb2, rb3, rb4 := newRW("b"), newRW("b"), newRW("b"), newRW("b")
	for _, rw := range []*RWMutex{rb1, rb2, rb3, rb4} {
		check(rw.RLock(ctx))
	}
	wc, wd := newRW("c"), newRW("d")
	check(wc.Lock(ctx))
	check(wc.RLock(ctx))
	check(wd.Lock(ctx))

	// The holds that stay are set to end 5 s from now, and their keys to
	// expire then, except a's readers set, which keeps a longer TTL.
	soon := strconv.FormatInt(nowMs()+5000, 10)
	do("HSET", wa.renewKeys[0], "e", soon)
	do("ZADD", wa.renewKeys[1], "XX", soon, wa.r.id)
	do("ZADD", rb1.renewKeys[1], "XX", soon, rb1.r.id, soon, rb3.r.id)
	do("PEXPIRE", wa.renewKeys[0], "5000")
	do("PEXPIRE", wa.renewKeys[1], "120000")
	do("PEXPIRE", rb1.renewKeys[1], "5000")
	do("ZREM", rb4.renewKeys[1], rb4.r.id)
	do("ZADD", rb2.renewKeys[1], "XX", "1", rb2.r.id)
	do("DEL", wc.renewKeys[0], wc.renewKeys[1])
	do("HSET", wd.renewKeys[0], "e", "1")

	sides := []*rwSide{&wa.w, &rb1.r, &rb4.r, &wc.w, &wa.r, &rb2.r, &wd.w, &rb3.r, &wc.r}
	gone := map[*rwSide]bool{&rb4.r: true, &rb2.r: true, &wc.w: true, &wc.r: true, &wd.w: true}
	items := make([]any, len(sides))
	for i, sd := range sides {
		items[i] = sd
	}
	errs := make([]error, len(items))
	before := evalCalls(t, srv)
	if err := l.renewRW(ctx, items, errs); err != nil {
		t.Fatal(err)
	}
	if calls := evalCalls(t, srv) - before; calls != 1 {
		t.Errorf("%d script calls to renew %d holds, want 1", calls, len(items))
	}
	now := nowMs()
	for i, sd := range sides {
		what := sd.rw.name + " (" + kind(sd.write) + ")"
		if gone[sd] {
			if !errors.Is(errs[i], errRWRenewGone) {
				t.Errorf("hold %d, %s: %v, want gone", i, what, errs[i])
			}
		} else if errs[i] != nil {
			t.Errorf("hold %d, %s: %v, want renewed", i, what, errs[i])
		}
		var end string
		if sd.write {
			end = do("HGET", sd.rw.renewKeys[0], "e")
		} else {
			end = do("ZSCORE", sd.rw.renewKeys[1], sd.id)
		}
		switch {
		case sd == &rb2.r || sd == &wd.w:
			if end != "1" {
				t.Errorf("hold %d, %s: end %q, want 1: not brought back", i, what, end)
			}
		case gone[sd]:
			if end != "" {
				t.Errorf("hold %d, %s: end %q, want none", i, what, end)
			}
		default:
			e, _ := strconv.ParseInt(end, 10, 64)
			if left := e - now; left < 55_000 || left > 60_000 {
				t.Errorf("hold %d, %s: ends in %d ms, want the 60 s lease", i, what, left)
			}
		}
	}
	if n := do("EXISTS", wc.renewKeys[0], wc.renewKeys[1]); n != "0" {
		t.Errorf("%s keys of the deleted lock came back", n)
	}
	for _, k := range []string{wa.renewKeys[0], rb1.renewKeys[1]} {
		if ms, _ := strconv.ParseInt(do("PTTL", k), 10, 64); ms < 55_000 || ms > 60_000 {
			t.Errorf("PTTL %s = %d ms, want the 60 s lease", k, ms)
		}
	}
	if ms, _ := strconv.ParseInt(do("PTTL", wa.renewKeys[1]), 10, 64); ms < 110_000 {
		t.Errorf("PTTL %s = %d ms, want the longer 120 s kept", wa.renewKeys[1], ms)
	}
}

// evalCalls returns how many EVALSHA and EVAL calls srv has run.
func evalCalls(t *testing.T, srv *redistest.Server) int64 {
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
