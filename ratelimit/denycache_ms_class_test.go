package ratelimit

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// TestDenialOverNowNotCachedMs: a fixed window's denial in the last
// millisecond of its window (the key's PTTL is 0: a key is still there in
// the millisecond it expires) has RetryAfter 0; that denial is over at
// once, so the Limiter adds nothing to its deny cache for it (an entry
// would still take a place in the bounded cache until a lookup or a sweep
// drops it, and could make a sweep push out a live denial). One ms
// more, and the denial is cached until start + 1 ms. On a real server no
// test can pick that millisecond; miniredis's clock stands still while the
// test sets the key's TTL below or at 1 ms.
func TestDenialOverNowNotCachedMs(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	sc := newCache(t, mr.Addr())
	for _, c := range []struct {
		name    string
		ttl     time.Duration // the window key's TTL at the denial
		retry   time.Duration
		entries int
	}{
		{"window ends within the ms (PTTL 0): not cached", 500 * time.Microsecond, 0, 0},
		{"window ends in 1 ms: cached", time.Millisecond, time.Millisecond, 1},
		{"window ends in 2 ms: cached", 2 * time.Millisecond, 2 * time.Millisecond, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			mr.FlushAll() // the state of this case only
			l := newLimiter(t, sc, Options{Algorithm: FixedWindow, Limit: PerMinute(1)})
			if res := allow(t, l, "k", 1); !res.Allowed {
				t.Fatalf("call 1: %+v, want allowed", res)
			}
			mr.SetTTL(l.RedisKey("k"), c.ttl)
			res := allow(t, l, "k", 1)
			if res.Allowed || res.RetryAfter != c.retry {
				t.Fatalf("call 2: %+v, want denied with RetryAfter %v", res, c.retry)
			}
			if n := l.deny.len(); n != c.entries {
				t.Errorf("deny cache entries after the denial = %d, want %d", n, c.entries)
			}
		})
	}
}
