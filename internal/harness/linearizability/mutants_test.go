package linearizability

import (
	"io/fs"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/scriptcache"
)

// A mutant is a one-line bug put into one of sluice's own Lua scripts, run
// by the real Go code of the primitive. The broken implementations show
// that the checker catches textbook races; the mutants show that it catches
// the kind of slip a change to the real scripts could make.
type mutant struct {
	script   string // NAME of NAME.lua
	old, new string // replaced once
}

var mutants = map[string]mutant{
	// The lock is taken even when another owner holds it.
	"mutex-takeover": {"mutex_lock", "if o and o ~= ARGV[2] then\n  return enqueue(redis.call('PTTL', KEYS[1]))\nend\n", ""},
	// One permit more than the capacity is granted.
	"semaphore-off-by-one": {"semaphore_acquire", "  return used + n <= stored\n", "  return used + n <= stored + 1\n"},
	// One request more than the limit is allowed per window.
	"fixed-window-off-by-one": {"ratelimit_fixed", "if count > limit then", "if count > limit + 1 then"},
}

// The mutants check the checker, not a client: they run once, here, on
// rueidis. A helper's cache loads the scripts with cfg.Mutant applied.
func init() {
	cacheOptions = func(t *testing.T, cfg config) []scriptcache.Option {
		if cfg.Mutant == "" {
			return nil
		}
		return []scriptcache.Option{scriptcache.WithFS(mutatedFS(t, cfg.Mutant))}
	}
}

// mutatedFS returns the scripts of package lua with mutant name applied. It
// fails t if the mutant no longer applies, so that a change to a script
// cannot silently turn a mutant into the real thing.
func mutatedFS(t *testing.T, name string) fs.FS {
	m, ok := mutants[name]
	if !ok {
		t.Fatalf("unknown mutant %q", name)
	}
	return redistest.MutatedScripts(t, m.script, m.old, m.new)
}

// TestMutantScriptsCaught runs the real primitives on mutated scripts and
// requires the checker to reject their histories.
func TestMutantScriptsCaught(t *testing.T) {
	s, helper := begin(t, newRueidisCache)
	if helper {
		return
	}
	sc := brokenScale
	n := sc.procs * sc.goroutines * sc.ops
	for _, tg := range targets {
		t.Run(tg.name+"/mutex-takeover", func(t *testing.T) {
			hists := s.runHelpers(t, config{Role: "mutex", Mutant: "mutex-takeover", Addrs: tg.addrs(t), Name: uniqueName(t)}, sc)
			wantIllegal(t, "lock", lockModel, hists[histLock], 2*n)
			wantIllegal(t, "counter", counterModel, hists[histCounter], n)
		})
		t.Run(tg.name+"/semaphore-off-by-one", func(t *testing.T) {
			hists := s.runHelpers(t, config{Role: "semaphore", Mutant: "semaphore-off-by-one", Addrs: tg.addrs(t), Name: uniqueName(t), Capacity: semCapacity}, sc)
			wantIllegal(t, "semaphore", semaphoreModel(semCapacity), hists[histSemaphore], 2*n)
		})
		t.Run(tg.name+"/fixed-window-off-by-one", func(t *testing.T) {
			hists := s.runHelpers(t, config{
				Role: "ratelimit", Mutant: "fixed-window-off-by-one", Addrs: tg.addrs(t), Name: uniqueName(t),
				Limit: brokenLimit, PeriodMs: limiterPeriod().Milliseconds(),
			}, sc)
			for _, s := range limiterSetups {
				if s.algo == ratelimit.FixedWindow {
					wantIllegal(t, s.hist, limiterModel(brokenLimit), hists[s.hist], n)
				} else {
					// The other algorithms run unmutated scripts.
					wantLinearizable(t, s.hist, limiterModel(brokenLimit), hists[s.hist], n)
				}
			}
		})
	}
}
