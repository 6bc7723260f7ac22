package chaos

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicekit/sluice/ratelimit"
)

// decision is one allowed rate-limit request: its cost and when the call
// was made and returned. The server decided somewhere in between.
type decision struct {
	call, ret  time.Time
	cost       int
	resetAfter time.Duration // fixed window: until the window's end
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
