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
// attempt's end (of its release, when the attempt won and held; see
// giveBackFrom), less this process's stalls, unless a fault of n's
// network or the server was in force (suspect).
func (w *world) rwGiveBacks(ctx context.Context, n *node, rng *rand.Rand) {
	name := fmt.Sprintf("lgw%d", n.i)
	// rtt: how long the last attempt that won took. A context of a part
	// of it ends while the attempt's reply is on its way, after Redis
	// granted it: what the give-back must undo.
	rtt := time.Millisecond
	for seq := 1; ctx.Err() == nil && !n.closed.Load(); seq++ {
		sleep(ctx, time.Duration(rng.Float64()*float64(w.cfg.Lease)/40))
		name := freshName(name, seq)
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
		probe := func(ctx context.Context) error { _, err := a.Info(ctx); return err }
		ca := contender{kind(aWrite) + " attempt", a.Owner(), rwLock(a, aWrite).lock, rwLock(a, aWrite).unlock, probe}
		cb := contender{kind(bWrite), "", rwLock(b, bWrite).lock, rwLock(b, bWrite).unlock, probe}
		if !w.giveBackWaited(ctx, n, rng, name, "rwgiveback", ca, cb, &rtt) {
			return
		}
	}
}

// freshName is the resource of round seq of a give-back lane: every third
// round a name never used before (name.seq), so that the attempt given
// back is the grant that made the resource's keys (a new hash, a new run
// of write holds, a new record) and the give-back must undo what such a
// grant wrote, not only what a grant over earlier state writes.
func freshName(name string, seq int) string {
	if seq%3 == 0 {
		return fmt.Sprintf("%s.%d", name, seq)
	}
	return name
}

// A contender is one side of giveBackWaited: what it is, how it takes and
// gives back the resource, and a read of the resource (Info) that
// giveBackFrom times.
type contender struct {
	what, owner         string
	lock, unlock, probe func(context.Context) error
}

// giveBackWaited runs one round of rwGiveBacks (or giveBacksWaited): a
// abandons an attempt on name within its round trip (rtt, the last
// winning attempt's, which it updates), while b asks a moment after it
// was sent; b must get it within a quarter lease of a's end (giveBackFrom),
// less stalls (giveBackLate), unless a fault of n or the server excuses
// (suspect). It reports false when the run is over.
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
	var probed time.Time
	if err == nil {
		*rtt = aEnd.Sub(acall)
		// It won: its release frees the resource (and wakes the waiter).
		w.releaseSure(ctx, a.unlock)
		aEnd = time.Now()
	} else {
		w.expected("an abandoned attempt ("+tag+")", acall, err, append(mutexErrs, semErrs...)...)
		pctx, pcancel := context.WithTimeout(ctx, w.cfg.Lease)
		_ = a.probe(pctx) // only its time counts: a failure is a fault's, which suspect weighs
		pcancel()
		probed = time.Now()
	}
	br := <-bDone
	if br.err == nil {
		w.releaseSure(ctx, b.unlock)
	}
	if runOver(ctx) || n.closed.Load() {
		return false
	}
	if br.err != nil && !errors.Is(br.err, mutex.ErrNotObtained) && !errors.Is(br.err, semaphore.ErrNotObtained) && !errors.Is(br.err, context.DeadlineExceeded) {
		w.expected("a waiter behind an abandoned attempt ("+tag+")", br.call, br.err, append(mutexErrs, semErrs...)...)
		return true
	}
	if err != nil && br.ret.Sub(aEnd) > 0 && br.ret.Sub(br.call) > 2*time.Millisecond {
		w.count("lane." + tag + ".waited")
	}
	from := giveBackFrom(aEnd, br.call, probed)
	w.hist.mu.Lock()
	_, stalled := w.hist.stallsLocked(from, br.ret)
	w.hist.mu.Unlock()
	var readRTT time.Duration
	if !probed.IsZero() {
		readRTT = probed.Sub(aEnd)
	}
	if giveBackLate(br.ret.Sub(from), stalled, readRTT, w.cfg.Lease/4) {
		w.suspect(from, br.ret, []int{n.i}, "", "give-back: an abandoned %s on %q (%s), given up after %v (%v); a waiter (%s) of another value, called %v after it, got it %v after it was due (the attempt's end, its call, or a read sent after the attempt's end, back %v after it) (bound %v less stalls of %v and three of that read's round trips), nobody else using it and no fault in force: %v",
			a.what, name, a.owner, abandonAfter, err, b.what, br.call.Sub(acall).Round(time.Microsecond), br.ret.Sub(from).Round(time.Millisecond), readRTT.Round(time.Microsecond), w.cfg.Lease/4, stalled, br.err)
	}
	return true
}

// giveBackFrom is when the waiter of giveBackWaited is due from: the end
// of the abandoned attempt (of its release, when it won), or the
// waiter's call if that came later; and when the attempt failed, no
// earlier than the return of a read of the resource sent after it
// (probed; zero when none was). The give-back cannot come before the
// attempt's own reply (releaseLate and its kin act on it), and a server
// or a network that holds that reply up holds up the read behind it too:
// that time is Redis's latency, which this process's stalls do not
// count, not the library's. A library that keeps the waiter waiting
// (no give-back, no wake-up) still keeps it a lease, or a wake-up's
// period, past a read that returned.
func giveBackFrom(aEnd, bCall, probed time.Time) time.Time {
	from := aEnd
	for _, t := range []time.Time{bCall, probed} {
		if t.After(from) {
			from = t
		}
	}
	return from
}

// giveBackLate reports whether a waiter that waited from when it was due
// (giveBackFrom) until it got the resource, or gave up, broke the bound,
// given stalled of this process's stalls within that time and rtt, the
// round trip of the read giveBackFrom timed (zero when none was sent).
// From then the waiter may need three round trips that are Redis's
// latency, not the library's delay: the give-back's call, and its own
// subscription and attempt again (a waiter refused before the give-back
// that subscribes after it), each as slow as the read was. A waiter that
// gave up (its own deadline of a lease) before the bound, the stalls and
// those were over proves nothing, whatever its error: in a run stalled
// most of that lease, it had not yet waited the bound.
func giveBackLate(waited, stalled, rtt, bound time.Duration) bool {
	return waited > bound+stalled+3*rtt
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
		name := freshName(fmt.Sprintf("%s%d", []string{"lgm", "lgn", "lgs", "lgt"}[k], n.i), seq)
		if k < 2 {
			lk := []*mutex.Locker{n.locks, n.fair}[k]
			for j, c := range []*contender{&ca, &cb} {
				m, err := lk.NewMutex(name, mutex.WithOwner(fmt.Sprintf("n%dgm.%d.%d", n.i, seq, j)))
				if err != nil {
					w.hist.violation("NewMutex: %v", err)
					return
				}
				*c = contender{"Lock", m.Owner(), m.Lock, m.Unlock, func(ctx context.Context) error { _, err := m.Info(ctx); return err }}
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
				}, func(ctx context.Context) error { return p.Release(ctx) }, func(ctx context.Context) error { _, err := s.Info(ctx); return err }}
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
