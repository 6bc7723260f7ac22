package chaos

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// A runWatchdog ends a seed's run that has stopped making progress, with
// what a reader needs to find why, before go test's own timeout does.
// That timeout prints every goroutine of the process, the proxies' and the
// clients' by the thousand, and a CI log that keeps only its tail loses
// the few that matter (a run stuck past the package's ten minutes on CI,
// 2026-11-30, showed nothing but a rueidis reader). The watchdog prints
// the goroutines running this module's code, then panics with the seed,
// the phase the run was in and how long it had been there, so the tail of
// the log names them.
type runWatchdog struct {
	seed  uint64
	start time.Time
	phase atomic.Pointer[phaseMark]
	stop  chan struct{}
	wg    sync.WaitGroup
}

type phaseMark struct {
	name string
	at   time.Time
}

// watchRun starts a watchdog that fires once the run has taken limit.
// The caller sets phases with at and stops it with done.
func watchRun(seed uint64, limit time.Duration) *runWatchdog {
	d := &runWatchdog{seed: seed, start: time.Now(), stop: make(chan struct{})}
	d.at("setup")
	d.wg.Go(func() {
		t := time.NewTimer(limit)
		defer t.Stop()
		select {
		case <-d.stop:
		case <-t.C:
			d.fire(limit)
		}
	})
	return d
}

// at records that the run has entered phase name.
func (d *runWatchdog) at(name string) { d.phase.Store(&phaseMark{name, time.Now()}) }

func (d *runWatchdog) done() {
	close(d.stop)
	d.wg.Wait()
}

func (d *runWatchdog) fire(limit time.Duration) {
	p := d.phase.Load()
	fmt.Fprintf(os.Stderr, "chaos watchdog: seed %d has run %v (limit %v); the goroutines in this module's code:\n\n", d.seed, time.Since(d.start).Round(time.Millisecond), limit)
	os.Stderr.Write(redistest.ModuleStacks("chaos.watchRun"))
	panic(fmt.Sprintf("chaos: seed %d stuck: in phase %q for %v (the goroutines above)", d.seed, p.name, time.Since(p.at).Round(time.Millisecond)))
}
