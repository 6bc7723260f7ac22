package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/semaphore"
)

// A mortal is a client of its own, with its own Locker and Manager, that
// takes part in one lane and then crashes: its connections are closed at
// once, so nothing it sends afterwards reaches Redis, as if its process
// had been killed. What it held or queued is left to the server: a lock
// or permit runs to the end of its lease, a fair queue entry dies a lease
// after its last refresh, a waiting writer's mark ends within its length.
// Then the waiters must be served (anytime.go), the fair queues must keep
// their order around the dead entry (fifo.go), and readers must get in
// once a dead writer's mark has ended. The Locker and Manager are closed
// after the crash, and must return within Close's bound with their client
// gone.

// mortalLease is the watchdog lease of a mortal's Locker and Manager: a
// quarter of the run's, so that what a crash leaves behind (a lock, a
// queue entry, a mark) keeps the lane's waiters out for a short while.
func (w *world) mortalLease() time.Duration { return w.cfg.Lease / 4 }

// leaseOfWaiter is the lease wt's acquisition and its fair queue entry
// live by: its fixed lease (WithLease, or a mortal's Locker's watchdog
// lease), else the run's watchdog lease. A fair waiter's entry lives one
// lease and is refreshed every third of it (at most every second), so a
// waiter with a short fixed lease loses its entry to a shorter stall.
func (w *world) leaseOfWaiter(wt *laneWait) time.Duration {
	if wt.lease > 0 {
		return wt.lease
	}
	return w.cfg.Lease
}

// mortals runs one mortal after another, about one every half lease, for
// node n's share of them.
func (w *world) mortals(ctx context.Context, n *node, rng *rand.Rand) {
	seq := 0
	for ctx.Err() == nil && !n.closed.Load() {
		sleep(ctx, time.Duration((0.25+0.5*rng.Float64())*float64(w.cfg.Lease)))
		if ctx.Err() != nil {
			return
		}
		seq++
		w.mortal(ctx, rng, fmt.Sprintf("m%d.%d", n.i, seq))
	}
}

// A mortalPart is what a mortal does in its lane: acquire (blocking, as
// long as ctx allows) and, if it got it, what to record.
type mortalPart struct {
	wt      *laneWait
	acquire func(context.Context) error
	holds   func() []*hold // after a successful acquire
}

func (w *world) mortal(ctx context.Context, rng *rand.Rand, id string) {
	sc, closeClient, err := w.cfg.Client(ctx, w.addrs(), w.cl != nil)
	if err != nil {
		// Not the library's promise: the client's own dial and script load
		// (rueidis's dial timeout), which a loaded machine can miss on
		// loopback (seen on the cluster: dial i/o timeout with no fault,
		// other harness runs beside it). The mortal simply does not come.
		w.count("lane.mortal.noclient")
		return
	}
	w.count("lane.mortal")
	ml := w.mortalLease()
	locks, err := mutex.NewLocker(sc, mutex.Options{WatchdogLease: ml})
	if err != nil {
		w.hist.violation("NewLocker: %v", err)
		closeClient()
		return
	}
	// A writer's mark lasts min(lease, 2 s): a crashed writer's the
	// run's full lease, so that it outlives live writers' holds and
	// releases (their release wakes no reader while a mark runs).
	rwLocks, _ := mutex.NewLocker(sc, mutex.Options{WatchdogLease: w.cfg.Lease})
	fair, _ := mutex.NewLocker(sc, mutex.Options{WatchdogLease: ml, Fair: true})
	sems, _ := semaphore.NewManager(sc, semaphore.Options{WatchdogLease: ml})
	fairSems, _ := semaphore.NewManager(sc, semaphore.Options{WatchdogLease: ml, Fair: true})
	part := w.mortalPart(rng, id, locks, rwLocks, fair, sems, fairSems)

	type result struct{ xs []*hold }
	done := make(chan result, 1)
	w.count("lane." + part.wt.prim)
	go func() {
		err := w.acquireLane(ctx, part.wt, 2*w.cfg.Lease, part.acquire)
		var xs []*hold
		if err == nil {
			xs = part.holds()
			for _, x := range xs {
				x.expect = "its client crashed"
				w.hist.begin(x)
			}
			part.wt.x = xs[0]
		}
		done <- result{xs}
	}()
	// Crash while it waits, or a while after it got what it wanted.
	var r result
	got := false
	select {
	case r = <-done:
		got = true
		sleep(ctx, w.laneHold(rng))
	case <-time.After(time.Duration((0.01 + 0.3*rng.Float64()) * float64(w.cfg.Lease))):
	}
	closeClient()
	cut := time.Now()
	part.wt.cut = cut
	closeAt := time.Now()
	for _, c := range []func(){locks.Close, rwLocks.Close, fair.Close, sems.Close, fairSems.Close} {
		c()
	}
	// Less the process's longest stall meanwhile: Close cannot return
	// while the process does not run (see history.end).
	if took, st := time.Since(closeAt), w.hist.longestStall(closeAt, time.Now()); took-st > closeBound {
		w.hist.violation("Close of a crashed mortal's Lockers and Managers took %v, bound %v and the process's longest stall then (%v)", took.Round(time.Millisecond), closeBound, st.Round(time.Millisecond))
	}
	if !got {
		r = <-done
	}
	w.ln.add(part.wt)
	for _, x := range r.xs {
		// Close told it (Lost); the server keeps it to its lease's end.
		w.hist.releasing(x, time.Now())
		w.hist.end(x, true, "its client crashed at "+w.hist.since(cut))
	}
}

// mortalPart draws what the mortal does: hold or wait for a plain or a
// fair Mutex, a writer or a reader of the read-write lane, a MultiMutex, a
// permit of the plain or the fair semaphore.
func (w *world) mortalPart(rng *rand.Rand, id string, locks, rwLocks, fair *mutex.Locker, sems, fairSems *semaphore.Manager) mortalPart {
	wt := &laneWait{owner: id, node: -1, weight: 1, lease: w.mortalLease()}
	mutexPart := func(l *mutex.Locker, res, prim, note string) mortalPart {
		m, _ := l.NewMutex(res, mutex.WithOwner(id))
		wt.prim, wt.res = prim, res
		return mortalPart{wt: wt, acquire: m.Lock, holds: func() []*hold {
			return []*hold{{kind: "mutex", res: res, owner: id, node: -1, weight: 1, token: m.Token(), note: note,
				call: wt.call, start: wt.ret, lostCh: m.Lost()}}
		}}
	}
	switch rng.IntN(8) {
	case 0:
		return mutexPart(locks, laneMutex, "mutex", "plain lane, mortal")
	case 1, 2:
		return mutexPart(fair, laneFair, "fair", "fair lane, mortal")
	case 3, 4:
		// Mostly writers: one that waits behind readers leaves a mark.
		write := rng.IntN(3) > 0
		rw, _ := rwLocks.NewRWMutex(laneRW, mutex.WithOwner(id))
		wt.lease = w.cfg.Lease
		kind, acquire := "read", rw.RLock
		if write {
			kind, acquire = "write", rw.Lock
		}
		wt.prim, wt.res = kind, laneRW
		return mortalPart{wt: wt, acquire: acquire, holds: func() []*hold {
			return []*hold{{kind: kind, res: laneRW, owner: id, node: -1, weight: 1, token: rw.Token(), note: "lane, mortal",
				call: wt.call, start: wt.ret, lostCh: rw.Lost()}}
		}}
	case 5:
		mm, _ := locks.NewMultiMutex(laneMulti[:2], mutex.WithOwner(id))
		names := mm.Names()
		wt.prim, wt.res, wt.names = "multi", names[0], names
		return mortalPart{wt: wt, acquire: mm.Lock, holds: func() []*hold {
			var xs []*hold
			for i, name := range names {
				xs = append(xs, &hold{kind: "set", res: name, set: names, owner: id, node: -1, weight: 1, token: mm.Tokens()[i],
					note: "lane, mortal", call: wt.call, start: wt.ret, lostCh: mm.Lost()})
			}
			return xs
		}}
	}
	fairSem := rng.IntN(2) == 0
	mgr, res, prim, note := sems, lanePSem, "permit", "plain lane, mortal"
	if fairSem {
		mgr, res, prim, note = fairSems, laneFSem, "fairpermit", "fair lane, mortal"
	}
	wt.prim, wt.res, wt.weight = prim, res, 1+rng.Int64N(laneCap)
	s, _ := mgr.NewSemaphore(res, laneCap, semaphore.WithOwner(id))
	var p *semaphore.Permit
	return mortalPart{wt: wt, acquire: func(ctx context.Context) error {
		var err error
		p, err = s.Acquire(ctx, wt.weight)
		return err
	}, holds: func() []*hold {
		return []*hold{{kind: "permit", res: res, owner: p.ID(), node: -1, weight: wt.weight, note: note,
			call: wt.call, start: wt.ret, lostCh: p.Lost()}}
	}}
}
