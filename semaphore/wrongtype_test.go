package semaphore_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/semaphore"
)

// TestWatchdogBatchWrongTypeOnlyThosePermits overwrites, among 60 permits
// of 6 semaphores renewed in shared batches, one semaphore's permits hash
// and another one's expiry set with strings (an operator's SET, another
// program sharing the prefix): the permits of those two semaphores are
// reported lost, saying why, and only those; the others stay held and
// release. The lease leaves the renewals 510 ms of lateness, as in
// TestWatchdogBatchGoneOnlyThatPermit.
func TestWatchdogBatchWrongTypeOnlyThosePermits(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		ctx := context.Background()
		const watchdog, sems, perSem = 900 * time.Millisecond, 6, 10
		e := newEnv(t, addrs, semaphore.Options{WatchdogLease: watchdog})
		ss := make([]*semaphore.Semaphore, sems)
		for i, name := range batchNames("wrongtype:"+uniqueName(t)+":", sems, len(addrs) > 1) {
			ss[i] = e.sem(t, name, perSem)
		}
		ps := acquireEach(t, ss, perSem)
		defer releaseEach(ps)
		for i, suffix := range []string{"", ":e"} { // semaphore 0's permits hash, 1's expiry set
			key := keyspace.Key(semaphore.DefaultPrefix, ss[i].Name(), suffix)
			if err := e.client.Do(ctx, e.client.B().Set().Key(key).Value("not a semaphore").Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
		var victims []int
		for i := range 2 * perSem {
			victims = append(victims, i)
			waitLost(t, ps[i])
		}
		// The others were in the same batches; they must have been renewed
		// by them, and go on being renewed.
		time.Sleep(2 * watchdog) // nothing to wait for: asserting that nothing happens
		if lost := lostPermits(ps); !slices.Equal(lost, victims) {
			t.Fatalf("%d lost %v, want only %v; first: %v", len(lost), lost, victims, ps[lost[0]].Err())
		}
		for _, i := range victims {
			if err := ps[i].Err(); !errors.Is(err, semaphore.ErrLost) || !errors.Is(err, lease.ErrWrongType) || !strings.Contains(err.Error(), "another type") {
				t.Errorf("permit %d: Err() = %v, want ErrLost for a key of another type", i, err)
			}
		}
		for i, p := range ps {
			err := p.Release(ctx)
			switch {
			case i < 2*perSem:
				// Release still asks the server, which refuses the
				// overwritten permits hash (semaphore 0) with WRONGTYPE;
				// semaphore 1's hash, no longer renewed, has expired.
				if !errors.Is(err, semaphore.ErrNotHeld) && (err == nil || !strings.Contains(err.Error(), "WRONGTYPE")) {
					t.Errorf("Release of lost permit %d = %v, want ErrNotHeld or the server's WRONGTYPE", i, err)
				}
			case err != nil:
				t.Errorf("Release of held permit %d: %v", i, err)
			}
		}
	})
}
