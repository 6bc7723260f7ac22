package lease

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestLossCallbacksDoNotDelayNextDeadline: the scheduler runs the loss
// callbacks of the leases it found expired outside its lock, then arms its
// timer. Many leases expire together when Redis goes away (all their
// renewals fail at once), and each callback costs something (the mutex's
// takes its lock, reports to the Observer, logs, closes a channel). The
// time those callbacks take must not be added to the wait until the next
// deadline, which was measured before them: that lease would be declared
// lost that much later, and the callbacks here take longer than its margin.
func TestLossCallbacksDoNotDelayNextDeadline(t *testing.T) {
	k := NewKeeper()
	defer k.Close()

	const (
		ttl      = 20 * time.Second // Margin 1 s
		expiring = 5000             // leases lost together
		perLoss  = 150 * time.Microsecond
		gap      = time.Second // between their deadline and the watched one's
	)
	// Fixed leases (no renewal): only their deadlines matter. The first
	// group's deadline is 300 ms from now.
	now := time.Now()
	sentX := now.Add(-(ttl - Margin(ttl)) + 300*time.Millisecond)
	var calls atomic.Int64
	var callbacksStart, callbacksEnd atomic.Int64
	for range expiring {
		k.Add(sentX, ttl, nil, func(error) {
			callbacksStart.CompareAndSwap(0, time.Now().UnixNano())
			// Work, not blocking: 150 µs of CPU-bound wall time each.
			for start := time.Now(); time.Since(start) < perLoss; {
			}
			if calls.Add(1) == expiring {
				callbacksEnd.Store(time.Now().UnixNano())
			}
		})
	}
	// The watched lease: its deadline falls 1 s after theirs. Their
	// callbacks take at least 5,000 × 150 µs = 0.75 s (more on a loaded
	// machine), so the scheduler is free before or soon after it.
	sentY := sentX.Add(gap)
	rec := newLost()
	y := k.Add(sentY, ttl, nil, rec.fn)

	err := rec.wait(t)
	if err == nil {
		t.Fatal("watched lease lost with a nil error")
	}
	at := time.Unix(0, rec.at.Load())
	end := time.Unix(0, callbacksEnd.Load())
	if callbacksEnd.Load() == 0 {
		t.Fatal("the callbacks of the other leases did not all run before the watched lease's")
	}
	deadline := y.Deadline()
	// The earliest the scheduler can act: its deadline, or the end of the
	// callbacks it was busy with.
	earliest := deadline
	if end.After(earliest) {
		earliest = end
	}
	late := at.Sub(earliest)
	busy := end.Sub(time.Unix(0, callbacksStart.Load()))
	t.Logf("callbacks took %v and ran %v past the watched deadline; loss reported %v after the earliest possible moment",
		busy, end.Sub(deadline), late)
	// Waiting again for what the callbacks took makes late about
	// min(busy, gap) (the wait was measured from the first group's
	// deadline); reporting at once makes it scheduling jitter. Half of that
	// tells the two apart however slow a loaded machine makes the
	// callbacks. (Whether the loss still comes before the server's expiry
	// depends on how long the callbacks run, which no scheduler fixes: they
	// run on its goroutine.)
	if late > min(busy, gap)/2 {
		t.Errorf("loss reported %v after the scheduler was free to report it, with callbacks that took %v: the scheduler waited again for the time they took",
			late, busy)
	}
}
