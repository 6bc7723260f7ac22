package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestWatchdogStacks: the watchdog's dump keeps a goroutine blocked in
// this module's code and leaves out the runtime's and its own.
func TestWatchdogStacks(t *testing.T) {
	block, started := make(chan struct{}), make(chan struct{})
	go func() {
		close(started)
		<-block
	}()
	<-started
	d := watchRun(7, time.Hour)
	dump := string(redistest.ModuleStacks("chaos.watchRun"))
	d.done()
	close(block)
	if !strings.Contains(dump, "chaos.TestWatchdogStacks.func1") {
		t.Errorf("dump lacks the blocked goroutine:\n%s", dump)
	}
	if strings.Contains(dump, "watchRun") {
		t.Errorf("dump holds the watchdog's own goroutine:\n%s", dump)
	}
	for g := range strings.SplitSeq(strings.TrimSpace(dump), "\n\n") {
		if !strings.Contains(g, "github.com/sluicekit/sluice") {
			t.Errorf("dump holds a goroutine outside the module:\n%s", g)
		}
	}
}
