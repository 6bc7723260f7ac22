package semaphore_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// TestScriptAcquireMovesExpiryOncePerSixteenthOfLease: semaphore_acquire's
// header promises that a grant moves the keys' expiry (PTTL and PEXPIREAT
// twice, and ':x' written) only when ':x', the floor it last set, comes
// before the new permit's end: then to that end plus 1 + lease/16 ms, so
// that the grants of the next lease/16 ms write no expiry at all (the
// common grant stays ZCARD, ZADD NX and the fields). Both ways: a second
// grant of the same lease right after the first writes none and leaves
// ':x'; a grant of a longer lease moves both keys' expiry and ':x' past
// its end. A mutant that read ':cap' for ':x' (a number far in the past)
// moved the expiry on every grant, four calls more each, and nothing
// counted them. The lease (about 27 min) leaves 100 s between the first
// two calls before the first ':x' falls short: no loaded machine takes
// that long.
func TestScriptAcquireMovesExpiryOncePerSixteenthOfLease(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	e := newEnv(t, []string{srv.Addr()}, semaphore.Options{})
	name := uniqueName(t)
	acq := script(t, e, "semaphore_acquire")
	keys := []string{e.key(name, ""), e.key(name, ":e"), e.key(name, ":w")}
	const lease, longer = 1_600_000, 3_200_000
	grant := func(id string, leaseMs int64) (pexpireat int64) {
		t.Helper()
		before := commandCalls(t, srv)["pexpireat"]
		if got, err := acq.Exec(ctx, keys, []string{"20", "1", id, strconv.FormatInt(leaseMs, 10), "pa"}).AsInt64(); err != nil || got != 1 {
			t.Fatalf("grant of %s = %d, %v; want 1", id, got, err)
		}
		return commandCalls(t, srv)["pexpireat"] - before
	}
	x := func() int64 {
		t.Helper()
		v, err := e.client.Do(ctx, e.client.B().Hget().Key(keys[0]).Field(":x").Build()).AsInt64()
		if err != nil {
			t.Fatalf("HGET :x: %v", err)
		}
		return v
	}
	start := serverMs(t, e)
	if n := grant("a", lease); n != 2 {
		t.Fatalf("the first grant made %d PEXPIREAT calls, want 2 (both keys)", n)
	}
	x1 := x()
	if x1 < start+lease+1+lease/16 {
		t.Fatalf(":x = %d after the first grant, want at least its end plus 1 + lease/16 (%d)", x1, start+lease+1+lease/16)
	}
	if n := grant("b", lease); n != 0 {
		t.Errorf("a grant of the same lease within lease/16 of the first made %d PEXPIREAT calls, want none (:x is ahead of its end)", n)
	}
	if v := x(); v != x1 {
		t.Errorf(":x = %d after the second grant, want it left at %d", v, x1)
	}
	now := serverMs(t, e)
	if n := grant("c", longer); n != 2 {
		t.Errorf("a grant of a longer lease made %d PEXPIREAT calls, want 2 (:x falls before its end)", n)
	}
	if v := x(); v < now+longer+1 {
		t.Errorf(":x = %d after the longer grant, want past its end %d", v, now+longer+1)
	}
	for _, k := range keys[:2] {
		ttl, err := e.client.Do(ctx, e.client.B().Pttl().Key(k).Build()).AsInt64()
		if err != nil || ttl <= lease+lease/16 {
			t.Errorf("PTTL %s = %d, %v after the longer grant; want past the longer permit's end (over %d ms)", k, ttl, err, lease+lease/16)
		}
	}
}
