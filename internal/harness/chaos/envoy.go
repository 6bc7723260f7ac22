package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicekit/sluice/envoy/rls"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/ratelimit"
)

// The Envoy rate limit service's configuration in the workload: an
// organisation's budget and, nested, each of its users'. Limits per day,
// so that a run sees no new window (but at midnight, which the worker
// skips): what a counter allows is then its count alone.
const envoyConfig = `
domain: chaos
descriptors:
  - key: org
    rate_limit: {unit: day, requests_per_unit: 12}
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 5}
`

const (
	envoyOrgLimit  = 12
	envoyUserLimit = 5
	envoyUsers     = 3 // per organisation: together they can spend its budget
)

// envoyNode is the Envoy rate limit service (envoy/rls) on node n's limits
// script cache, served by a gRPC server of its own on loopback, and a
// client of it (Envoy's generated stub).
type envoyNode struct {
	loopbackGRPC
	rls rlspb.RateLimitServiceClient
}

func (w *world) newEnvoy(t testing.TB, n *node) {
	ln := n.limits
	cfg, err := rls.Parse(rls.File{Name: "chaos.yaml", Data: []byte(envoyConfig)})
	if err != nil {
		t.Fatal(err)
	}
	l, err := ratelimit.New(ln.sc, ratelimit.Options{Prefix: "sluice:rl:envoy:"}) // no Limit of its own: the rules are the limits
	if err != nil {
		t.Fatal(err)
	}
	// Refusals under the fault schedule are the run's business, not the
	// log's.
	svc, err := rls.New(l, cfg, rls.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	e := &envoyNode{}
	srv := grpc.NewServer()
	rlspb.RegisterRateLimitServiceServer(srv, svc)
	e.start(t, srv)
	e.rls = rlspb.NewRateLimitServiceClient(e.conn)
	ln.envoy = e
}

func (e *envoyNode) close() {
	if e == nil {
		return
	}
	e.loopbackGRPC.close()
}

// envoyCounts is what the worker knows of one organisation's counters: lo
// is what the allowed requests certainly added, hi adds those whose fate
// is unknown (an error: the script may have run).
//
// asked names the (node, user) pairs whose requests may have met a
// refusal or an error: a node's deny cache may answer their next
// refusal. A pair's first refusal is Redis's own.
type envoyCounts struct {
	lo, hi map[string]int
	asked  map[string]bool
}

// envoyWorker sends ShouldRateLimit requests, each with an organisation's
// descriptor and its user's, to the services of random nodes (all on one
// Redis), one organisation at a time, and judges every answer both ways:
// allowed only if every counter certainly had room, refused only if one
// may have had none, a refused request counted in no counter (the
// organisation's budget is spent only by allowed requests), and the
// per-descriptor statuses consistent with the overall code. An
// organisation whose keys a wipe may have removed is given up for a fresh
// one.
func (w *world) envoyWorker(ctx context.Context, id int, rng *rand.Rand) {
	run := time.Now().UnixNano() // counters live a day: names unique to the run (Run drops them after Close)
	period := w.cfg.Lease / 2
	for seq := 0; ctx.Err() == nil; seq++ {
		org := fmt.Sprintf("o%d.%d.%d", run, id, seq)
		counts := envoyCounts{lo: map[string]int{}, hi: map[string]int{}, asked: map[string]bool{}}
		born := time.Now()
		for range 10 + rng.IntN(20) {
			if ctx.Err() != nil {
				return
			}
			n := w.nodes[rng.IntN(len(w.nodes))]
			if n.closed.Load() || n.limits == nil || n.limits.envoy == nil {
				sleep(ctx, pause(rng, period))
				continue
			}
			user := fmt.Sprint("u", rng.IntN(envoyUsers))
			hits := 1
			if rng.IntN(4) == 0 {
				hits = 2
			}
			if !w.envoyRequest(ctx, n, org, user, hits, born, &counts) {
				break
			}
			sleep(ctx, pause(rng, period))
		}
	}
}

// dropEnvoyKeys deletes the services' counters once every node is closed
// (no answer is judged after that): they live a day, and the run's last
// check wants every key gone soon after Close. Not when a worker ends: a
// request it gave up at the run's end may still be on its way through a
// service, and its script then writes a counter after the drop (seen: one
// key left, with a day to live). It tries for a while, as a fault may
// still be ending.
func (w *world) dropEnvoyKeys() {
	redistest.WaitFor(context.Background(), 4*w.cfg.Lease, func() bool {
		for _, srv := range w.servers() {
			out, err := srv.Do("KEYS", "sluice:rl:envoy:*")
			if err != nil {
				return false
			}
			for k := range strings.FieldsSeq(out) {
				if _, err := srv.Do("DEL", k); err != nil {
					return false
				}
			}
		}
		return true
	})
}

// envoyRequest sends and judges one request; false if the organisation's
// counts are no longer known.
func (w *world) envoyRequest(ctx context.Context, n *node, org, user string, hits int, born time.Time, counts *envoyCounts) bool {
	req := &rlspb.RateLimitRequest{Domain: "chaos", HitsAddend: uint32(hits), Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "org", Value: org}}},
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "org", Value: org}, {Key: "user", Value: user}}},
	}}
	counters := []string{"org", "user:" + user}
	limits := []int{envoyOrgLimit, envoyUserLimit}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	call := time.Now()
	resp, err := n.limits.envoy.rls.ShouldRateLimit(cctx, req)
	ret := time.Now()
	cancel()
	if ctx.Err() != nil || n.closed.Load() {
		return false
	}
	w.count("envoy.request")
	if w.wipedSince(born, ret) || call.UTC().YearDay() != ret.UTC().YearDay() || born.UTC().YearDay() != ret.UTC().YearDay() {
		return false // the keys may be gone, or a new day's window began
	}
	where := fmt.Sprintf("Envoy service on node %d for %s/%s (hits %d), called %s", n.i, org, user, hits, w.hist.since(call))
	pair := fmt.Sprint(n.i, "/", user)
	fresh := !counts.asked[pair] // a refusal now is Redis's, not the deny cache's
	if err != nil || resp.GetOverallCode() != rlspb.RateLimitResponse_OK {
		counts.asked[pair] = true
	}
	if err != nil {
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			// An outage (no FallbackLocal): Envoy's failure_mode_deny
			// decides. The script may have run.
			for _, c := range counters {
				counts.hi[c] += hits
			}
			return true
		default:
			w.hist.violation("%s: %v, an error that is no outage, for a well-formed request", where, err)
			return false
		}
	}
	allowed := resp.GetOverallCode() == rlspb.RateLimitResponse_OK
	if st := resp.GetStatuses(); len(st) != len(counters) {
		w.hist.violation("%s: %d statuses for %d descriptors", where, len(st), len(counters))
		return false
	}
	anyOver := false
	for i, st := range resp.GetStatuses() {
		over := st.GetCode() == rlspb.RateLimitResponse_OVER_LIMIT
		anyOver = anyOver || over
		if over && counts.hi[counters[i]]+hits <= limits[i] {
			w.hist.violation("%s: its %s descriptor said OVER_LIMIT with room: at most %d of %d counted", where, counters[i], counts.hi[counters[i]], limits[i])
			return false
		}
	}
	if anyOver == allowed {
		w.hist.violation("%s: overall %v, a descriptor over its limit: %v", where, resp.GetOverallCode(), anyOver)
		return false
	}
	w.count("envoy.judged")
	mustDeny, mustAllow := false, true
	for i, c := range counters {
		mustDeny = mustDeny || counts.lo[c]+hits > limits[i]
		mustAllow = mustAllow && counts.hi[c]+hits <= limits[i]
	}
	if wrong := envoyFiguresWrong(resp, allowed, fresh, counters, limits, hits, counts, call, ret); wrong != "" {
		w.hist.violation("%s: %s", where, wrong)
		return false
	}
	switch {
	case allowed && mustDeny:
		w.hist.violation("%s: allowed, though %s had certainly counted %d of %d and user %d of %d", where,
			org, counts.lo["org"], envoyOrgLimit, counts.lo[counters[1]], envoyUserLimit)
		return false
	case !allowed && mustAllow:
		w.hist.violation("%s: refused, though at most %d of %d were counted for the organisation and %d of %d for the user (a refused request counts nowhere)", where,
			counts.hi["org"], envoyOrgLimit, counts.hi[counters[1]], envoyUserLimit)
		return false
	}
	if allowed {
		for _, c := range counters {
			counts.lo[c] += hits
			counts.hi[c] += hits
		}
		w.count("envoy.allowed")
	} else {
		w.count("envoy.refused")
	}
	return true
}

// envoyFiguresWrong checks the figures of each descriptor's status against
// the counts, both ways, and says what is wrong, or "": its limit as
// configured; on an allowed request, LimitRemaining is the limit less the
// count with the request (between what the counts certainly and at most
// were, plus hits) and DurationUntilReset the time to the next midnight
// UTC, where a day's window ends; on a refused one each counter reports
// its state as it is, without the request (it is counted nowhere): at
// least the limit less the most it may hold, no reset while nothing may
// be counted, and one for a counter over its limit. A refusal may come
// from the deny cache, which reports the other counter as the denial it
// keeps found it (another user's requests may have counted in the
// organisation since): counts only grow in a day, so its remaining is no
// lower than now, but it may be higher and its reset missing. A refusal
// that Redis made (fresh: the first of its node and user) reports each
// counter exactly as it is: the limit less its count, and the time to
// midnight once anything is counted (both ways).
func envoyFiguresWrong(resp *rlspb.RateLimitResponse, allowed, fresh bool, counters []string, limits []int, hits int, counts *envoyCounts, call, ret time.Time) string {
	midnight := ret.UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	const tol = 2 * time.Millisecond // rounded to ms, and TIME's ms
	for i, st := range resp.GetStatuses() {
		c, limit := counters[i], limits[i]
		cl := st.GetCurrentLimit()
		if cl.GetRequestsPerUnit() != uint32(limit) || cl.GetUnit() != rlspb.RateLimitResponse_RateLimit_DAY {
			return fmt.Sprintf("the %s descriptor's CurrentLimit is %v, want %d a day", c, cl, limit)
		}
		rem := int(st.GetLimitRemaining())
		reset := st.GetDurationUntilReset().AsDuration()
		if allowed {
			lo, hi := limit-counts.hi[c]-hits, limit-counts.lo[c]-hits
			if rem < lo || rem > hi {
				return fmt.Sprintf("allowed, its %s descriptor's LimitRemaining %d, want %d to %d (counted %d to %d of %d before)", c, rem, lo, hi, counts.lo[c], counts.hi[c], limit)
			}
			if rlo, rhi := midnight.Sub(ret)-tol, midnight.Sub(call)+tol; reset < rlo || reset > rhi {
				return fmt.Sprintf("allowed, its %s descriptor's DurationUntilReset %v, want %v to %v (the day's end)", c, reset, rlo, rhi)
			}
			continue
		}
		if lo := max(limit-counts.hi[c], 0); rem < lo {
			return fmt.Sprintf("refused, its %s descriptor's LimitRemaining %d, want at least %d: a refused request counts nowhere (counted %d to %d of %d)", c, rem, lo, counts.lo[c], counts.hi[c], limit)
		}
		switch {
		case reset > midnight.Sub(call)+tol:
			return fmt.Sprintf("refused, its %s descriptor's DurationUntilReset %v, past the day's end %v", c, reset, midnight.Sub(call))
		case counts.hi[c] == 0 && reset != 0:
			return fmt.Sprintf("refused, its %s descriptor, with nothing counted, has DurationUntilReset %v, want none", c, reset)
		case st.GetCode() == rlspb.RateLimitResponse_OVER_LIMIT && counts.lo[c] > 0 && reset == 0:
			return fmt.Sprintf("refused, its %s descriptor, over its limit with %d counted, has no DurationUntilReset", c, counts.lo[c])
		case !fresh:
		case rem > max(limit-counts.lo[c], 0):
			return fmt.Sprintf("refused by Redis, its %s descriptor's LimitRemaining %d, want at most %d (counted %d to %d of %d)", c, rem, max(limit-counts.lo[c], 0), counts.lo[c], counts.hi[c], limit)
		case counts.lo[c] > 0 && (reset < midnight.Sub(ret)-tol || reset > midnight.Sub(call)+tol):
			return fmt.Sprintf("refused by Redis, its %s descriptor, with %d counted, has DurationUntilReset %v, want %v to %v (the day's end)", c, counts.lo[c], reset, midnight.Sub(ret)-tol, midnight.Sub(call)+tol)
		}
	}
	return ""
}
