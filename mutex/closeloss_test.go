package mutex_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// TestCloseTellsHoldersErrClosed: Close tells every holder, and the error
// it tells (Err, Do's) wraps both ErrLost and ErrClosed, as the Locker's
// doc says and as a Permit's does, so that a caller can tell a shutdown
// from a lock taken away. Before, a Mutex's and an RWMutex's Err wrapped
// only ErrLost (with the lease keeper's own "closed" inside).
func TestCloseTellsHoldersErrClosed(t *testing.T) {
	ctx := context.Background()
	l := newLocker(t, redistest.Client(t, redistest.Single(t).Addr()), mutex.Options{})
	m := newMutex(t, l, "closeloss-m")
	w := newRW(t, l, "closeloss-w")
	r := newRW(t, l, "closeloss-r")
	mm := newMulti(t, l, []string{"closeloss-a", "closeloss-b"})
	for name, lock := range map[string]func(context.Context) error{"Mutex": m.Lock, "RWMutex write": w.Lock, "RWMutex read": r.RLock, "MultiMutex": mm.Lock} {
		if err := lock(ctx); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	l.Close()
	for name, h := range map[string]interface {
		Lost() <-chan struct{}
		Err() error
	}{"Mutex": m, "RWMutex write": w, "RWMutex read": r, "MultiMutex": mm} {
		select {
		case <-h.Lost():
		default:
			t.Errorf("%s: Lost not closed by Close", name)
		}
		if err := h.Err(); !errors.Is(err, mutex.ErrLost) || !errors.Is(err, mutex.ErrClosed) {
			t.Errorf("%s: Err = %v, want it to wrap ErrLost and ErrClosed", name, err)
		}
	}
}
