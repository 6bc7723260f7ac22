package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/ratelimit"
)

// decision is one allowed rate-limit request: its cost and when the call
// was made and returned. The server decided somewhere in between.
type decision struct {
	call, ret  time.Time
	cost       int
	resetAfter time.Duration // fixed window: until the window's end
	// noWindow leaves the decision out of checkWindows: a Wait's call is
	// not when its last try was sent, so its window is not known.
	noWindow bool
}

// limitLog keeps the allowed requests of every limiter key.
type limitLog struct {
	mu      sync.Mutex
	allowed map[string][]decision // by limiter name + key
	limits  map[string]limiterSpec
}

type limiterSpec struct {
	algo  ratelimit.Algorithm
	limit ratelimit.Limit
}

func newLimitLog() *limitLog {
	return &limitLog{allowed: map[string][]decision{}, limits: map[string]limiterSpec{}}
}

func (l *limitLog) add(name string, d decision) {
	l.mu.Lock()
	l.allowed[name] = append(l.allowed[name], d)
	l.mu.Unlock()
}

// bound is the most cost an algorithm may allow in any span of one Period,
// as the README states it: fixed window 2×Rate (a span meets at most two
// windows), sliding window 2×Rate−1, GCRA Burst plus one Period's refill.
func (s limiterSpec) bound() int {
	switch s.algo {
	case ratelimit.FixedWindow:
		return 2 * s.limit.Rate
	case ratelimit.SlidingWindow:
		return 2*s.limit.Rate - 1
	}
	burst := s.limit.Burst
	if burst == 0 {
		burst = s.limit.Rate
	}
	return burst + s.limit.Rate
}

// check finds, for every key, a span of one Period holding more allowed
// cost than the bound. Only requests certainly decided inside the span
// count: called at or after its start and returned before its end. Keys an
// operator wiped (excused reports it) are skipped for spans that include
// the wipe.
func (l *limitLog) check(h *history) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, ds := range l.allowed {
		spec := l.limits[limiterOf(name)]
		slices.SortFunc(ds, func(a, b decision) int { return a.call.Compare(b.call) })
		bound := spec.bound()
		for i := range ds {
			from, to := ds[i].call, ds[i].call.Add(spec.limit.Period)
			sum := 0
			for _, d := range ds[i:] {
				if d.call.After(to) {
					break
				}
				if !d.ret.After(to) {
					sum += d.cost
				}
			}
			if sum > bound && !h.wiped(from, to) {
				h.violation("rate limit %s: %d allowed within %v from %s, bound %d (%v, %v)",
					name, sum, spec.limit.Period, h.since(from), bound, algoName(spec.algo), spec.limit)
				break
			}
		}
	}
}

// checkWindows checks the per-window bounds: a fixed window (it starts
// with its first request and ends Period later, which each answer's
// ResetAfter tells) and an aligned sliding window (Period-aligned on the
// server's clock, this machine's wall clock) each allow at most Rate.
// Decisions are placed by their call and return; a sliding-window
// decision whose call and return fall in two windows is left out.
func (l *limitLog) checkWindows(h *history) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, ds := range l.allowed {
		spec := l.limits[limiterOf(name)]
		p := spec.limit.Period
		sum := map[int64]int{}
		when := map[int64]time.Time{}
		ds = slices.DeleteFunc(slices.Clone(ds), func(d decision) bool { return d.noWindow })
		switch {
		case strings.HasSuffix(name, "/http"):
			continue // served requests: their window is not known
		case spec.algo == ratelimit.FixedWindow:
			// Answers of one window name one end, each up to its round
			// trip off; windows' ends lie at least a Period apart.
			type end struct {
				at   time.Time
				cost int
				from time.Time
			}
			var es []end
			for _, d := range ds {
				mid := d.call.Add(d.ret.Sub(d.call) / 2)
				es = append(es, end{mid.Add(d.resetAfter), d.cost, d.call})
			}
			slices.SortFunc(es, func(a, b end) int { return a.at.Compare(b.at) })
			var k int64
			for i, e := range es {
				if i > 0 && e.at.Sub(es[i-1].at) > p/2 {
					k++
				}
				sum[k] += e.cost
				if _, ok := when[k]; !ok {
					when[k] = e.from
				}
			}
		case spec.algo == ratelimit.SlidingWindow:
			for _, d := range ds {
				k := d.call.UnixMicro() / p.Microseconds()
				if d.ret.UnixMicro()/p.Microseconds() != k {
					continue
				}
				sum[k] += d.cost
				if _, ok := when[k]; !ok {
					when[k] = d.call
				}
			}
		default:
			continue
		}
		for k, n := range sum {
			if n > spec.limit.Rate && !h.wiped(when[k].Add(-p), when[k].Add(2*p)) {
				h.violation("rate limit %s: %d allowed in one window from about %s, limit %d (%v, %v)",
					name, n, h.since(when[k]), spec.limit.Rate, algoName(spec.algo), spec.limit)
				break
			}
		}
	}
}

// wiped reports whether an operator action or a restart may have reset
// counters between from and to.
func (h *history) wiped(from, to time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, o := range h.ops {
		if (o.res == "" || strings.HasPrefix(o.res, "limit")) && o.since(from) && !o.at.After(to) {
			return true
		}
	}
	return false
}

func limiterOf(name string) string {
	for i := range name {
		if name[i] == '/' {
			return name[:i]
		}
	}
	return name
}

func algoName(a ratelimit.Algorithm) string {
	switch a {
	case ratelimit.FixedWindow:
		return "fixed"
	case ratelimit.SlidingWindow:
		return "sliding"
	case ratelimit.GCRA:
		return "gcra"
	}
	return fmt.Sprint(int(a))
}

// Policy names of the workload's Policies set (newPolicies).
const (
	policyGCRA  = "pgcra"
	policyFixed = "pfixed"
)

// newPolicies builds the Policies set of the workload: a GCRA and a fixed
// window policy, the second tighter, so that either may deny; each keeps
// a log of its own in lim, checked against its algorithm's bound.
func (w *world) newPolicies(t testing.TB) *ratelimit.Policies {
	period := w.cfg.Lease / 2
	specs := map[string]limiterSpec{
		policyGCRA:  {ratelimit.GCRA, ratelimit.Limit{Rate: 10, Period: period, Burst: 4}},
		policyFixed: {ratelimit.FixedWindow, ratelimit.Limit{Rate: 6, Period: period}},
	}
	var ps []ratelimit.Policy
	for _, name := range []string{policyGCRA, policyFixed} {
		ps = append(ps, ratelimit.Policy{Name: name, Algorithm: specs[name].algo, Limit: specs[name].limit})
		w.lim.limits[name] = specs[name]
	}
	p, err := ratelimit.NewPolicies(ps...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// policiesOp asks for a request of cost 1 or 2 under the workload's
// Policies, with AllowPolicies or (a third of the time) WaitPolicies; an
// allowed request counts in every policy's log.
func (w *world) policiesOp(ctx context.Context, l *ratelimit.Limiter, key string, rng *rand.Rand) {
	cost := 1 + rng.IntN(2)
	wait := rng.IntN(3) == 0
	actx, cancel := context.WithTimeout(ctx, w.cfg.Lease/4)
	defer cancel()
	call := time.Now()
	var d ratelimit.Decision
	var err error
	if wait {
		w.count("limit.waitpolicies")
		d, err = l.WaitPolicies(actx, key, cost, w.policies)
	} else {
		w.count("limit.allowpolicies")
		d, err = l.AllowPolicies(actx, key, cost, w.policies)
	}
	ret := time.Now()
	if err != nil {
		w.expected("Limiter.AllowPolicies", call, err, ratelimit.ErrNotAllowed)
		return
	}
	if !d.Allowed {
		return
	}
	for i, name := range []string{policyGCRA, policyFixed} {
		w.lim.add(name+"/"+key, decision{call: call, ret: ret, cost: cost, resetAfter: d.Results[i].ResetAfter, noWindow: wait})
	}
}

// waitOp waits for a request of cost 1 or 2 on limiter l.
func (w *world) waitOp(ctx context.Context, l *ratelimit.Limiter, key string, rng *rand.Rand) {
	cost := 1 + rng.IntN(2)
	w.count("limit.wait")
	actx, cancel := context.WithTimeout(ctx, w.cfg.Lease/4)
	defer cancel()
	call := time.Now()
	res, err := l.Wait(actx, key, cost)
	ret := time.Now()
	if err != nil {
		w.expected("Limiter.Wait", call, err, ratelimit.ErrNotAllowed)
		return
	}
	if res.Allowed {
		w.lim.add(algoName(l.Algorithm())+"/"+key, decision{call: call, ret: ret, cost: cost, noWindow: true})
	}
}

// probePolicies checks, with the workload over, that a request a Policies
// set denies is counted in none of its policies: for a loose policy of
// each algorithm ahead of a tight fixed window, two requests are allowed,
// the third is denied by the tight one, and the loose one must not have
// less room after the denial than after the second request.
func (w *world) probePolicies() {
	l, err := ratelimit.New(w.admin.sc, ratelimit.Options{Limit: ratelimit.PerMinute(1), Prefix: "sluice:rl:probe:", DisableDenyCache: true})
	if err != nil {
		w.hist.violation("policies probe: %v", err)
		return
	}
	long := 10 * w.cfg.Lease
	tight := ratelimit.Policy{Name: "tight", Algorithm: ratelimit.FixedWindow, Limit: ratelimit.Limit{Rate: 2, Period: long}}
	for _, algo := range []ratelimit.Algorithm{ratelimit.FixedWindow, ratelimit.SlidingWindow, ratelimit.GCRA} {
		loose := ratelimit.Policy{Name: "loose", Algorithm: algo, Limit: ratelimit.Limit{Rate: 5, Period: long, Burst: 5}}
		if err := w.probePolicy(l, "probe."+algoName(algo), loose, tight); err != nil {
			w.hist.violation("policies probe, loose %s ahead of a tight fixed window: %v", algoName(algo), err)
		}
	}
}

func (w *world) probePolicy(l *ratelimit.Limiter, key string, loose, tight ratelimit.Policy) error {
	ps, err := ratelimit.NewPolicies(loose, tight)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*w.cfg.Lease)
	defer cancel()
	var room int
	for i := range 3 {
		d, err := l.AllowPolicies(ctx, key, 1, ps)
		switch {
		case err != nil:
			return err
		case d.Allowed != (i < 2):
			return fmt.Errorf("request %d: allowed %v", i+1, d.Allowed)
		case i == 1:
			room = d.Results[0].Remaining
		}
	}
	d, err := l.AllowPolicies(ctx, key, 0, ps)
	if err != nil {
		return err
	}
	if got := d.Results[0].Remaining; got < room {
		return fmt.Errorf("the loose policy had %d left after the second request and %d after the denied third: the denial was counted", room, got)
	}
	return l.Reset(ctx, key, ps)
}
