package ratelimit

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/scriptcache"
)

// MaxPolicies is the most policies one Policies may hold.
const MaxPolicies = 8

// Policy is one named limit of a Policies set, such as "10 per second" or
// "1000 per hour".
type Policy struct {
	// Name names the policy in the RateLimit-Policy and RateLimit header
	// fields and in problem details. Required: 1 to 64 letters, digits,
	// '-', '_' or '.', unique within its Policies.
	Name string
	// Algorithm selects the counting method. Default GCRA.
	Algorithm Algorithm
	// Limit is the rate. Required; the same rules as Options.Limit.
	Limit Limit
}

// Policies is a set of 1 to MaxPolicies policies that Limiter.AllowPolicies
// checks together, in one script call: a request is counted in every
// policy only when every policy has room for it. Build one per plan or
// tenant limit with NewPolicies and pass it with each call; Limiters need
// not be created per limit. A Policies is immutable and safe for
// concurrent use.
//
// The state of all policies of a set for one key is one Redis value, read
// and written once per call, under a key derived from the set's policies
// and limits: sets that differ in any policy, limit or order count apart,
// so a tenant moved to another plan starts afresh in it.
type Policies struct {
	list     []Policy
	id       string   // deny cache id: the canonical text of the set
	suffix   string   // key suffix of the set's state
	args1    []string // script arguments for cost 1: two per policy, no cost
	capacity []int    // per policy
	minCap   int      // the largest cost any call can be allowed
	fixed    []bool   // per policy: a fixed window
	local    []localPolicy
	header   string   // RateLimit-Policy value
	quoted   []string // quoted names
	names    string   // the names, comma-separated: Event.Name of its decisions
}

// NewPolicies validates ps and returns them as a set. It returns an error
// wrapping ErrInvalidOptions for a missing, invalid or repeated name or a
// number of policies outside 1 to MaxPolicies, and ErrInvalidLimit or
// ErrInvalidAlgorithm for a bad Limit or Algorithm.
func NewPolicies(ps ...Policy) (*Policies, error) {
	if len(ps) < 1 || len(ps) > MaxPolicies {
		return nil, fmt.Errorf("%w: %d policies; want 1 to %d", ErrInvalidOptions, len(ps), MaxPolicies)
	}
	p := &Policies{list: append([]Policy(nil), ps...), minCap: maxRate}
	var id strings.Builder
	seen := make(map[string]bool, len(ps))
	for i, pol := range ps {
		if !validPolicyName(pol.Name) {
			return nil, fmt.Errorf("%w: policy %d: name %q is not 1 to 64 letters, digits, '-', '_' or '.'", ErrInvalidOptions, i, pol.Name)
		}
		if seen[pol.Name] {
			return nil, fmt.Errorf("%w: policy name %q repeated", ErrInvalidOptions, pol.Name)
		}
		seen[pol.Name] = true
		c, err := compile(pol.Algorithm, pol.Limit)
		if err != nil {
			return nil, fmt.Errorf("%w (policy %q)", err, pol.Name)
		}
		// ratelimit_multi tells the algorithm by the signs: GCRA's two
		// numbers are positive, a window's limit negative, a sliding
		// window's length too.
		switch pol.Algorithm {
		case FixedWindow:
			p.args1 = append(p.args1, "-"+c.arg0, c.arg1)
		case SlidingWindow:
			p.args1 = append(p.args1, "-"+c.arg0, "-"+c.arg1)
		default:
			p.args1 = append(p.args1, c.arg0, c.arg1)
		}
		p.capacity = append(p.capacity, c.capacity)
		p.minCap = min(p.minCap, c.capacity)
		p.fixed = append(p.fixed, pol.Algorithm == FixedWindow)
		p.local = append(p.local, localPolicyOf(pol.Limit, c.capacity))
		// The quota is what may be sent at once; the window is the time
		// to earn it back.
		window := time.Duration(float64(pol.Limit.Period) * float64(c.capacity) / float64(pol.Limit.Rate))
		quoted := `"` + pol.Name + `"` // names need no escaping
		p.quoted = append(p.quoted, quoted)
		if i > 0 {
			p.header += ", "
		}
		p.header += quoted + ";q=" + strconv.Itoa(c.capacity) + ";w=" + strconv.FormatInt(max(ceilSeconds(window), 1), 10)
		// Names hold no ';' or ',', so the text is unambiguous. The state
		// key is derived from it: it must not change between versions
		// that share the state's format, so that they count together.
		fmt.Fprintf(&id, "%s;%s;%s;%s,", pol.Name, c.code, c.arg0, c.idArg1)
	}
	p.id = id.String()
	for i, pol := range ps {
		if i > 0 {
			p.names += ","
		}
		p.names += pol.Name
	}
	// The state key names the whole set with its limits, so sets with
	// different policies or limits never read each other's state.
	h := fnv.New64a()
	h.Write([]byte(p.id))
	p.suffix = ":m:" + strconv.FormatUint(h.Sum64(), 36)
	return p, nil
}

func validPolicyName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// List returns the policies, in the order of Decision.Results.
func (p *Policies) List() []Policy { return append([]Policy(nil), p.list...) }

// Decision is the answer to one AllowPolicies call.
//
// Worked example, policies "second" (GCRA, 2 per second) and "hour"
// (FixedWindow, 100 per hour) on a fresh key: the first two calls are
// allowed with Results[0].Remaining 1 then 0 and Results[1].Remaining 99
// then 98. A third call in the same instant is denied: Results[0] has no
// room (RetryAfter 500ms), Results[1] has room and still says 98, since a
// denied request is counted nowhere; Decision.RetryAfter is 500ms.
type Decision struct {
	// Allowed reports whether every policy had room; only then was the
	// request counted, in all of them.
	Allowed bool
	// RetryAfter is how long to wait before the same request could be
	// allowed: the longest RetryAfter of the policies without room. 0
	// when Allowed.
	RetryAfter time.Duration
	// Results holds each policy's state, in the order of the Policies.
	// A Result's Allowed says whether that policy had room. When the
	// request was allowed, Remaining and ResetAfter are after it; when it
	// was denied, they are the policy's state without it.
	Results []Result
}

// AllowPolicies reports whether a request of cost n for key may proceed
// under every policy of ps, and counts it in all of them if so, atomically:
// one script call, on the server's clock. A denied request is not counted
// anywhere. n == 0 only reads the state.
//
// The Limiter provides the Redis connection, the Prefix and the deny cache;
// its own Limit plays no part. The deny cache holds denials per key and per
// set of limits, so a denial under one plan never answers for another. The
// state of all the set's policies is one Redis key (see Policies).
//
// Errors: ErrInvalidKey, ErrInvalidCost, ErrInvalidOptions for a nil ps,
// ErrCostTooHigh when n exceeds the capacity of some policy (no wait would
// let it pass; no round trip is made), or the Redis error (wrapped).
func (l *Limiter) AllowPolicies(ctx context.Context, key string, n int, ps *Policies) (Decision, error) {
	if err := keyspace.CheckName(key); err != nil {
		return Decision{}, fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	switch {
	case ps == nil:
		return Decision{}, fmt.Errorf("%w: nil *Policies", ErrInvalidOptions)
	case n < 0:
		return Decision{}, fmt.Errorf("%w: %d", ErrInvalidCost, n)
	case n > ps.minCap:
		return Decision{}, fmt.Errorf("%w: %d > %d", ErrCostTooHigh, n, ps.minCap)
	}
	start := l.now()
	var gen uint64
	if n > 0 && l.deny != nil {
		// The cache keeps each policy's figures for cost 1; a larger cost
		// asks Redis for its own (which policies have room for it, and
		// how long it waits).
		if n == 1 {
			if d, ok := l.cachedDecision(key, ps, start, n); ok {
				return d, nil // reported by cachedDecision
			}
		}
		gen = l.deny.generation(key)
	}
	keys := []string{keyspace.Key(l.prefix, key, ps.suffix)}
	// The cost goes last, and is left out when it is 1. The full slice
	// expression makes append copy: args1 is shared.
	args := ps.args1
	if n != 1 {
		args = append(args[:len(args):len(args)], strconv.Itoa(n))
	}
	reply, err := l.multi.Exec(ctx, keys, args).ToArray()
	if err != nil {
		return Decision{}, fmt.Errorf("ratelimit: %w", err)
	}
	// Allowed: remaining and reset per policy, 2n values; denied: {0,
	// then room, remaining, retry and reset per policy}, 1+4n values.
	np := len(ps.capacity)
	var v [1 + 4*MaxPolicies]int64 // on the stack
	m := reply.Len()
	if m != 2*np && m != 1+4*np {
		return Decision{}, fmt.Errorf("%w: %d values", ErrUnexpectedReply, m)
	}
	for i := range m {
		if v[i], err = reply.At(i).AsInt64(); err != nil {
			return Decision{}, fmt.Errorf("%w: %w", ErrUnexpectedReply, err)
		}
	}
	d := Decision{Allowed: m == 2*np, Results: make([]Result, np)}
	if !d.Allowed && v[0] != 0 {
		return Decision{}, fmt.Errorf("%w: %d values, allowed %d", ErrUnexpectedReply, m, v[0])
	}
	if d.Allowed {
		for i := range d.Results {
			d.Results[i] = Result{
				Allowed:    true,
				Limit:      ps.capacity[i],
				Remaining:  max(int(v[2*i]), 0),
				ResetAfter: time.Duration(v[1+2*i]) * time.Microsecond,
			}
		}
	} else {
		for i := range d.Results {
			w := v[1+4*i:]
			r := Result{
				Allowed:    w[0] == 1,
				Limit:      ps.capacity[i],
				Remaining:  max(int(w[1]), 0),
				RetryAfter: time.Duration(w[2]) * time.Microsecond,
				ResetAfter: time.Duration(w[3]) * time.Microsecond,
			}
			d.Results[i] = r
			if !r.Allowed {
				d.RetryAfter = max(d.RetryAfter, r.RetryAfter)
			}
		}
	}
	if l.afterReply != nil {
		l.afterReply(key, Result{Allowed: d.Allowed, RetryAfter: d.RetryAfter})
	}
	// A denial of cost 1 holds for every cost until its RetryAfter (the
	// policy that needs longest still has no room for 1); one of a larger
	// cost only if every policy without room is a full fixed window.
	if !d.Allowed && l.deny != nil && d.RetryAfter > 0 && (n == 1 || everyDenialCovers(ps, d)) {
		l.deny.put(ps.id, key, start, denyEntryOf(d, start), gen)
	}
	if l.obs != nil && n > 0 {
		l.observe(ps.names, d.Allowed, n, scriptcache.SourceRedis)
	}
	return d, nil
}

// everyDenialCovers reports whether every policy without room in d is a
// fixed window with nothing left, which stays full until it ends whatever
// the cost, so that d holds for every cost >= 1.
func everyDenialCovers(ps *Policies, d Decision) bool {
	for i, r := range d.Results {
		if !r.Allowed && !(ps.fixed[i] && r.Remaining == 0) {
			return false
		}
	}
	return true
}

func denyEntryOf(d Decision, start time.Time) *denyEntry {
	e := &denyEntry{until: start.Add(d.RetryAfter), policies: make([]denyPolicy, len(d.Results))}
	for i, r := range d.Results {
		p := denyPolicy{resetAt: start.Add(r.ResetAfter), remaining: r.Remaining}
		if !r.Allowed {
			p.until = start.Add(r.RetryAfter)
		}
		e.policies[i] = p
		if e.resetAt.Before(p.resetAt) {
			e.resetAt = p.resetAt
		}
	}
	return e
}

// cachedDecision returns the deny cache's answer for a request of cost 1
// for key under ps at now, if it has one, and reports it as a decision of
// cost n (1). Policies that had room report what Redis last said of them:
// their figures are for cost 1, which is why a larger cost asks Redis.
func (l *Limiter) cachedDecision(key string, ps *Policies, now time.Time, n int) (Decision, bool) {
	if l.deny == nil {
		return Decision{}, false
	}
	e := l.deny.entry(ps.id, key, now)
	if e == nil || len(e.policies) != len(ps.capacity) {
		return Decision{}, false
	}
	d := Decision{RetryAfter: e.until.Sub(now), Results: make([]Result, len(e.policies))}
	for i, p := range e.policies {
		r := Result{Allowed: true, Limit: ps.capacity[i], Remaining: p.remaining, ResetAfter: max(p.resetAt.Sub(now), 0)}
		if !p.until.IsZero() && now.Before(p.until) {
			r.Allowed, r.Remaining, r.RetryAfter = false, 0, p.until.Sub(now)
			r.ResetAfter = max(r.ResetAfter, r.RetryAfter)
		}
		d.Results[i] = r
	}
	if l.obs != nil {
		l.observe(ps.names, false, n, scriptcache.SourceDenyCache)
	}
	return d, true
}
