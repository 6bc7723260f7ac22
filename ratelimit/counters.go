package ratelimit

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/scriptcache"
)

// MaxCounters is the most counters one AllowCounters or CheckCounters call
// decides.
const MaxCounters = 16

// Counter is one limit of a decision over several counters
// (Limiter.AllowCounters), counted under a key of its own.
//
// A Policies set keeps every policy of one key in one value; counters keep
// one value each, so that one counter is shared by calls whose other
// counters differ: a request of user alice in organisation acme is counted
// in counters "user:alice" and "org:acme", and one of bob in acme in
// "user:bob" and the same "org:acme". A request is counted in every
// counter only when every counter that is not Shadow has room for it, so a
// request refused by alice's limit costs acme nothing.
type Counter struct {
	// Key names the counter within the call's group: 1 to 1024 bytes,
	// any bytes. The state lives under the group, the algorithm, the
	// window length (for the window algorithms) and Key, so a counter
	// whose Rate changes keeps its count, and one whose algorithm or
	// window changes starts afresh.
	Key string
	// Policy is the counter's limit and algorithm (the rules of Policy
	// in a Policies set). Name is optional here; when set it must follow
	// those rules, and the names of a call, comma-separated, are the
	// Event.Name of its decisions.
	Policy Policy
	// Aligned, with FixedWindow only, starts windows at whole multiples
	// of Policy.Limit.Period since the Unix epoch (a minute's window at
	// every whole minute, a day's at midnight UTC), as envoyproxy/ratelimit
	// counts, instead of at a window's first request. Every key's window
	// then ends at the same instant.
	Aligned bool
	// Cost is how many requests the call counts in this counter. 0 means
	// 1; a cost above the counter's capacity (Rate, or Burst for GCRA) is
	// ErrCostTooHigh for a counter that is not Shadow.
	Cost int
	// Peek reads the counter without counting anything in it: it always
	// has room. Cost is then ignored.
	Peek bool
	// Shadow decides and reports the counter but never lets it deny the
	// call: its Result says whether it had room, and it counts an allowed
	// call only when it had. Soft-launching a limit is its use.
	Shadow bool
}

// counterSet is a validated AllowCounters call: its keys, script arguments
// and what decoding its reply needs.
type counterSet struct {
	keys     []string
	args     []string
	capacity []int
	cost     []int // 0 for a peek
	enforced []bool
	fixed    []bool // a fixed window, aligned or not
	local    []localPolicy
	names    string
	digest   string // names the set's group, keys and limits in the deny cache
	group    string
	ckeys    []string // the counters' keys, as given
}

// countersID is the deny cache id of every counter set: their entries
// are told apart by their digest, which is their key.
const countersID = "\x00counters"

// prepareCounters validates a call and builds its keys and arguments.
func (l *Limiter) prepareCounters(group string, cs []Counter) (*counterSet, error) {
	if err := keyspace.CheckName(group); err != nil {
		return nil, fmt.Errorf("%w: group: %w", ErrInvalidKey, err)
	}
	if len(cs) < 1 || len(cs) > MaxCounters {
		return nil, fmt.Errorf("%w: %d counters; want 1 to %d", ErrInvalidOptions, len(cs), MaxCounters)
	}
	n := len(cs)
	p := &counterSet{
		keys: make([]string, n), args: make([]string, 0, 3*n), capacity: make([]int, n),
		cost: make([]int, n), enforced: make([]bool, n), fixed: make([]bool, n),
		local: make([]localPolicy, n), group: group, ckeys: make([]string, n),
	}
	tag := counterTag(group)
	h := sha256.New()
	var lenbuf [8]byte
	writeField := func(s string) {
		binary.BigEndian.PutUint64(lenbuf[:], uint64(len(s)))
		h.Write(lenbuf[:])
		h.Write([]byte(s))
	}
	writeField(group)
	var names strings.Builder
	for i, c := range cs {
		if err := keyspace.CheckName(c.Key); err != nil {
			return nil, fmt.Errorf("%w: counter %d: %w", ErrInvalidKey, i, err)
		}
		if c.Policy.Name != "" {
			if !validPolicyName(c.Policy.Name) {
				return nil, fmt.Errorf("%w: counter %d: name %q is not 1 to 64 letters, digits, '-', '_' or '.'", ErrInvalidOptions, i, c.Policy.Name)
			}
			if names.Len() > 0 {
				names.WriteByte(',')
			}
			names.WriteString(c.Policy.Name)
		}
		if c.Aligned && c.Policy.Algorithm != FixedWindow {
			return nil, fmt.Errorf("%w: counter %d: Aligned needs FixedWindow, not %v", ErrInvalidOptions, i, c.Policy.Algorithm)
		}
		comp, err := compile(c.Policy.Algorithm, c.Policy.Limit)
		if err != nil {
			return nil, fmt.Errorf("%w (counter %d)", err, i)
		}
		cost := c.Cost
		switch {
		case c.Peek:
			cost = 0
		case cost < 0:
			return nil, fmt.Errorf("%w: counter %d: %d", ErrInvalidCost, i, cost)
		case cost == 0:
			cost = 1
		}
		if cost > comp.capacity && !c.Shadow {
			return nil, fmt.Errorf("%w: counter %d: %d > %d", ErrCostTooHigh, i, cost, comp.capacity)
		}
		// The code and window name the state's format; the rate does not,
		// so that a counter keeps its count when only its rate changes.
		code, a, b := "g", comp.arg0, comp.arg1
		switch {
		case c.Aligned:
			code, a, b = "a"+comp.arg1, comp.arg0, "-"+comp.arg1
		case c.Policy.Algorithm == FixedWindow:
			code, a = "f"+comp.arg1, "-"+comp.arg0
		case c.Policy.Algorithm == SlidingWindow:
			code, a, b = "s"+comp.arg1, "-"+comp.arg0, "-"+comp.arg1
		}
		p.keys[i] = counterKey(l.prefix, tag, code, c.Key)
		for j := range i {
			if p.keys[j] == p.keys[i] {
				return nil, fmt.Errorf("%w: counters %d and %d share key %q and algorithm", ErrInvalidOptions, j, i, c.Key)
			}
		}
		costArg := strconv.Itoa(cost)
		if c.Shadow {
			costArg = strconv.Itoa(-1 - cost)
		}
		p.args = append(p.args, a, b, costArg)
		p.capacity[i] = comp.capacity
		p.cost[i] = cost
		p.enforced[i] = !c.Shadow
		p.fixed[i] = c.Policy.Algorithm == FixedWindow
		p.local[i] = localPolicyOf(c.Policy.Limit, comp.capacity)
		p.ckeys[i] = c.Key
		writeField(p.keys[i])
		writeField(comp.arg0 + ";" + comp.arg1 + ";" + strconv.FormatBool(c.Shadow))
	}
	p.names = names.String()
	p.digest = string(h.Sum(nil))
	return p, nil
}

// counterTag returns the hash tag of group's counters: the group itself,
// or, when it holds a brace or starts with '~', '~' and its digest, so that
// the tag ends at the closing brace counterKey writes and no two groups
// share a key.
func counterTag(group string) string {
	if !strings.ContainsAny(group, "{}") && !strings.HasPrefix(group, "~") {
		return group
	}
	sum := sha256.Sum256([]byte(group))
	return "~" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// counterKey is PREFIX{TAG}:cCODE:KEY#. The tag holds no brace, so the
// key's slot is the tag's; CODE is a letter and digits, so what follows
// its ':' is the counter's key; the final '#' ends no key of a Limiter's
// own Limit or of a Policies set (they end in a letter or digit), so none
// of those can equal a counter's key.
func counterKey(prefix, tag, code, key string) string {
	var b strings.Builder
	b.Grow(len(prefix) + len(tag) + len(code) + len(key) + 6)
	b.WriteString(prefix)
	b.WriteByte('{')
	b.WriteString(tag)
	b.WriteString("}:c")
	b.WriteString(code)
	b.WriteByte(':')
	b.WriteString(key)
	b.WriteByte('#')
	return b.String()
}

// AllowCounters reports whether a request may proceed under every counter
// of cs that is not Shadow, and counts it if so, atomically: one script
// call, on the server's clock. A denied request is counted in no counter.
// A Shadow counter never denies; an allowed request is counted in it only
// if it had room. Decision.Results holds each counter's state in the order
// of cs (see Decision; a Shadow counter's Result may say no room in an
// allowed Decision).
//
// group names what the counters belong to (a tenant, an Envoy domain):
// every counter of one call is stored under group's hash tag, so that a
// call touches one cluster slot, and a counter is shared by the calls that
// name it with the same group. Counters of one group all live on one
// cluster shard, which carries their whole load: choose groups no wider
// than the counters a call must decide together.
//
// The Limiter provides the Redis connection, the Prefix and the deny
// cache; its own Limit plays no part. The deny cache holds a denial per
// set of counters (group, keys and limits), for the counters whose denial
// holds for every cost (a cost of 1, or a full fixed window); a later call
// with the same set is denied locally while one of those counters, asked
// for a cost of 1 or more, stays denied.
//
// Errors: ErrInvalidKey for a group or Key that is empty or over 1024
// bytes, ErrInvalidCost, ErrCostTooHigh (no round trip is made),
// ErrInvalidOptions for a number of counters outside 1 to MaxCounters, a
// bad Name, Aligned without FixedWindow or two counters with one key and
// algorithm, ErrInvalidLimit or ErrInvalidAlgorithm for a bad Policy, or
// the Redis error (wrapped).
func (l *Limiter) AllowCounters(ctx context.Context, group string, cs []Counter) (Decision, error) {
	p, err := l.prepareCounters(group, cs)
	if err != nil {
		return Decision{}, err
	}
	start := l.now()
	if d, ok := l.cachedCounters(p, start); ok {
		return d, nil
	}
	return l.allowCounters(ctx, p, start)
}

// allowCounters sends p's script call; start is the local time taken
// before it, from which a denial's local deadline is counted.
func (l *Limiter) allowCounters(ctx context.Context, p *counterSet, start time.Time) (Decision, error) {
	var gen uint64
	if l.deny != nil {
		gen = l.deny.generation(p.digest)
	}
	reply, err := l.counters.Exec(ctx, p.keys, p.args).ToArray()
	if err != nil {
		return Decision{}, fmt.Errorf("ratelimit: %w", err)
	}
	n := len(p.keys)
	if reply.Len() != 1+4*n {
		return Decision{}, fmt.Errorf("%w: %d values", ErrUnexpectedReply, reply.Len())
	}
	v := make([]int64, reply.Len())
	for i := range v {
		if v[i], err = reply.At(i).AsInt64(); err != nil {
			return Decision{}, fmt.Errorf("%w: %w", ErrUnexpectedReply, err)
		}
	}
	d := Decision{Allowed: v[0] == 1, Results: make([]Result, n)}
	cacheable := false
	for i := range d.Results {
		w := v[1+4*i:]
		r := Result{
			Allowed:    w[0] == 1,
			Limit:      p.capacity[i],
			Remaining:  max(int(w[1]), 0),
			RetryAfter: time.Duration(w[2]) * time.Microsecond,
			ResetAfter: time.Duration(w[3]) * time.Microsecond,
		}
		d.Results[i] = r
		if !r.Allowed && p.enforced[i] {
			d.RetryAfter = max(d.RetryAfter, r.RetryAfter)
			cacheable = cacheable || p.denialCovers(i, r)
		}
	}
	if !d.Allowed && l.deny != nil && cacheable {
		l.deny.put(countersID, p.digest, start, countersEntry(p, d, start), gen)
	}
	if l.obs != nil {
		l.observe(p.names, d.Allowed, p.weight(), scriptcache.SourceRedis)
	}
	return d, nil
}

// denialCovers reports whether r, a denial of counter i, holds for every
// cost >= 1 until its RetryAfter: a denial of cost 1 does (a larger cost
// needs longer), and so does a fixed window with nothing left, which stays
// full until it ends whatever the cost.
func (p *counterSet) denialCovers(i int, r Result) bool {
	return r.RetryAfter > 0 && (p.cost[i] == 1 || p.fixed[i] && r.Remaining == 0)
}

// weight is the Event.Weight of a decision over p: its largest cost.
func (p *counterSet) weight() int { return slices.Max(p.cost) }

// countersEntry is the deny cache entry of d, a denial of p: a deadline
// for each enforced counter whose denial holds for every cost, and what
// the others last said.
func countersEntry(p *counterSet, d Decision, start time.Time) *denyEntry {
	e := &denyEntry{policies: make([]denyPolicy, len(d.Results))}
	for i, r := range d.Results {
		dp := denyPolicy{resetAt: start.Add(r.ResetAfter), remaining: r.Remaining}
		if !r.Allowed && p.enforced[i] && p.denialCovers(i, r) {
			dp.until = start.Add(r.RetryAfter)
			if e.until.Before(dp.until) {
				e.until = dp.until
			}
		}
		e.policies[i] = dp
		if e.resetAt.Before(dp.resetAt) {
			e.resetAt = dp.resetAt
		}
	}
	return e
}

// cachedCounters returns the deny cache's answer for p at now, if it has
// one: a denial while some enforced counter that the cache holds denied
// is asked for a cost of 1 or more.
func (l *Limiter) cachedCounters(p *counterSet, now time.Time) (Decision, bool) {
	if l.deny == nil {
		return Decision{}, false
	}
	e := l.deny.entry(countersID, p.digest, now)
	if e == nil || len(e.policies) != len(p.keys) {
		return Decision{}, false
	}
	d := Decision{Results: make([]Result, len(e.policies))}
	denied := false
	for i, dp := range e.policies {
		r := Result{Allowed: true, Limit: p.capacity[i], Remaining: dp.remaining, ResetAfter: max(dp.resetAt.Sub(now), 0)}
		if !dp.until.IsZero() && now.Before(dp.until) && p.cost[i] > 0 {
			r.Allowed, r.Remaining, r.RetryAfter = false, 0, dp.until.Sub(now)
			r.ResetAfter = max(r.ResetAfter, r.RetryAfter)
			d.RetryAfter = max(d.RetryAfter, r.RetryAfter)
			denied = true
		}
		d.Results[i] = r
	}
	if !denied {
		return Decision{}, false
	}
	if l.obs != nil {
		l.observe(p.names, false, p.weight(), scriptcache.SourceDenyCache)
	}
	return d, true
}

// CheckCounters is Check for a decision over several counters
// (Limiter.AllowCounters): answered by the deny cache, by Redis under a
// context that the caller's cancellation does not end, or, while Redis is
// unavailable and with FallbackLocal, by the local limiter, which keeps a
// bucket per counter (group and key), shared by the calls that name it, and
// counts a call in each only when every enforced one allows it. Group and
// keys over 1024 bytes, or starting with "~#", are counted under "~#" and
// their SHA-256, as Check does.
//
// Errors are those of AllowCounters, in the two classes Check describes:
// an outage is answered locally with FallbackLocal, or returned; any other
// error is reported to the observer and returned, and the caller must
// refuse the request.
func (c *Checker) CheckCounters(ctx context.Context, group string, cs []Counter) (Decision, error) {
	m := &c.c
	bounded := cs
	for i := range cs {
		if k := boundKey(cs[i].Key, maxKeyLen); k != cs[i].Key {
			if &bounded[0] == &cs[0] {
				bounded = slices.Clone(cs)
			}
			bounded[i].Key = k
		}
	}
	p, err := m.l.prepareCounters(boundKey(group, maxKeyLen), bounded)
	if err != nil {
		m.l.fallback(p.namesOrEmpty(), scriptcache.SourceFailClosed, err)
		return Decision{}, err
	}
	now := m.l.now()
	if d, ok := m.l.cachedCounters(p, now); ok {
		return d, nil
	}
	var probe int64
	if m.local != nil {
		if until := m.localUntil.Load(); until != 0 {
			probe = now.Add(m.hold).UnixNano()
			if now.UnixNano() < until || !m.localUntil.CompareAndSwap(until, probe) {
				return m.countersLocally(p, now), nil
			}
		}
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.timeout)
	d, err := m.l.allowCounters(rctx, p, now)
	cancel()
	if err == nil && probe != 0 {
		m.localUntil.CompareAndSwap(probe, 0)
	}
	if err != nil && !Unavailable(err) {
		m.l.fallback(p.names, scriptcache.SourceFailClosed, err)
		return d, err
	}
	if err != nil && m.local != nil {
		c.onLocal(ctx, err)
		now = m.l.now()
		m.localUntil.Store(now.Add(m.hold).UnixNano())
		m.l.fallback(p.names, scriptcache.SourceLocal, err)
		return m.countersLocally(p, now), nil
	}
	return d, err
}

// namesOrEmpty is p.names, or "" for a nil p.
func (p *counterSet) namesOrEmpty() string {
	if p == nil {
		return ""
	}
	return p.names
}

// countersLocally is the FallbackLocal decision over p at now.
func (m *checker) countersLocally(p *counterSet, now time.Time) Decision {
	keys := make([]string, len(p.keys))
	for i, k := range p.keys {
		// The Redis key names the group, algorithm, window and counter;
		// the limit's own figures keep two limits on one key apart.
		keys[i] = "c:" + strconv.FormatFloat(p.local[i].interval, 'g', -1, 64) + ":" + strconv.Itoa(p.local[i].burst) + ":" + k
	}
	d := Decision{Results: make([]Result, len(keys))}
	d.Allowed = m.local.allowEach(keys, now, p.cost, p.enforced, p.local, d.Results)
	for i, r := range d.Results {
		if !r.Allowed && p.enforced[i] {
			d.RetryAfter = max(d.RetryAfter, r.RetryAfter)
		}
	}
	if m.l.obs != nil {
		m.l.observe(p.names, d.Allowed, p.weight(), scriptcache.SourceLocal)
	}
	return d
}

// allowEach decides a request against one bucket per key, each with its
// policy and cost, counting it in every bucket only when every enforced
// one allows it; a bucket that is not enforced counts an allowed request
// when it has room. It writes each bucket's state to res and reports
// whether the request is allowed. The shards of the keys are locked in
// ascending order, so that calls over overlapping keys cannot deadlock.
func (c *localLimiter) allowEach(keys []string, now time.Time, costs []int, enforced []bool, ps []localPolicy, res []Result) bool {
	t := now.Sub(c.base)
	idx := make([]int, len(keys))
	for i, k := range keys {
		idx[i] = int(maphash.String(c.seed, k) % localShards)
	}
	order := slices.Compact(slices.Sorted(slices.Values(idx)))
	for _, s := range order {
		c.shards[s].mu.Lock()
	}
	defer func() {
		for _, s := range order {
			c.shards[s].mu.Unlock()
		}
	}()
	entries := make([]*localEntry, len(keys))
	for i, k := range keys {
		s := &c.shards[idx[i]]
		e := s.m[k]
		switch {
		case e == nil:
			// Never evict a bucket this call already holds.
			if len(s.m) >= c.perShard && s.tail != nil && !slices.Contains(entries[:i], s.tail) {
				s.evict()
			}
			e = &localEntry{key: k, tat: []time.Duration{t}}
			s.m[k] = e
		case len(e.tat) != 1:
			s.unlink(e)
			e.tat = []time.Duration{t}
		default:
			s.unlink(e)
		}
		s.pushFront(e)
		entries[i] = e
	}
	allowed := true
	room := make([]bool, len(keys))
	for i, p := range ps {
		wait := max(entries[i].tat[0]-t, 0)
		ahead := float64(wait)
		after := ahead + float64(costs[i])*p.interval
		tolerance := float64(p.burst) * p.interval
		r := Result{Allowed: after <= tolerance, Limit: p.burst}
		room[i] = r.Allowed
		if r.Allowed {
			r.Remaining = tokens(tolerance-after, p.interval)
			r.ResetAfter = time.Duration(math.Ceil(after))
		} else {
			r.Remaining = tokens(tolerance-ahead, p.interval)
			r.RetryAfter = time.Duration(math.Ceil(after - tolerance))
			r.ResetAfter = wait
			if enforced[i] {
				allowed = false
			}
		}
		res[i] = r
	}
	for i, p := range ps {
		switch {
		case allowed && room[i]:
			e := entries[i]
			e.tat[0] = max(e.tat[0], t) + time.Duration(math.Ceil(float64(costs[i])*p.interval))
		case room[i]:
			// Not counted: report what the bucket has, not what it
			// would have had.
			wait := max(entries[i].tat[0]-t, 0)
			res[i].Remaining = tokens(float64(p.burst)*p.interval-float64(wait), p.interval)
			res[i].ResetAfter = wait
		}
	}
	return allowed
}
