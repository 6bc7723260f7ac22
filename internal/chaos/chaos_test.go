package chaos

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestChaos runs the harness: a few short seeds by default, one seed with
// SLUICE_CHAOS_SEED=N, and seeds one after another for a while with
// SLUICE_CHAOS=30m (a soak).
func TestChaos(t *testing.T) {
	redistest.Skip(t)
	seeds := []uint64{1, 2}
	per := 16 * time.Second
	var soak time.Duration
	if s := os.Getenv("SLUICE_CHAOS"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SLUICE_CHAOS=%q: %v", s, err)
		}
		soak, per = d, 30*time.Second
	}
	if s := os.Getenv("SLUICE_CHAOS_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SLUICE_CHAOS_SEED=%q: %v", s, err)
		}
		seeds, soak = []uint64{n}, 0
	}
	if soak > 0 {
		seeds = nil
		base := uint64(time.Now().UnixNano())
		for i := range uint64(soak / per) {
			seeds = append(seeds, base+i)
		}
	}
	var kinds []string
	if s := os.Getenv("SLUICE_CHAOS_FAULTS"); s != "" {
		kinds = strings.Split(s, ",")
	}
	for _, seed := range seeds {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			r := Run(t, Config{Seed: seed, Duration: per, Faults: kinds})
			t.Log(r.Summary())
			if len(r.Violations) > 0 {
				t.Errorf("seed %d: %d violations (rerun: SLUICE_CHAOS_SEED=%d go test -run TestChaos ./internal/chaos)\nschedule:\n  %s\nviolations:\n  %s",
					seed, len(r.Violations), seed, strings.Join(r.Schedule, "\n  "), strings.Join(r.Violations, "\n  "))
			}
		})
	}
}
