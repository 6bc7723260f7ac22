package mutex_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/mutex"
)

// A key overwritten with another type of value (an operator's SET, another
// program sharing the prefix) makes every Redis command on it fail with
// WRONGTYPE. In a batched renewal that answers for its own hold only: the
// others of the batch are renewed, not lost with it.

// wrongTyped is the loss a renewal reports for a hold whose key holds
// another type of value.
func wrongTyped(err error) bool {
	return errors.Is(err, mutex.ErrLost) && errors.Is(err, lease.ErrWrongType) && strings.Contains(err.Error(), "another type")
}

// TestWatchdogBatchWrongTypeOnlyThatLock overwrites one lock's key, among
// 50 locks renewed in shared batches, with a string: the watchdog reports
// that lock lost, saying why, and only that one; the others stay held and
// unlock. The lease leaves the renewals 510 ms of lateness, as in
// TestWatchdogBatchGoneOnlyThatLock.
func TestWatchdogBatchWrongTypeOnlyThatLock(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			ctx := context.Background()
			client := clientFor(t, tg)
			const watchdog, victim = 900 * time.Millisecond, 25
			l := newLocker(t, client, mutex.Options{WatchdogLease: watchdog})
			ms := lockAll(t, l, heldNames("wrongtype:"+t.Name()+":", 50, tg.name == "cluster"))
			defer unlockAll(ms)
			if err := client.Do(ctx, client.B().Set().Key(lockKey(ms[victim].Name())).Value("not a lock").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-ms[victim].Lost():
			case <-time.After(signal):
				t.Fatal("the overwritten lock was not reported lost")
			}
			// The others were in the same batches; they must have been
			// renewed by them, and go on being renewed.
			time.Sleep(2 * watchdog) // nothing to wait for: asserting that nothing happens
			if lost := lostOf(ms); !slices.Equal(lost, []int{victim}) {
				t.Fatalf("%d lost %v, want only [%d]; first: %v", len(lost), lost, victim, ms[lost[0]].Err())
			}
			if err := ms[victim].Err(); !wrongTyped(err) {
				t.Fatalf("Err() = %v, want ErrLost for a key of another type", err)
			}
			for i, m := range ms {
				err := m.Unlock(ctx)
				switch {
				case i == victim:
					if !errors.Is(err, mutex.ErrNotHeld) || !wrongTyped(err) {
						t.Errorf("Unlock of the overwritten lock = %v, want ErrNotHeld with its loss", err)
					}
				case err != nil:
					t.Errorf("Unlock of %s: %v", m.Name(), err)
				}
			}
		})
	}
}
