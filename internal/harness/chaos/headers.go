package chaos

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/sluicekit/sluice/ratelimit"
)

// The header fields of a rate-limit middleware, checked against the
// decision as ratelimit.NewMiddleware documents them
// (draft-ietf-httpapi-ratelimit-headers-11): RateLimit-Policy lists each
// policy as "name";q=Limit;w=seconds to earn it back (then the stacked
// concurrency middleware's, on a request it let in); RateLimit gives each
// policy's r=Remaining (never above q) and t=seconds until quota is back
// (ResetAfter, or on a denial RetryAfter, rounded up); a 429 has
// Retry-After (at least 1) naming the same time as the deciding policy's
// t; the optional X-RateLimit fields and problem details agree.

// member is one policy of a RateLimit field.
type member struct {
	name string
	r, t int
}

// policyField is what RateLimit-Policy must say of spec under name.
func policyField(name string, spec limiterSpec) string {
	capacity := newModel(spec).capacity()
	window := float64(spec.limit.Period) * float64(capacity) / float64(spec.limit.Rate)
	return fmt.Sprintf(`"%s";q=%d;w=%d`, name, capacity, max(int64(math.Ceil(window/float64(time.Second))), 1))
}

// ceilS rounds microseconds up to whole seconds.
func ceilS(usec int64) int {
	if usec <= 0 {
		return 0
	}
	return int((usec + 999_999) / 1_000_000)
}

// checkHeaders checks what the header fields of an answer of route r to
// client k say on their own, and returns the RateLimit members.
//
// concOK is false when a fault of the node's network or the server may
// have sent the stacked concurrency middleware to its fallback, which
// serves the request without its policy.
func (w *world) checkHeaders(where string, r *rateRoute, k *exactKey, h http.Header, rec *httptest.ResponseRecorder, allowed, concOK bool) []member {
	var names []string
	var policies []string
	for i, m := range k.models {
		name := r.name
		if len(k.models) > 1 {
			name = goldNames[i]
		}
		names = append(names, name)
		policies = append(policies, policyField(name, m.spec))
	}
	want := strings.Join(policies, ", ")
	if r.conc && allowed && (concOK || strings.Contains(h.Get("Ratelimit-Policy"), concRouteName)) {
		want += fmt.Sprintf(`, "%s";q=%d;qu="concurrent-requests"`, concRouteName, concRouteLimit)
	}
	if got := strings.Join(h.Values("Ratelimit-Policy"), ", "); got != want {
		w.hist.violation("%s: RateLimit-Policy %q, want %q", where, got, want)
	}
	var ms []member
	for _, line := range h.Values("Ratelimit") {
		for _, part := range strings.Split(line, ",") {
			params := strings.Split(strings.TrimSpace(part), ";")
			m := member{name: strings.Trim(params[0], `"`), r: -1, t: -1}
			for _, p := range params[1:] {
				key, v, _ := strings.Cut(p, "=")
				n, err := strconv.Atoi(v)
				if err != nil {
					w.hist.violation("%s: RateLimit parameter %q", where, p)
				}
				switch key {
				case "r":
					m.r = n
				case "t":
					m.t = n
				}
			}
			ms = append(ms, m)
		}
	}
	if len(ms) != len(names) {
		w.hist.violation("%s: RateLimit %q, want members %v", where, h.Values("Ratelimit"), names)
		return nil
	}
	for i, m := range ms {
		q := k.models[i].capacity()
		if m.name != names[i] || m.r < 0 || m.r > q || m.t < 0 {
			w.hist.violation("%s: RateLimit member %d %+v: want policy %q with 0 <= r <= q=%d and t >= 0", where, i, m, names[i], q)
		}
	}
	retry := h.Get("Retry-After")
	if allowed {
		if retry != "" {
			w.hist.violation("%s: Retry-After %q on a request let through", where, retry)
		}
	} else {
		ra, err := strconv.Atoi(retry)
		named := false
		for _, m := range ms {
			named = named || m.t == ra
		}
		if err != nil || ra < 1 || !named {
			w.hist.violation("%s: 429 with Retry-After %q: want whole seconds >= 1, the t of a policy without room (RateLimit %q)", where, retry, h.Get("Ratelimit"))
		}
		if r.problem {
			body := rec.Body.String()
			if ct := h.Get("Content-Type"); ct != "application/problem+json" || !strings.Contains(body, `"violated-policies":["`+names[0]+`"]`) ||
				!strings.Contains(body, "quota-exceeded") {
				w.hist.violation("%s: 429 with Content-Type %q and body %q: want quota-exceeded problem details naming %q", where, ct, body, names[0])
			}
		}
	}
	if r.xrl && len(ms) == 1 {
		limit, _ := strconv.Atoi(h.Get("X-RateLimit-Limit"))
		rem, _ := strconv.Atoi(h.Get("X-RateLimit-Remaining"))
		reset, _ := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64)
		now := time.Now().Unix()
		latest := now + 2*int64(math.Ceil(r.spec.limit.Period.Seconds())) + 1
		if limit != k.models[0].capacity() || rem != ms[0].r || reset < now-5 || reset > latest {
			w.hist.violation("%s: X-RateLimit-Limit %d, -Remaining %d, -Reset %d: want %d, %d and a time from %d to %d",
				where, limit, rem, reset, k.models[0].capacity(), ms[0].r, now-5, latest)
		}
	}
	return ms
}

// judgeCoarse is judge for answers whose figures are coarse: a header's
// Remaining per policy and seconds. results carry Remaining; ms the
// members' t (nil: none, a gRPC status).
func (w *world) judgeCoarse(k *exactKey, call, ret time.Time, allowed bool, results []ratelimit.Result, ms []member, h http.Header, op string) {
	if !k.known() {
		return
	}
	if w.wipedSince(k.born, ret) {
		k.forget()
		return
	}
	a, b := call.UnixMicro(), ret.UnixMicro()
	w.count("exact." + strings.Fields(op)[0])
	vs := make([]verdict, len(k.models))
	mustAllow, mustDeny := true, false
	for i, m := range k.models {
		vs[i] = m.judge(a, b, 1)
		mustAllow = mustAllow && vs[i].mustAllow
		mustDeny = mustDeny || vs[i].mustDeny
	}
	where := fmt.Sprintf("%s for %s (%s), called %s, returned after %v", op, short(k.key), k.what, w.hist.since(call), ret.Sub(call).Round(time.Microsecond))
	switch {
	case allowed && mustDeny:
		w.hist.violation("exact limit: %s was let through where the algorithm refuses it (model: %s)", where, k.describe(vs))
		k.forget()
		return
	case !allowed && mustAllow:
		w.hist.violation("exact limit: %s was refused where the algorithm allows it (model: %s)", where, k.describe(vs))
		k.forget()
		return
	}
	for i, m := range k.models {
		v := vs[i]
		if !(v.mustAllow || v.mustDeny) || ms == nil {
			continue
		}
		got, t := results[i].Remaining, ms[i].t
		wrong := ""
		switch {
		case allowed && (got < v.lo.rem || got > v.hi.rem):
			wrong = fmt.Sprintf("r=%d, the model's between %d and %d", got, v.lo.rem, v.hi.rem)
		case allowed:
			tlo, thi := ceilS(v.lo.reset-durTolUS), ceilS(v.hi.reset+durTolUS)
			if t < tlo || t > thi {
				wrong = fmt.Sprintf("t=%d, the model's ResetAfter between %d and %d seconds", t, tlo, thi)
			}
		case got > max(v.zero.rem, v.hi.rem):
			wrong = fmt.Sprintf("r=%d on a denial, the model's at most %d", got, max(v.zero.rem, v.hi.rem))
		case len(k.models) == 1:
			tlo := max(ceilS(v.lo.retry-durTolUS-m.cacheSlack), 1)
			thi := max(ceilS(v.hi.retry+durTolUS), 1)
			if t < tlo || t > thi {
				wrong = fmt.Sprintf("t=%d on a denial, the model's RetryAfter between %d and %d seconds", t, tlo, thi)
			}
		}
		if wrong != "" {
			w.hist.violation("exact limit: %s, policy %d (%v %v): %s (RateLimit %q, Retry-After %q; model: %s)", where, i, algoName(m.spec.algo), m.spec.limit, wrong,
				h.Get("Ratelimit"), h.Get("Retry-After"), k.describe(vs))
			k.forget()
			return
		}
	}
	k.note(w, "%s called %s returned %s: allowed %v RateLimit %q", op, w.hist.since(call), w.hist.since(ret), allowed, h.Get("Ratelimit"))
	for i, m := range k.models {
		got := outcome{allowed: allowed, rem: -1, reset: -1}
		if ms != nil {
			got.rem = results[i].Remaining
		}
		if msg := m.record(a, b, 1, got); msg != "" {
			w.hist.violation("exact limit: %s: %s", where, msg)
		}
	}
}
