package chaos

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// A Variant is one setting the harness runs in (a client, a single server
// or a cluster) and the seeds of its short run.
type Variant struct {
	Name   string // the subtest's name: go test -run 'TestChaos/NAME'
	Seeds  []uint64
	Config Config // Seed, Duration and Faults are set by Suite
}

// Suite runs each variant as a subtest, one sub-subtest per seed: the
// variant's seeds of 16 s each by default; with SLUICE_CHAOS_SEED=N seed N
// only (for 30 s if SLUICE_CHAOS is set too: a soak's seed reruns so); with
// SLUICE_CHAOS=30m, fresh seeds of 30 s one after another for
// about that long, shared among the variants (a -run filter that keeps one
// variant gives it half or a third of the time); with
// SLUICE_CHAOS_FAULTS=a,b only those fault kinds.
func Suite(t *testing.T, variants ...Variant) {
	redistest.Skip(t)
	per := 16 * time.Second
	var soak time.Duration
	var rerunEnv string
	if s := os.Getenv("SLUICE_CHAOS"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SLUICE_CHAOS=%q: %v", s, err)
		}
		soak, per = d, 30*time.Second
		// A soak's seeds run for per: a rerun must too.
		rerunEnv = "SLUICE_CHAOS=" + s + " "
	}
	var only []uint64
	if s := os.Getenv("SLUICE_CHAOS_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SLUICE_CHAOS_SEED=%q: %v", s, err)
		}
		only, soak = []uint64{n}, 0
	}
	var kinds []string
	if s := os.Getenv("SLUICE_CHAOS_FAULTS"); s != "" {
		kinds = strings.Split(s, ",")
	}
	base := uint64(time.Now().UnixNano())
	for _, v := range variants {
		seeds := v.Seeds
		switch {
		case only != nil:
			seeds = only
		case soak > 0:
			seeds = nil
			for i := range uint64(soak / per / time.Duration(len(variants))) {
				seeds = append(seeds, base+i)
			}
		}
		t.Run(v.Name, func(t *testing.T) {
			for _, seed := range seeds {
				t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
					cfg := v.Config
					cfg.Seed, cfg.Duration, cfg.Faults = seed, per, kinds
					r := Run(t, cfg)
					t.Log(r.Summary())
					if len(r.Violations) > 0 {
						t.Errorf("seed %d: %d violations (rerun: %sSLUICE_CHAOS_SEED=%d go test -run 'TestChaos/%s' in this package)\nschedule:\n  %s\nviolations:\n  %s",
							seed, len(r.Violations), rerunEnv, seed, v.Name, strings.Join(r.Schedule, "\n  "), strings.Join(r.Violations, "\n  "))
					}
				})
			}
		})
	}
}
