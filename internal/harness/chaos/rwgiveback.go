package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/semaphore"
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
		ca := contender{kind(aWrite) + " attempt", a.Owner(), rwLock(a, aWrite).lock, rwLock(a, aWrite).unlock}
		cb := contender{kind(bWrite), "", rwLock(b, bWrite).lock, rwLock(b, bWrite).unlock}
		if !w.giveBackWaited(ctx, n, rng, name, "rwgiveback", ca, cb, &rtt) {
			return
		}
	}
}

// A contender is one side of giveBackWaited: what it is, and how it takes
// and gives back the resource.
type contender struct {
	what, owner  string
	lock, unlock func(context.Context) error
}

// giveBackWaited runs one round of rwGiveBacks (or giveBacksWaited): a
// abandons an attempt on name within its round trip (rtt, the last
// winning attempt's, which it updates), while b asks a moment after it
// was sent; b must get it within a quarter lease of a's end, less stalls,
// unless a fault of n or the server excuses (suspect). It reports false
// when the run is over.
func (w *world) giveBackWaited(ctx context.Context, n *node, rng *rand.Rand, name, tag string, a, b contender, rtt *time.Duration) bool {
	abandonAfter := min(max(time.Duration((0.3+0.8*rng.Float64())*float64(*rtt)), 100*time.Microsecond), 3*time.Millisecond)
	bAfter := time.Duration(rng.Float64() * float64(abandonAfter))
	w.count("lane." + tag)

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
		r.err = b.lock(bctx)
		r.ret = time.Now()
		bDone <- r
	}()

	actx, cancel := context.WithTimeout(ctx, abandonAfter)
	acall := time.Now()
	err := a.lock(actx)
	cancel()
	aEnd := time.Now()
	if err == nil {
		*rtt = aEnd.Sub(acall)
		// It won: its release frees the resource (and wakes the waiter).
		w.releaseSure(ctx, a.unlock)
		aEnd = time.Now()
	} else {
		w.expected("an abandoned attempt ("+tag+")", acall, err, append(mutexErrs, semErrs...)...)
	}
	br := <-bDone
	if br.err == nil {
		w.releaseSure(ctx, b.unlock)
	}
	if ctx.Err() != nil || n.closed.Load() {
		return false
	}
	if br.err != nil && !errors.Is(br.err, mutex.ErrNotObtained) && !errors.Is(br.err, semaphore.ErrNotObtained) && !errors.Is(br.err, context.DeadlineExceeded) {
		w.expected("a waiter behind an abandoned attempt ("+tag+")", br.call, br.err, append(mutexErrs, semErrs...)...)
		return true
	}
	if err != nil && br.ret.Sub(aEnd) > 0 && br.ret.Sub(br.call) > 2*time.Millisecond {
		w.count("lane." + tag + ".waited")
	}
	from := aEnd
	if br.call.After(from) {
		from = br.call
	}
	w.hist.mu.Lock()
	_, stalled := w.hist.stallsLocked(from, br.ret)
	w.hist.mu.Unlock()
	if waited := br.ret.Sub(from); br.err != nil || waited > w.cfg.Lease/4+stalled {
		w.suspect(from, br.ret, []int{n.i}, "", "give-back: an abandoned %s on %q (%s), given up after %v (%v); a waiter (%s) of another value, called %v after it, got it %v after the attempt ended (bound %v less stalls of %v), nobody else using it and no fault in force: %v",
			a.what, name, a.owner, abandonAfter, err, b.what, br.call.Sub(acall).Round(time.Microsecond), br.ret.Sub(from).Round(time.Millisecond), w.cfg.Lease/4, stalled, br.err)
	}
	return true
}

// giveBacksWaited is rwGiveBacks for the other primitives: node n
// abandons a Lock of a plain (lgm<i>) or fair (lgn<i>) Mutex, or an
// Acquire of a plain (lgs<i>) or fair (lgt<i>) semaphore of capacity 1, of
// its own, within its round trip, while another value asks a moment after
// it was sent: the give-back (mutex_release's "a", semaphore_release's)
// must free what a grant it came too late for took, and wake the waiter,
// or hand it the lock or permit (a fair queue's head).
func (w *world) giveBacksWaited(ctx context.Context, n *node, rng *rand.Rand) {
	var rtt [4]time.Duration
	for i := range rtt {
		rtt[i] = time.Millisecond
	}
	for seq := 1; ctx.Err() == nil && !n.closed.Load(); seq++ {
		sleep(ctx, time.Duration(rng.Float64()*float64(w.cfg.Lease)/40))
		k := rng.IntN(4)
		var ca, cb contender
		name := fmt.Sprintf("%s%d", []string{"lgm", "lgn", "lgs", "lgt"}[k], n.i)
		if k < 2 {
			lk := []*mutex.Locker{n.locks, n.fair}[k]
			for j, c := range []*contender{&ca, &cb} {
				m, err := lk.NewMutex(name, mutex.WithOwner(fmt.Sprintf("n%dgm.%d.%d", n.i, seq, j)))
				if err != nil {
					w.hist.violation("NewMutex: %v", err)
					return
				}
				*c = contender{"Lock", m.Owner(), m.Lock, m.Unlock}
			}
		} else {
			mgr := []*semaphore.Manager{n.sems, n.fairSems}[k-2]
			for _, c := range []*contender{&ca, &cb} {
				s, err := mgr.NewSemaphore(name, 1)
				if err != nil {
					w.hist.violation("NewSemaphore: %v", err)
					return
				}
				var p *semaphore.Permit
				*c = contender{"Acquire", "", func(ctx context.Context) error {
					var err error
					p, err = s.Acquire(ctx, 1)
					return err
				}, func(ctx context.Context) error { return p.Release(ctx) }}
			}
		}
		ca.what += " attempt"
		if !w.giveBackWaited(ctx, n, rng, name, "giveback."+name[:3], ca, cb, &rtt[k]) {
			return
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
