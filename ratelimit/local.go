package ratelimit

import (
	"hash/maphash"
	"math"
	"sync"
	"time"
)

// localLimiter is the in-process limiter the middleware decides with while
// Redis cannot answer (FallbackLocal). It is a GCRA token bucket per key,
// whatever the algorithm Redis runs, held in a fixed number of entries.
//
// Memory is capped: the keys are split into localShards shards, each a map
// and a least-recently-used list of at most perShard entries. A new key in
// a full shard evicts the shard's least recently used key, which then
// starts again from a full bucket if it comes back. A key that floods is
// used on every one of its requests, so it stays at the front of its shard:
// to push it out, more than perShard other keys of its shard must arrive
// between two of its requests, and each of those requests is then limited
// as a key of its own. An entry whose bucket is full again holds no
// information, so forgetting it changes nothing.
//
// It needs no goroutine: entries go only when evicted.
type localLimiter struct {
	seed     maphash.Seed
	base     time.Time // origin of the stored times; carries the monotonic clock
	perShard int
	shards   [localShards]localShard
}

const localShards = 16

type localShard struct {
	mu sync.Mutex
	m  map[string]*localEntry // guarded by mu
	// LRU list guarded by mu: head is the most recently used entry.
	head, tail *localEntry
	_          [40]byte // keep shards on separate cache lines
}

type localEntry struct {
	key        string
	prev, next *localEntry
	// tat holds, per policy, the time (since base) at which the bucket is
	// full again.
	tat []time.Duration
}

// localPolicy is one bucket's parameters: burst tokens, one earned back
// every interval.
type localPolicy struct {
	interval float64 // nanoseconds per token
	burst    int
}

func localPolicyOf(lim Limit, capacity int) localPolicy {
	return localPolicy{interval: float64(lim.Period) / float64(lim.Rate), burst: capacity}
}

func newLocalLimiter(keys int) *localLimiter {
	c := &localLimiter{seed: maphash.MakeSeed(), base: time.Now(), perShard: max((keys+localShards-1)/localShards, 1)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]*localEntry)
	}
	return c
}

// allow decides a request of cost n for key against every policy of ps at
// now, counting it in each only when all allow it, and writes each policy's
// state to res (len(ps)). It reports whether the request is allowed.
func (c *localLimiter) allow(key string, now time.Time, n int, ps []localPolicy, res []Result) bool {
	t := now.Sub(c.base)
	s := &c.shards[maphash.String(c.seed, key)%localShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[key]
	if e == nil || len(e.tat) != len(ps) {
		if e == nil {
			if len(s.m) >= c.perShard {
				s.evict()
			}
			e = &localEntry{key: key}
			s.m[key] = e
		} else {
			s.unlink(e)
		}
		e.tat = make([]time.Duration, len(ps))
		for i := range e.tat {
			e.tat[i] = t
		}
	} else {
		s.unlink(e)
	}
	s.pushFront(e)
	allowed := true
	for i, p := range ps {
		wait := max(e.tat[i]-t, 0) // a whole number of nanoseconds
		ahead := float64(wait)
		after := ahead + float64(n)*p.interval
		tolerance := float64(p.burst) * p.interval
		r := Result{Allowed: after <= tolerance, Limit: p.burst}
		if r.Allowed {
			r.Remaining = tokens(tolerance-after, p.interval)
			r.ResetAfter = time.Duration(math.Ceil(after))
		} else {
			allowed = false
			r.Remaining = tokens(tolerance-ahead, p.interval)
			r.RetryAfter = time.Duration(math.Ceil(after - tolerance))
			r.ResetAfter = wait
		}
		res[i] = r
	}
	if allowed {
		for i, p := range ps {
			e.tat[i] = max(e.tat[i], t) + time.Duration(math.Ceil(float64(n)*p.interval))
		}
		return true
	}
	// Not counted: the policies that had room report what they have, not
	// what they would have had.
	for i, p := range ps {
		if res[i].Allowed {
			wait := max(e.tat[i]-t, 0)
			res[i].Remaining = tokens(float64(p.burst)*p.interval-float64(wait), p.interval)
			res[i].ResetAfter = wait
		}
	}
	return false
}

// tokens is how many whole intervals fit in room; the 1e-9 absorbs float
// error in a division that should be exact.
func tokens(room, interval float64) int {
	return max(int(math.Floor(room/interval+1e-9)), 0)
}

// len returns the number of keys held, for tests.
func (c *localLimiter) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

func (s *localShard) evict() {
	if e := s.tail; e != nil {
		s.unlink(e)
		delete(s.m, e.key)
	}
}

func (s *localShard) unlink(e *localEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		s.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		s.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (s *localShard) pushFront(e *localEntry) {
	e.next = s.head
	if s.head != nil {
		s.head.prev = e
	}
	s.head = e
	if s.tail == nil {
		s.tail = e
	}
}
