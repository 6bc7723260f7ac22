package chaos

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/sluicekit/sluice/ratelimit"
)

// The exact model of the limiters: for a key that one goroutine alone
// uses, what each algorithm must allow and what it must refuse, and the
// figures of its answer, on the server's clock. The server runs on this
// machine, so its TIME is this machine's wall clock: a decision was made
// at some server time s in [call, return] of the call that got it. Every
// algorithm gives more room as time passes and less as requests are
// counted, so the model keeps two states, the least and the most loaded
// the key can be in, and judges a request at two corners: the most loaded
// state at the earliest time (if it has room there, the request must be
// allowed) and the least loaded at the latest (if it has none there, it
// must be refused). In between either answer is right; the answer itself
// (its count, its reset) then tells which way the state went, or the key
// is given up. A round trip of a millisecond decides almost every request
// exactly; a slowed network widens the interval, and the model falls back
// to what both corners agree on. The formulas are the algorithms' as the
// package documents them (and as lua/ratelimit_*.lua compute them).

// slackUS widens each decision's interval at its end (microseconds):
// Redis keeps key expiry in milliseconds, and the fixed window's end is
// set from them.
const slackUS = 2000

// earlyUS widens it at its start, by as much: Redis's TIME was never
// seen before the call that read it (48 goroutines on 6 connections,
// each script reading TIME and then writing 200 times: none of about a
// hundred thousand early).
const earlyUS = 2000

// durTolUS is the tolerance of a duration figure (microseconds): a
// PTTL is whole milliseconds.
const durTolUS = 1000

// lstate is one exact state of one limit for one key.
type lstate struct {
	tat   float64 // GCRA: µs since the Unix epoch at which the bucket is full; 0 fresh
	count int     // fixed window: the window's count, 0 fresh
	end   int64   // fixed window: the window's end, µs since the Unix epoch
	w     int64   // sliding window: index of the current window
	c, p  int     // sliding window: its count and the previous window's
}

func freshState() lstate { return lstate{w: math.MinInt64 / 2} }

// outcome is a limit's answer to a request: as Result has it, durations
// in microseconds.
type outcome struct {
	allowed      bool
	rem          int
	retry, reset int64
}

// algoModel is one limit of one key: its spec and the two states.
type algoModel struct {
	spec    limiterSpec
	lo, hi  lstate // least and most loaded
	unknown bool   // no longer known: judge nothing
	// floor is the earliest server time a decision can come at: Redis
	// decides one key's requests in order, so never before the last.
	floor int64
	// cacheSlack bounds how much earlier than Redis's figures a deny
	// cache answer may end: the round trip of the denial it keeps.
	cacheSlack int64
}

func newModel(spec limiterSpec) *algoModel {
	return &algoModel{spec: spec, lo: freshState(), hi: freshState()}
}

func (m *algoModel) capacity() int {
	if m.spec.algo == ratelimit.GCRA && m.spec.limit.Burst != 0 {
		return m.spec.limit.Burst
	}
	return m.spec.limit.Rate
}

func (m *algoModel) periodUS() int64 { return m.spec.limit.Period.Microseconds() }

// expired reports whether st's fixed window is over at s.
func (m *algoModel) expired(st lstate, s int64) bool { return st.count == 0 || s > st.end }

// eval is the answer of the algorithm in state st at server time s to a
// request of cost n.
func (m *algoModel) eval(st lstate, s int64, n int) outcome {
	rate, P := m.spec.limit.Rate, m.periodUS()
	switch m.spec.algo {
	case ratelimit.FixedWindow:
		c, left := st.count, st.end-s
		if m.expired(st, s) {
			c, left = 0, 0
		}
		switch {
		case n == 0:
			return outcome{allowed: true, rem: rate - c, reset: max(left, 0)}
		case c+n > rate:
			return outcome{rem: rate - c, retry: left, reset: left}
		case c == 0:
			return outcome{allowed: true, rem: rate - n, reset: P}
		}
		return outcome{allowed: true, rem: rate - c - n, reset: left}
	case ratelimit.SlidingWindow:
		idx := floorDiv(s, P)
		elapsed := s - idx*P
		cur, prev := 0, 0
		switch st.w {
		case idx:
			cur, prev = st.c, st.p
		case idx - 1:
			prev = st.c
		}
		fP, fe := float64(P), float64(elapsed)
		est := float64(prev)*(fP-fe)/fP + float64(cur)
		var reset int64
		if cur > 0 {
			reset = 2*P - elapsed
		} else if prev > 0 {
			reset = P - elapsed
		}
		if est+float64(n) > float64(rate) {
			var retry float64
			if cur+n <= rate {
				retry = fP - float64(rate-cur-n)*fP/float64(prev) - fe
			} else {
				retry = fP - fe + max(fP-float64(rate-n)*fP/float64(cur), 0)
			}
			return outcome{rem: max(int(math.Floor(float64(rate)-est)), 0), retry: max(int64(math.Ceil(retry)), 1), reset: reset}
		}
		if n > 0 {
			reset = 2*P - elapsed
		}
		return outcome{allowed: true, rem: max(int(math.Floor(float64(rate)-est-float64(n))), 0), reset: reset}
	}
	interval := float64(P) / float64(rate)
	tol := float64(m.capacity()) * interval
	ahead := max(st.tat-float64(s), 0)
	after := ahead + float64(n)*interval
	if after > tol {
		return outcome{rem: max(int(math.Floor((tol-ahead)/interval+1e-9)), 0), retry: int64(math.Ceil(after - tol)), reset: int64(math.Ceil(ahead))}
	}
	return outcome{allowed: true, rem: int(math.Floor((tol-after)/interval + 1e-9)), reset: int64(math.Ceil(after))}
}

// next is st after a request of cost n allowed at s.
func (m *algoModel) next(st lstate, s int64, n int) lstate {
	if n == 0 {
		return st
	}
	switch m.spec.algo {
	case ratelimit.FixedWindow:
		if m.expired(st, s) {
			return lstate{count: n, end: s + m.periodUS()}
		}
		st.count += n
		return st
	case ratelimit.SlidingWindow:
		idx := floorDiv(s, m.periodUS())
		switch st.w {
		case idx:
			st.c += n
			return st
		case idx - 1:
			return lstate{w: idx, c: n, p: st.c}
		}
		return lstate{w: idx, c: n}
	}
	interval := float64(m.periodUS()) / float64(m.spec.limit.Rate)
	st.tat = max(st.tat, float64(s)) + float64(n)*interval
	return st
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// verdict is what the model says of one request.
type verdict struct {
	mustAllow, mustDeny bool
	pess, opt           outcome // at the most loaded state and earliest time; the least loaded and latest
	zero                outcome // the cost-0 answer at the latest corner: what a policy with room reports in a denial
	lo, hi              outcome // the ranges of each figure over the interval
}

// earliest is the earliest server time of a decision called at a.
func (m *algoModel) earliest(a int64) int64 { return max(a-earlyUS, m.floor) }

func (m *algoModel) judge(a, b int64, n int) verdict {
	pess := m.eval(m.hi, m.earliest(a), n)
	opt := m.eval(m.lo, b+slackUS, n)
	v := verdict{mustAllow: pess.allowed, mustDeny: !opt.allowed, pess: pess, opt: opt, zero: m.eval(m.lo, b+slackUS, 0)}
	v.lo, v.hi = pess, pess
	v.widen(opt)
	if m.spec.algo == ratelimit.FixedWindow {
		// The time left of the window, E - s, is least at the least
		// loaded state's end and the latest time, and comes as near 0
		// as you like when the window may end within the interval.
		v.widen(m.eval(m.lo, m.earliest(a), n))
		v.widen(m.eval(m.hi, b+slackUS, n))
		if m.expired(m.lo, b+slackUS) != m.expired(m.hi, m.earliest(a)) {
			v.lo.reset = 0
		}
	}
	if m.spec.algo == ratelimit.SlidingWindow {
		// The figures are a sawtooth in time: at each window boundary
		// within the interval they jump back.
		P := m.periodUS()
		for t := (floorDiv(m.earliest(a), P) + 1) * P; t <= b+slackUS; t += P {
			v.widen(m.eval(m.lo, t, n))
			v.widen(m.eval(m.lo, t-1, n))
		}
	}
	return v
}

// widen extends v's ranges of figures to o's.
func (v *verdict) widen(o outcome) {
	v.lo.rem, v.hi.rem = min(v.lo.rem, o.rem), max(v.hi.rem, o.rem)
	v.lo.retry, v.hi.retry = min(v.lo.retry, o.retry), max(v.hi.retry, o.retry)
	v.lo.reset, v.hi.reset = min(v.lo.reset, o.reset), max(v.hi.reset, o.reset)
}

// fieldsWrong compares the figures of an answer got (which the verdict
// v's corners agree on: allowed or denied) with the model's, and says
// what is wrong, or "". A denial may come from the deny cache, whose
// figures run up to cacheSlack early and, for a cost above 1, are those
// of cost 1, and whose Remaining is 0; one that Redis made (redis: no
// deny cache, or none can hold a denial of the key) has the model's
// figures both ways.
func (m *algoModel) fieldsWrong(v verdict, got outcome, n int, redis bool) string {
	if got.allowed {
		if got.rem < v.lo.rem || got.rem > v.hi.rem {
			return fmt.Sprintf("Remaining %d, the model's between %d and %d", got.rem, v.lo.rem, v.hi.rem)
		}
		rlo, rhi := v.lo.reset-durTolUS, v.hi.reset+durTolUS
		if got.reset < rlo || got.reset > rhi {
			return fmt.Sprintf("ResetAfter %v, the model's between %v and %v", us(got.reset), us(rlo), us(rhi))
		}
		if got.retry != 0 {
			return fmt.Sprintf("RetryAfter %v on an allowed request", us(got.retry))
		}
		return ""
	}
	if got.rem < 0 || got.rem > v.hi.rem {
		return fmt.Sprintf("Remaining %d on a denial, the model's at most %d", got.rem, v.hi.rem)
	}
	slack := m.cacheSlack
	if redis {
		slack = 0
		if got.rem < v.lo.rem {
			return fmt.Sprintf("Remaining %d on a denial Redis made, the model's at least %d", got.rem, v.lo.rem)
		}
	}
	thi := v.hi.retry + durTolUS
	if got.retry <= 0 || got.retry > thi {
		return fmt.Sprintf("RetryAfter %v on a denial, the model's at most %v", us(got.retry), us(thi))
	}
	tlo := v.lo.retry - durTolUS - slack
	if got.retry < tlo {
		return fmt.Sprintf("RetryAfter %v on a denial, the model's at least %v", us(got.retry), us(tlo))
	}
	// A denial's ResetAfter is the state as it is (nothing counted):
	// until the key is back to its full limit. The deny cache's runs
	// early as its RetryAfter does, and is never below its RetryAfter.
	rlo, rhi := v.lo.reset-durTolUS-slack, max(v.hi.reset, v.hi.retry)+durTolUS
	if got.reset < rlo || got.reset > rhi {
		return fmt.Sprintf("ResetAfter %v on a denial, the model's between %v and %v", us(got.reset), us(rlo), us(rhi))
	}
	return ""
}

// roomWrong compares got, a policy reported with room in a denied decision
// of cost n that returned at b (µs), with the model's verdict v, and says
// what is wrong, or "". Such a policy reports its state without the
// request (its cost-0 answer), as Redis last said it when the deny cache
// answers (for cost 1 only: a larger cost asks Redis). The cache counts a
// policy's RetryAfter from before its denial was sent, so it reports the
// room up to that denial's round trip early (cacheSlack, as fieldsWrong
// allows for a denial's figures): seen on go-redis, a cached answer that
// gave a GCRA policy room 12 µs before the model's latest corner, after a
// denial that took 17 ms.
func (m *algoModel) roomWrong(v verdict, a, b int64, n int, got outcome) string {
	switch {
	case v.mustDeny && !m.eval(m.lo, b+slackUS+m.cacheSlack, n).allowed:
		return "reported with room where the model has none"
	case got.rem < 0 || got.rem > v.zero.rem:
		return fmt.Sprintf("Remaining %d with room, the model's at most %d", got.rem, v.zero.rem)
	}
	// Its ResetAfter is a peek's: the time until the policy is back to
	// its full limit, as the state is without the request (early by the
	// cached denial's round trip when the cache answers).
	z := m.judge(a, b, 0)
	if rlo, rhi := z.lo.reset-durTolUS-m.cacheSlack, z.hi.reset+durTolUS; got.reset < rlo || got.reset > rhi {
		return fmt.Sprintf("ResetAfter %v with room, the model's between %v and %v", us(got.reset), us(rlo), us(rhi))
	}
	return ""
}

// record moves the states on after the answer got to a request of cost n
// decided in [a, b]. It reports a reply that fits no state the key can be
// in ("" if none).
func (m *algoModel) record(a, b int64, n int, got outcome) string {
	early := m.earliest(a)
	m.floor = early
	if !got.allowed {
		if n == 1 || m.spec.algo == ratelimit.FixedWindow {
			m.cacheSlack = max(m.cacheSlack, b-a+slackUS)
		}
		return ""
	}
	if n == 0 {
		return ""
	}
	m.cacheSlack = 0
	lo, hi := m.next(m.lo, early, n), m.next(m.hi, b+slackUS, n)
	switch m.spec.algo {
	case ratelimit.GCRA:
		m.lo, m.hi = lo, hi
		if m.lo.tat > m.hi.tat {
			m.lo, m.hi = m.hi, m.lo
		}
		return ""
	case ratelimit.FixedWindow:
		restartLo, restartHi := m.expired(m.lo, b+slackUS), m.expired(m.hi, early)
		if restartLo != restartHi && got.rem < 0 {
			m.unknown = true // the answer has no count (a gRPC status)
			return ""
		}
		if restartLo != restartHi {
			// Either: the answer's count says which.
			count := m.spec.limit.Rate - got.rem
			switch {
			case count == n && m.lo.count+n != n:
				restartLo = true
			case count == m.lo.count+n:
				restartLo = false
			default:
				m.unknown = true
				return fmt.Sprintf("the answer's count %d fits neither a new window (%d) nor the current one (%d)", count, n, m.lo.count+n)
			}
		}
		if restartLo {
			m.lo = lstate{count: n, end: a - slackUS + m.periodUS()}
			m.hi = lstate{count: n, end: b + slackUS + m.periodUS()}
		} else {
			m.lo.count += n
			m.hi.count += n
		}
		return ""
	}
	if lo == hi {
		m.lo, m.hi = lo, hi
		return ""
	}
	// The interval straddles a window boundary: the answer's ResetAfter
	// (twice the window less the time into it) says when it was decided.
	if got.reset < 0 {
		m.unknown = true // the answer's reset is coarse (a header's seconds) or missing
		return ""
	}
	P := m.periodUS()
	elapsed := 2*P - got.reset
	var found []int64
	for idx := floorDiv(early, P); idx <= floorDiv(b+slackUS, P); idx++ {
		if s := idx*P + elapsed; elapsed >= 0 && elapsed < P && s >= early && s <= b+slackUS {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		m.unknown = true
		if len(found) == 0 {
			return fmt.Sprintf("the answer's ResetAfter %v puts the decision outside its call", us(got.reset))
		}
		return ""
	}
	m.lo = m.next(m.lo, found[0], n)
	m.hi = m.lo
	m.floor = found[0]
	return ""
}

func us(d int64) time.Duration { return time.Duration(d) * time.Microsecond }

func outcomeOf(r ratelimit.Result) outcome {
	return outcome{allowed: r.Allowed, rem: r.Remaining, retry: r.RetryAfter.Microseconds(), reset: r.ResetAfter.Microseconds()}
}

// exactKey is a key one goroutine alone uses, through one limit or
// Policies set, with the model of each of its limits.
type exactKey struct {
	key    string
	born   time.Time
	models []*algoModel
	what   string   // for reports
	log    []string // the last answers, for reports
	// counters: the key is a group of AllowCounters, one counter per
	// model, on a Limiter without a deny cache; nil otherwise.
	counters []ratelimit.Counter
	// noCache: every answer is Redis's (counters, and half of the
	// policies' keys: a Limiter without a deny cache).
	noCache bool
	// denyUntil: no deny cache entry of the key lasts past it (the
	// latest return of a denial plus its RetryAfter).
	denyUntil time.Time
}

// note keeps a line of k's story for reports.
func (k *exactKey) note(w *world, format string, args ...any) {
	if len(k.log) >= 8 {
		k.log = k.log[1:]
	}
	k.log = append(k.log, fmt.Sprintf("%s: ", w.hist.since(time.Now()))+fmt.Sprintf(format, args...))
}

func (k *exactKey) known() bool {
	for _, m := range k.models {
		if m.unknown {
			return false
		}
	}
	return true
}

// judge checks one answered request of cost n for k, decided in [call,
// ret]: results are the answer's, one per limit (policy), and allowed the
// decision. It moves the models on. A request allowed where the model
// must refuse it, or refused where the model must allow it, is a
// violation, and so are figures the model does not give.
func (w *world) judge(k *exactKey, call, ret time.Time, n int, allowed bool, results []ratelimit.Result, op string) {
	if !k.known() {
		return
	}
	if w.wipedSince(k.born, ret) {
		for _, m := range k.models {
			m.unknown = true
		}
		return
	}
	a, b := call.UnixMicro(), ret.UnixMicro()
	w.count("exact." + op)
	vs := make([]verdict, len(k.models))
	mustAllow, mustDeny := true, false
	for i, m := range k.models {
		vs[i] = m.judge(a, b, n)
		mustAllow = mustAllow && vs[i].mustAllow
		mustDeny = mustDeny || vs[i].mustDeny
	}
	where := fmt.Sprintf("%s of cost %d for %s (%s), called %s, returned after %v", op, n, k.key, k.what, w.hist.since(call), ret.Sub(call).Round(time.Microsecond))
	// Redis made this answer if no deny cache can hold a denial of the
	// key: none on its Limiter, or every denial so far has run out (the
	// cache keeps one from before its request was sent, for RetryAfter).
	// (The exact worker's keys only: others meet denials judged
	// elsewhere.)
	fresh := k.noCache || (op == "AllowN" || op == "AllowPolicies") && call.After(k.denyUntil)
	if !allowed {
		for _, r := range results {
			k.denyUntil = maxTime(k.denyUntil, ret.Add(r.RetryAfter))
		}
	}
	switch {
	case allowed && mustDeny:
		w.hist.violation("exact limit: %s was allowed where the algorithm refuses it (model: %s)", where, k.describe(vs))
		k.forget()
		return
	case !allowed && mustAllow:
		w.hist.violation("exact limit: %s was refused where the algorithm allows it (model: %s)", where, k.describe(vs))
		k.forget()
		return
	}
	for i, m := range k.models {
		if i >= len(results) {
			break
		}
		got := outcomeOf(results[i])
		if results[i].Limit != m.capacity() {
			w.hist.violation("exact limit: %s: Limit %d, want %d", where, results[i].Limit, m.capacity())
		}
		if vs[i].mustAllow || vs[i].mustDeny {
			wrong := ""
			switch {
			case allowed || len(k.models) == 1:
				wrong = m.fieldsWrong(vs[i], got, n, fresh)
			case got.allowed:
				wrong = m.roomWrong(vs[i], a, b, n, got)
				if wrong == "" && k.noCache {
					// No deny cache: a counter (or policy) with room in a
					// denial reports its state without the request,
					// exactly (a peek's answer), not what it would have
					// had ("a denied request is counted nowhere").
					wrong = m.fieldsWrong(m.judge(a, b, 0), got, 0, true)
				}
			default:
				if vs[i].mustAllow {
					wrong = "reported without room where the model has some"
				} else {
					wrong = m.fieldsWrong(vs[i], got, n, fresh)
				}
			}
			if wrong != "" {
				w.hist.violation("exact limit: %s, limit %d (%v %v): %s (model: %s)", where, i, algoName(m.spec.algo), m.spec.limit, wrong, k.describe(vs))
				k.forget()
				return
			}
		}
		if got.rem < 0 || got.rem > m.capacity() {
			w.hist.violation("exact limit: %s: Remaining %d outside 0..%d", where, got.rem, m.capacity())
		}
	}
	k.note(w, "%s cost %d called %s returned %s: allowed %v %+v", op, n, w.hist.since(call), w.hist.since(ret), allowed, results)
	for i, m := range k.models {
		got := outcome{allowed: allowed}
		if i < len(results) {
			got = outcomeOf(results[i])
			got.allowed = allowed
		}
		if msg := m.record(a, b, n, got); msg != "" {
			w.hist.violation("exact limit: %s: %s", where, msg)
		}
	}
}

func (k *exactKey) forget() {
	for _, m := range k.models {
		m.unknown = true
	}
}

func (k *exactKey) describe(vs []verdict) string {
	s := fmt.Sprintf("history %q; ", k.log)
	for i, v := range vs {
		m := k.models[i]
		s += fmt.Sprintf("[%s %v: earliest/most loaded %+v, latest/least loaded %+v; state %+v .. %+v] ", algoName(m.spec.algo), m.spec.limit, v.pess, v.opt, m.lo, m.hi)
	}
	return s
}

// wipedSince reports whether a FLUSHALL or a restart may have removed
// every key between from and to.
func (w *world) wipedSince(from, to time.Time) bool {
	w.hist.mu.Lock()
	defer w.hist.mu.Unlock()
	for _, o := range w.hist.ops {
		if o.res == "" && o.since(from) && !o.at.After(to) {
			return true
		}
	}
	return false
}

// exactPolicies is the Policies set of the exact worker: one policy of
// each algorithm, so that each decides some requests.
func exactPolicies(lease time.Duration) ([]limiterSpec, *ratelimit.Policies) {
	period := lease / 2
	specs := []limiterSpec{
		{ratelimit.GCRA, ratelimit.Limit{Rate: 8, Period: period, Burst: 4}},
		{ratelimit.FixedWindow, ratelimit.Limit{Rate: 6, Period: period}},
		{ratelimit.SlidingWindow, ratelimit.Limit{Rate: 5, Period: period}},
	}
	var ps []ratelimit.Policy
	for i, s := range specs {
		ps = append(ps, ratelimit.Policy{Name: "x" + strconv.Itoa(i), Algorithm: s.algo, Limit: s.limit})
	}
	p, err := ratelimit.NewPolicies(ps...)
	if err != nil {
		panic(err) // the specs are constants
	}
	return specs, p
}

// pause is the time between two requests of a key: mostly none or
// short, so that bursts meet each limit's bound, now and then a good
// share of a period or more, so that windows end and buckets refill.
func pause(rng *rand.Rand, period time.Duration) time.Duration {
	switch k := rng.IntN(20); {
	case k < 9:
		return 0
	case k < 13:
		return time.Duration(rng.Float64() * float64(period) / 10)
	case k < 17:
		return time.Duration((0.2 + rng.Float64()*0.6) * float64(period))
	}
	return time.Duration((0.9 + rng.Float64()*0.4) * float64(period))
}

// exactWorker runs sequences of requests on keys that only it uses, one
// key at a time, through node n's Limiters (deny caches on) and an own
// Policies set: AllowN of every cost from 0 (a peek) to the capacity,
// Wait and WaitPolicies, Reset; each answer is judged by the model. A key
// whose state a failed call left unknown is given up for a fresh one.
//
// With counters, every key is instead a group of AllowCounters (no Reset,
// no Wait: Allow alone), one counter of each algorithm.
func (w *world) exactWorker(ctx context.Context, n *node, g int, rng *rand.Rand, counters bool) {
	specs, ps := exactPolicies(w.cfg.Lease)
	period := w.cfg.Lease / 2
	seq := 0
	for ctx.Err() == nil && !n.closed.Load() {
		seq++
		key := fmt.Sprintf("x.%d.%d.%d", n.i, g, seq)
		k := &exactKey{key: key, born: time.Now()}
		var l *ratelimit.Limiter
		policies := !counters && rng.IntN(4) == 0
		switch {
		case counters:
			// AllowCounters: the policies' limits, each counter under a
			// key of its own, on a Limiter that sends every call to
			// Redis, so that every figure is the script's own.
			l = n.counters
			k.what = "counters"
			k.noCache = true
			// A third of the groups take a GCRA counter of Burst 1
			// (one request at a time, no bucket to spend).
			burst1 := rng.IntN(3) == 0
			for i, s := range specs {
				if burst1 && s.algo == ratelimit.GCRA {
					s.limit.Burst = 1
				}
				k.models = append(k.models, newModel(s))
				k.counters = append(k.counters, ratelimit.Counter{Key: "c" + strconv.Itoa(i), Policy: ratelimit.Policy{Algorithm: s.algo, Limit: s.limit}})
			}
		case policies:
			l = n.limiters[0] // its prefix holds the set's state
			k.what = "policies"
			if rng.IntN(2) == 0 {
				// Half on the counters' Limiter (no deny cache), where
				// a denial's figures are all Redis's.
				l, k.what, k.noCache = n.counters, "policies, no deny cache", true
			}
			for _, s := range specs {
				k.models = append(k.models, newModel(s))
			}
		default:
			l = n.limiters[rng.IntN(len(n.limiters))]
			spec := limiterSpec{l.Algorithm(), l.Limit()}
			k.what = algoName(spec.algo)
			k.models = []*algoModel{newModel(spec)}
		}
		capacity := k.models[0].capacity()
		for _, m := range k.models {
			capacity = min(capacity, m.capacity())
		}
		steps := 6 + rng.IntN(14)
		denied := false // the last answer: a Reset then must clear the deny cache too
		for range steps {
			if ctx.Err() != nil || n.closed.Load() || !k.known() {
				break
			}
			cost := 1
			switch r := rng.IntN(10); {
			case r == 0:
				cost = 0
			case r < 3:
				cost = capacity
			case r < 5:
				cost = 1 + rng.IntN(capacity)
			}
			switch r := rng.IntN(20); {
			case k.counters != nil:
				// No Reset and no Wait for counters: Allow alone.
			case r == 0 || denied && r < 7:
				w.exactReset(k, l, ps, policies)
				cost = 1 // at once, where a stale local denial would answer
			case r < 3 && cost > 0:
				w.exactWait(ctx, k, l, ps, policies, cost, time.Duration((0.2+rng.Float64()*0.8)*float64(period)))
				continue
			}
			denied = !w.exactAllow(k, l, ps, policies, cost)
			sleep(ctx, pause(rng, period))
		}
		if policies && k.counters == nil {
			// Best effort (the keys expire anyway), and bounded: a call
			// with no end can wait for ever on a slot that never settles.
			rctx, cancel := context.WithTimeout(context.Background(), w.cfg.Lease)
			_ = l.Reset(rctx, key, ps)
			cancel()
		}
	}
}

// exactAllow asks for a request of cost for k and judges the answer; it
// reports whether the request was allowed (false on an error).
func (w *world) exactAllow(k *exactKey, l *ratelimit.Limiter, ps *ratelimit.Policies, policies bool, cost int) bool {
	actx, cancel := context.WithTimeout(context.Background(), w.cfg.Lease/4)
	defer cancel()
	call := time.Now()
	var results []ratelimit.Result
	var allowed bool
	var err error
	op := map[bool]string{true: "AllowPolicies", false: "AllowN"}[policies]
	switch {
	case k.counters != nil:
		op = "AllowCounters"
		cs := slices.Clone(k.counters)
		for i := range cs {
			cs[i].Cost, cs[i].Peek = cost, cost == 0
		}
		var d ratelimit.Decision
		d, err = l.AllowCounters(actx, k.key, cs)
		results, allowed = d.Results, d.Allowed
		if err == nil {
			w.checkDecisionRetry(k, d)
		}
	case policies:
		var d ratelimit.Decision
		d, err = l.AllowPolicies(actx, k.key, cost, ps)
		results, allowed = d.Results, d.Allowed
		if err == nil {
			w.checkDecisionRetry(k, d)
		}
	default:
		var res ratelimit.Result
		res, err = l.AllowN(actx, k.key, cost)
		results, allowed = []ratelimit.Result{res}, res.Allowed
	}
	ret := time.Now()
	if err != nil {
		w.expected("exact "+op, call, err)
		k.forget() // the script may have run
		return false
	}
	w.judge(k, call, ret, cost, allowed, results, op)
	return allowed
}

// checkDecisionRetry: a Decision's RetryAfter is the longest of its
// policies without room (0 when allowed).
func (w *world) checkDecisionRetry(k *exactKey, d ratelimit.Decision) {
	var want time.Duration
	for _, r := range d.Results {
		if !r.Allowed {
			want = max(want, r.RetryAfter)
		}
	}
	if d.RetryAfter != want || d.Allowed && want != 0 {
		w.hist.violation("exact limit: a Decision for %s has RetryAfter %v, its policies' longest %v (allowed %v)", k.key, d.RetryAfter, want, d.Allowed)
	}
}

// exactWait waits for a request: allowed somewhere in its call, so the
// model must not refuse it at the end; a Wait that gives up must not
// have been allowed at the start, nor (the stalls of this process
// aside) have had time enough before its deadline.
func (w *world) exactWait(ctx context.Context, k *exactKey, l *ratelimit.Limiter, ps *ratelimit.Policies, policies bool, cost int, timeout time.Duration) {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	deadline, _ := wctx.Deadline()
	call := time.Now()
	var results []ratelimit.Result
	var allowed bool
	var err error
	if policies {
		var d ratelimit.Decision
		d, err = l.WaitPolicies(wctx, k.key, cost, ps)
		results, allowed = d.Results, d.Allowed
	} else {
		var res ratelimit.Result
		res, err = l.Wait(wctx, k.key, cost)
		results, allowed = []ratelimit.Result{res}, res.Allowed
	}
	ret := time.Now()
	op := map[bool]string{true: "WaitPolicies", false: "Wait"}[policies]
	// Any try may have left a denial in the deny cache, for at most two
	// periods (a sliding window's longest RetryAfter).
	for _, m := range k.models {
		k.denyUntil = maxTime(k.denyUntil, ret.Add(2*time.Duration(m.periodUS())*time.Microsecond))
	}
	if err != nil {
		if !errors.Is(err, ratelimit.ErrNotAllowed) || ctx.Err() != nil {
			w.expected("exact "+op, call, err, ratelimit.ErrNotAllowed)
			k.forget()
			return
		}
		// Every try was denied: nothing was counted, and the deny cache
		// may keep a denial of any try, its figures early by up to the
		// whole call.
		for _, m := range k.models {
			m.cacheSlack = max(m.cacheSlack, ret.UnixMicro()-call.UnixMicro()+slackUS+earlyUS)
		}
		if !k.known() || w.wipedSince(k.born, ret) {
			return
		}
		w.count("exact." + op + ".gaveup")
		a := call.UnixMicro()
		var latest int64 // when the most loaded state lets it pass
		var vs []verdict
		now := true
		for _, m := range k.models {
			v := m.judge(a, a, cost)
			vs = append(vs, v)
			now = now && v.mustAllow
			if !v.pess.allowed {
				latest = max(latest, v.pess.retry)
			}
		}
		if now {
			w.hist.violation("exact limit: %s of cost %d for %s gave up (%v) where the algorithm allows it at once (model: %s)", op, cost, k.key, err, k.describe(vs))
			k.forget()
			return
		}
		spare := deadline.Sub(call.Add(us(latest)))
		w.hist.mu.Lock()
		_, stalled := w.hist.stallsLocked(call, ret)
		w.hist.mu.Unlock()
		if spare > w.cfg.Lease/4+stalled && !w.hist.faultNear(call, ret, 0) {
			w.hist.violation("exact limit: %s of cost %d for %s gave up (%v) %v before its deadline, though the algorithm allows it %v after the call",
				op, cost, k.key, err, deadline.Sub(ret).Round(time.Millisecond), us(latest))
		}
		return
	}
	w.judgeWait(k, call, ret, cost, allowed, results, op)
}

// judgeWait: an allowed Wait was decided by its last try, somewhere in
// its call; only its allowance and the states are checked.
func (w *world) judgeWait(k *exactKey, call, ret time.Time, cost int, allowed bool, results []ratelimit.Result, op string) {
	if !k.known() {
		return
	}
	if w.wipedSince(k.born, ret) {
		k.forget()
		return
	}
	w.count("exact." + op)
	a, b := call.UnixMicro(), ret.UnixMicro()
	k.note(w, "%s cost %d called %s returned %s: allowed %v %+v", op, cost, w.hist.since(call), w.hist.since(ret), allowed, results)
	for i, m := range k.models {
		if v := m.judge(a, b, cost); !allowed || v.mustDeny {
			w.hist.violation("exact limit: %s of cost %d for %s returned allowed %v, where the algorithm refuses it until its return", op, cost, k.key, allowed)
			k.forget()
			return
		}
		got := outcome{allowed: true}
		if i < len(results) {
			got = outcomeOf(results[i])
		}
		if msg := m.record(a, b, cost, got); msg != "" {
			w.hist.violation("exact limit: %s for %s: %s", op, k.key, msg)
		}
	}
}

func (w *world) exactReset(k *exactKey, l *ratelimit.Limiter, ps *ratelimit.Policies, policies bool) {
	actx, cancel := context.WithTimeout(context.Background(), w.cfg.Lease/4)
	defer cancel()
	call := time.Now()
	var err error
	if policies {
		err = l.Reset(actx, k.key, ps)
	} else {
		err = l.Reset(actx, k.key)
	}
	w.count("exact.reset")
	if err != nil {
		w.expected("exact Reset", call, err)
		k.forget()
		return
	}
	// Reset is exact for the Limiter that calls it: Redis and its deny
	// cache forget the key.
	for _, m := range k.models {
		m.lo, m.hi, m.cacheSlack = freshState(), freshState(), 0
	}
	k.denyUntil = time.Time{}
	k.note(w, "Reset called %s", w.hist.since(call))
}
