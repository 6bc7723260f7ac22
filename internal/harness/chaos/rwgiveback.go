package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluicekit/sluice/mutex"
)

// rwGiveBacks is giveBacks for the read-write lock, with someone waiting:
// node n abandons a Lock or an RLock attempt on an RWMutex of its own
// (lgw<i>) with a context of a third to all of the time the last attempt
// that won took (at most 3 ms), so that Redis often grants it after the
// client gave up, while another value of it, a writer (two in three) or a
// reader, asks for the lock a moment after the attempt was sent. When
// Redis granted the abandoned attempt, the waiter meets that hold, is
// refused, and sleeps on its lease; the give-back (rwmutex_abandon) must
// end exactly that hold and wake it: a write hold given back wakes
// writers and readers, a read hold the writers once no live reader is
// left. So the waiter must get the lock within a quarter lease of the
// attempt's end (of its release, when the attempt won and held), less
// this process's stalls, unless a fault of n's network or the server was
// in force (suspect).
func (w *world) rwGiveBacks(ctx context.Context, n *node, rng *rand.Rand) {
	name := fmt.Sprintf("lgw%d", n.i)
	// rtt: how long the last attempt that won took. A context of a part
	// of it ends while the attempt's reply is on its way, after Redis
	// granted it: what the give-back must undo.
	rtt := time.Millisecond
	for seq := 1; ctx.Err() == nil && !n.closed.Load(); seq++ {
		sleep(ctx, time.Duration(rng.Float64()*float64(w.cfg.Lease)/40))
		a, err := n.locks.NewRWMutex(name, mutex.WithOwner(fmt.Sprintf("n%dgw.%d", n.i, seq)))
		if err != nil {
			w.hist.violation("NewRWMutex: %v", err)
			return
		}
		b, err := n.locks.NewRWMutex(name, mutex.WithOwner(fmt.Sprintf("n%dgw.%d.b", n.i, seq)))
		if err != nil {
			w.hist.violation("NewRWMutex: %v", err)
			return
		}
		aWrite, bWrite := rng.IntN(2) == 0, rng.IntN(3) != 0
		abandonAfter := min(max(time.Duration((0.3+0.8*rng.Float64())*float64(rtt)), 100*time.Microsecond), 3*time.Millisecond)
		bAfter := time.Duration(rng.Float64() * float64(abandonAfter))
		w.count("lane.rwgiveback")

		type result struct {
			call, ret time.Time
			err       error
		}
		bDone := make(chan result, 1)
		go func() {
			sleep(ctx, bAfter)
			bctx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
			defer cancel()
			r := result{call: time.Now()}
			r.err = rwLock(b, bWrite).lock(bctx)
			r.ret = time.Now()
			bDone <- r
		}()

		actx, cancel := context.WithTimeout(ctx, abandonAfter)
		acall := time.Now()
		err = rwLock(a, aWrite).lock(actx)
		cancel()
		aEnd := time.Now()
		if err == nil {
			rtt = aEnd.Sub(acall)
			// It won: its release frees the lock (and wakes the waiter).
			w.releaseSure(ctx, rwLock(a, aWrite).unlock)
			aEnd = time.Now()
		} else {
			w.expected("an abandoned RWMutex attempt", acall, err, mutexErrs...)
		}
		br := <-bDone
		if br.err == nil {
			w.releaseSure(ctx, rwLock(b, bWrite).unlock)
		}
		if ctx.Err() != nil || n.closed.Load() {
			return
		}
		if br.err != nil && !errors.Is(br.err, mutex.ErrNotObtained) && !errors.Is(br.err, context.DeadlineExceeded) {
			w.expected("an RWMutex waiter behind an abandoned attempt", br.call, br.err, mutexErrs...)
			continue
		}
		if err != nil && br.ret.Sub(aEnd) > 0 && br.ret.Sub(br.call) > 2*time.Millisecond {
			w.count("lane.rwgiveback.waited." + kind(aWrite))
		}
		from := aEnd
		if br.call.After(from) {
			from = br.call
		}
		w.hist.mu.Lock()
		_, stalled := w.hist.stallsLocked(from, br.ret)
		w.hist.mu.Unlock()
		if waited := br.ret.Sub(from); br.err != nil || waited > w.cfg.Lease/4+stalled {
			w.suspect(from, br.ret, []int{n.i}, "", "give-back: a %s attempt on %q (%s) abandoned after %v (%v); a %s waiter of another value, called %v after it, got the lock %v after the attempt ended (bound %v less stalls of %v), nobody else using the lock and no fault in force: %v",
				kind(aWrite), name, a.Owner(), abandonAfter, err, kind(bWrite), br.call.Sub(acall).Round(time.Microsecond), waited.Round(time.Millisecond), w.cfg.Lease/4, stalled, br.err)
		}
	}
}

// kind names a side of a read-write lock.
func kind(write bool) string {
	if write {
		return "write"
	}
	return "read"
}

