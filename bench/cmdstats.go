package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// cmdStats reads the servers' INFO commandstats, which counts the calls and
// the time of every command, those a script makes (the HSET inside an
// EVALSHA) as well as the EVALSHA itself, whose time includes theirs. The
// difference over a round, per operation, says where an implementation's
// server CPU goes; what it does not count (reading requests, writing
// replies, the event loop) is the rest of the cpu/op server share.
type cmdStats struct {
	c rueidis.Client
}

// cmdCost is one command's calls and time per operation in a round.
type cmdCost struct {
	Name  string  `json:"name"`
	Calls float64 `json:"calls_per_op"`
	Usec  float64 `json:"usec_per_op"`
}

// cmdCount is one command's totals as INFO reports them.
type cmdCount struct {
	calls int64
	usec  int64
}

// read returns the totals of every command, summed over the nodes.
func (s *cmdStats) read(ctx context.Context) map[string]cmdCount {
	if s == nil {
		return nil
	}
	m := map[string]cmdCount{}
	for _, node := range s.c.Nodes() {
		info, err := node.Do(ctx, node.B().Info().Section("commandstats").Build()).ToString()
		if err != nil {
			return nil
		}
		// cmdstat_hset:calls=5,usec=7,usec_per_call=1.40,rejected_calls=0,failed_calls=0
		for _, line := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			name, found := strings.CutPrefix(name, "cmdstat_")
			if !ok || !found {
				continue
			}
			var c cmdCount
			for _, kv := range strings.Split(rest, ",") {
				k, v, _ := strings.Cut(kv, "=")
				n, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "calls":
					c.calls = n
				case "usec":
					c.usec = n
				}
			}
			t := m[name]
			m[name] = cmdCount{calls: t.calls + c.calls, usec: t.usec + c.usec}
		}
	}
	return m
}

// perOp turns two readings into each command's calls and time per
// operation, the costliest first; the bench's own INFO calls are left out.
func perOp(before, after map[string]cmdCount, ops int64) []cmdCost {
	if before == nil || after == nil || ops == 0 {
		return nil
	}
	var out []cmdCost
	for name, a := range after {
		b := before[name]
		if name == "info" || a.calls == b.calls {
			continue
		}
		out = append(out, cmdCost{Name: name,
			Calls: float64(a.calls-b.calls) / float64(ops), Usec: float64(a.usec-b.usec) / float64(ops)})
	}
	slices.SortFunc(out, func(x, y cmdCost) int {
		return cmp.Or(cmp.Compare(y.Usec, x.Usec), strings.Compare(x.Name, y.Name))
	})
	return out
}

// printCmdStats prints, under each table row that has them, the commands
// the server ran per operation.
func printCmdStats(w io.Writer, r result) {
	if len(r.Commands) == 0 {
		return
	}
	var parts []string
	for _, c := range r.Commands {
		parts = append(parts, fmt.Sprintf("%s %.2f×%.2fµs", strings.ToUpper(c.Name), c.Calls, c.Usec/c.Calls))
	}
	fmt.Fprintf(w, "      commands/op: %s\n", strings.Join(parts, ", "))
}
