package main

import (
	"context"
	"fmt"
	"slices"

	"github.com/sluicekit/sluice/ratelimit"
)

// Two policies in one decision (Limiter.AllowPolicies) against one
// (Limiter.Allow), in the same rounds: issue 14's target is at least 0.9x
// Allow's ops/s. Both run GCRA at the generous rate, which no call reaches,
// so every call does the full allowed path on the server; the second
// policy is a fixed window of a billion an hour. Each call is one script
// that reads and writes one key; Allow's (ratelimit_gcra) takes 3
// arguments and replies one integer when it allows (4 values when it
// denies), AllowPolicies' (ratelimit_multi) with
// two policies takes 4 and replies 4, and keeps 6 numbers of state to
// Allow's 1. AllowPolicies (1) runs the same algorithm as Allow through
// the multi-policy script: the like-for-like row. The workload has its
// own implementation list, so the peers and the other limiters do not run
// it.

var policyImpls = []impl[limiter]{
	{
		name: "sluice Allow (1 policy)", kind: ours,
		open: func(ctx context.Context, s *server, r rate) (limiter, func(), error) {
			sc, client, err := openCache(ctx, s)
			if err != nil {
				return nil, nil, err
			}
			l, err := ratelimit.New(sc, ratelimit.Options{
				Algorithm: ratelimit.GCRA, Limit: ratelimit.Limit{Rate: r.limit, Period: r.window}, Prefix: "sluice-bench:rl:",
			})
			if err != nil {
				client.Close()
				return nil, nil, err
			}
			return sluiceLimiter{l}, client.Close, nil
		},
	},
	{name: "sluice AllowPolicies (1)", kind: ours, open: openPolicies(1)},
	{name: "sluice AllowPolicies (2)", kind: ours, open: openPolicies(2)},
}

// openPolicies opens a limiter whose Allow is AllowPolicies with the first
// n of: GCRA at the workload's rate, a fixed window of a billion an hour.
// One policy is the multi-policy script's own cost, against Allow's
// script; two is the case.
func openPolicies(n int) func(ctx context.Context, s *server, r rate) (limiter, func(), error) {
	return func(ctx context.Context, s *server, r rate) (limiter, func(), error) {
		sc, client, err := openCache(ctx, s)
		if err != nil {
			return nil, nil, err
		}
		ps, err := ratelimit.NewPolicies([]ratelimit.Policy{
			{Name: "rate", Algorithm: ratelimit.GCRA, Limit: ratelimit.Limit{Rate: r.limit, Period: r.window}},
			{Name: "hour", Algorithm: ratelimit.FixedWindow, Limit: ratelimit.PerHour(1_000_000_000)},
		}[:n]...)
		if err != nil {
			client.Close()
			return nil, nil, err
		}
		// Its own Limit plays no part in AllowPolicies.
		l, err := ratelimit.New(sc, ratelimit.Options{Limit: ratelimit.PerSecond(1), Prefix: "sluice-bench:rl:"})
		if err != nil {
			client.Close()
			return nil, nil, err
		}
		return policiesLimiter{l, ps}, client.Close, nil
	}
}

type policiesLimiter struct {
	l  *ratelimit.Limiter
	ps *ratelimit.Policies
}

func (p policiesLimiter) Allow(ctx context.Context, key string) (bool, error) {
	d, err := p.l.AllowPolicies(ctx, key, 1, p.ps)
	return d.Allowed, err
}

var policyWorkloads = []workload[limiter]{
	{
		name: "ratelimit.policies", title: "rate-limit two policies in one call vs one, a key per goroutine, 64 goroutines",
		goroutines: 64, instances: 1, rate: generous, mark: "allowed", loops: allowLoops(64, false),
	},
}

// policyRatio states the two-policy decision's ops/s as a share of
// Allow's, from the median rounds and round by round (the rounds are
// interleaved, so round i of one ran next to round i of the other), or ""
// if the workload did not run.
func policyRatio(results []result) string {
	var one, two *result
	for i := range results {
		r := &results[i]
		switch {
		case r.Workload != "ratelimit.policies" || r.Ops == 0:
		case r.Impl == policyImpls[0].name:
			one = r
		case r.Impl == policyImpls[2].name:
			two = r
		}
	}
	if one == nil || two == nil {
		return ""
	}
	x := two.OpsPerSec / one.OpsPerSec
	verdict := "met"
	switch {
	case len(one.RoundsOpsPS) < minJudgedRounds:
		verdict = fmt.Sprintf("not judged in %d round(s)", len(one.RoundsOpsPS))
	case x < 0.9:
		verdict = "not met"
	}
	var per []float64
	for i := range min(len(one.RoundsOpsPS), len(two.RoundsOpsPS)) {
		per = append(per, two.RoundsOpsPS[i]/one.RoundsOpsPS[i])
	}
	return fmt.Sprintf("ratelimit.policies: AllowPolicies with 2 policies runs at %.2fx Allow's ops/s (median rounds, "+
		"same run; per round %.2fx to %.2fx; target >= 0.9x: %s)", x, slices.Min(per), slices.Max(per), verdict)
}
