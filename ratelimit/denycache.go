package ratelimit

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// denyCache remembers keys Redis denied, until the time Redis said they stay
// denied, so a flood from one key costs no round trips.
//
// Correctness rests on two rules kept by its callers: an entry's deadline is
// the local time taken before the request was sent plus the server's
// retry-after (so it ends no later than the server's deadline), and an entry
// is only added when the denial covers every cost >= 1. Redis state only
// moves towards "denied" until then (other processes can only add requests),
// so a local denial is always the answer Redis would give. Reset is the
// exception, and only for the process that calls it: remove bumps the key's
// shard generation, and add refuses an entry whose request was sent under an
// older generation, so a denial Redis decided before a Reset's DEL is never
// cached after the Reset dropped the key's entry.
//
// Entries are keyed by the user key and the id of the limit that denied it
// (empty for a Limiter's own Limit, Policies.id for a policy set), so that
// a denial under one limit never answers for another: two plans with
// different limits on the same key keep separate entries. All entries of
// one user key live in one shard.
//
// The map is split into shards, each under its own RWMutex, so lookups of
// different keys do not contend and a lookup of one hot key takes only a
// read lock. It needs no goroutine: expired entries go when they are looked
// up, and when the cache is over its size the inserting call sweeps it.
type denyCache struct {
	seed   maphash.Seed
	max    int64
	count  atomic.Int64 // entries in all shards
	sweep  sync.Mutex   // one sweeper at a time
	shards [denyShards]denyShard
}

const denyShards = 32

type denyShard struct {
	mu  sync.RWMutex
	m   map[denyKey]*denyEntry // guarded by mu
	gen atomic.Uint64          // removals so far; written under mu
	_   [32]byte               // keep shards on separate cache lines
}

type denyKey struct {
	id  string // "" for a Limiter's own Limit, else Policies.id
	key string
}

// denyEntry is immutable once stored.
type denyEntry struct {
	until   time.Time // every cost >= 1 is denied before this
	resetAt time.Time // the key is back to a full limit (lower bound)
	// policies holds, for a policy set, each policy's state as Redis
	// last reported it; nil for a single limit.
	policies []denyPolicy
}

type denyPolicy struct {
	until     time.Time // this policy denies before this; zero if it had room
	resetAt   time.Time
	remaining int // as last reported, for a policy that had room
}

func newDenyCache(size int) *denyCache {
	c := &denyCache{seed: maphash.MakeSeed(), max: int64(size)}
	for i := range c.shards {
		c.shards[i].m = make(map[denyKey]*denyEntry)
	}
	return c
}

func (c *denyCache) shard(key string) *denyShard {
	return &c.shards[maphash.String(c.seed, key)%denyShards]
}

// lookup returns the local denial for key at now, if there is one.
func (c *denyCache) lookup(key string, now time.Time, limit int) (Result, bool) {
	e := c.entry("", key, now)
	if e == nil {
		return Result{}, false
	}
	retry := e.until.Sub(now)
	return Result{
		Allowed:    false,
		Limit:      limit,
		Remaining:  0,
		RetryAfter: retry,
		ResetAfter: max(e.resetAt.Sub(now), retry),
	}, true
}

// entry returns the live entry of (id, key) at now, or nil, dropping an
// expired one.
func (c *denyCache) entry(id, key string, now time.Time) *denyEntry {
	s := c.shard(key)
	k := denyKey{id, key}
	s.mu.RLock()
	e := s.m[k]
	s.mu.RUnlock()
	if e == nil {
		return nil
	}
	if !now.Before(e.until) {
		s.mu.Lock()
		if s.m[k] == e {
			delete(s.m, k)
			c.count.Add(-1)
		}
		s.mu.Unlock()
		return nil
	}
	return e
}

// generation returns the removal generation of key's shard, to be read
// before the request whose denial may be added is sent.
func (c *denyCache) generation(key string) uint64 {
	return c.shard(key).gen.Load()
}

// add records that key is denied from start (the local time before the
// request was sent) for res.RetryAfter, unless a key of its shard was
// removed since gen was read: that denial may predate a Reset.
func (c *denyCache) add(key string, start time.Time, res Result, gen uint64) {
	c.put("", key, start, &denyEntry{until: start.Add(res.RetryAfter), resetAt: start.Add(res.ResetAfter)}, gen)
}

func (c *denyCache) put(id, key string, start time.Time, e *denyEntry, gen uint64) {
	k := denyKey{id, key}
	s := c.shard(key)
	s.mu.Lock()
	if s.gen.Load() != gen {
		s.mu.Unlock()
		return
	}
	_, had := s.m[k]
	s.m[k] = e
	s.mu.Unlock()
	if !had && c.count.Add(1) > c.max {
		c.shrink(start)
	}
}

// remove forgets key under the limits ids names ("" for the Limiter's
// own), and keeps denials of requests sent before it out of the cache.
func (c *denyCache) remove(key string, ids ...string) {
	s := c.shard(key)
	s.mu.Lock()
	s.gen.Add(1)
	for _, id := range ids {
		if _, ok := s.m[denyKey{id, key}]; ok {
			delete(s.m, denyKey{id, key})
			c.count.Add(-1)
		}
	}
	s.mu.Unlock()
}

// shrink drops expired entries, then arbitrary ones, until the cache holds
// at most three quarters of its size, so that a cache full of live entries
// is swept once per quarter of its size in insertions, not on every one.
// Dropping a live entry is safe: it only costs a round trip later.
func (c *denyCache) shrink(now time.Time) {
	if !c.sweep.TryLock() {
		return // another call is already sweeping
	}
	defer c.sweep.Unlock()
	target := c.max * 3 / 4
	for pass := 0; pass < 2 && c.count.Load() > target; pass++ {
		for i := range c.shards {
			s := &c.shards[i]
			s.mu.Lock()
			for k, e := range s.m {
				if pass == 0 && now.Before(e.until) {
					continue
				}
				// Live entries go only down to the target: checked
				// before each, so that no shard after the one that
				// reached it loses one more.
				if pass == 1 && c.count.Load() <= target {
					break
				}
				delete(s.m, k)
				c.count.Add(-1)
			}
			s.mu.Unlock()
		}
	}
}

// len returns the number of entries, for tests.
func (c *denyCache) len() int { return int(c.count.Load()) }
