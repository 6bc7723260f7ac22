package semaphore_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// goroutinesIn returns the stacks of the goroutines that have frame in
// them.
func goroutinesIn(frame string) []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, frame) {
			continue
		}
		// The header and the sluice frames are enough to tell what it is.
		lines := strings.Split(g, "\n")
		keep := []string{lines[0]}
		for i := 1; i+1 < len(lines); i += 2 {
			if strings.Contains(lines[i], "sluice") {
				keep = append(keep, lines[i], lines[i+1])
			}
		}
		out = append(out, strings.Join(keep, "\n"))
	}
	return out
}

// TestCloseWaitsForAbandonedCalls: Manager.Close stops and waits for every
// goroutine it started (README). An Acquire abandoned by its context while
// its script call is unanswered (a server that hangs) leaves a goroutine
// that waits for the late reply to release the grant. Close must end that
// call and wait for the goroutine; before the scriptcache.Group, it
// outlived Close and then called Redis for a closed Manager.
func TestCloseWaitsForAbandonedCalls(t *testing.T) {
	srv := redistest.NewServer(t)
	e := newEnv(t, []string{srv.Addr()}, semaphore.Options{})
	name := uniqueName(t)
	s := e.sem(t, name, 1)
	wantAvailable(t, s, 1) // the connection is up and the scripts loaded

	const frame = "sluice/scriptcache.(*Script).ExecOrLate"
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resume := srv.Resumer(t)
	defer resume()

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := s.Acquire(ctx, 1)
	cancel()
	if !errors.Is(err, semaphore.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire on a hung server = %v, want ErrNotObtained wrapping DeadlineExceeded", err)
	}
	e.mgr.Close()
	left := goroutinesIn(frame)

	// Let the late reply come, and the goroutine end, before judging, so
	// that the package's goleak check is not tripped by this test.
	resume()
	if !redistest.WaitFor(context.Background(), signalWait, func() bool { return len(goroutinesIn(frame)) == 0 }) {
		t.Errorf("late-reply goroutine still running %v after the server resumed", signalWait)
	}
	if len(left) > 0 {
		t.Fatalf("%d goroutine(s) of an abandoned Acquire still running after Manager.Close returned:\n%s",
			len(left), strings.Join(left, "\n\n"))
	}
}
