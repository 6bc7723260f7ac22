package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluicekit/sluice/mutex"
)

// Takeovers (WithOwner): "a Lock after a loss, or by a new process taking
// over with the same owner id (WithOwner), gets a new token even while the
// server still keeps the old hold, and the old holder is told it lost the
// lock at its next renewal". A Mutex A of one node holds the lane lock lt
// with an owner id; a Mutex B of another node (or of the same Locker:
// another value) locks it with the same id. Checked:
//
//   - B's Lock is granted at once (the owner holds it) with a token larger
//     than A's;
//   - A is owed a loss from B's grant on: it must be told within the
//     watchdog's reach and by the time it ends (history.end);
//   - A's Unlock, after the takeover, does not return nil, and leaves B's
//     hold alone: the lane's other contenders (takeContender, with owner
//     ids of their own) must not get in while B holds, which the exclusion
//     rule checks as for any hold.
func (w *world) takeovers(ctx context.Context, rng *rand.Rand) {
	seq := 0
	for ctx.Err() == nil {
		sleep(ctx, time.Duration((0.2+0.4*rng.Float64())*float64(w.cfg.Lease)))
		open := w.openNodes()
		if len(open) == 0 || ctx.Err() != nil {
			return
		}
		seq++
		a, b := open[rng.IntN(len(open))], open[rng.IntN(len(open))]
		w.takeover(ctx, rng, a, b, fmt.Sprintf("T%d", seq))
	}
}

func (w *world) takeover(ctx context.Context, rng *rand.Rand, a, b *node, id string) {
	w.takeoverOf(ctx, rng, a, b, id, laneTake)
}

// takeLock makes node n's lock of a takeover lane with owner id: a Mutex
// of lt, or the write side of an RWMutex of lwt. It returns the lock, its
// token, and the kind of its holds.
func (w *world) takeLock(n *node, res, id string) (laneLock, func() int64, string, error) {
	if res == laneRWTake {
		rw, err := n.locks.NewRWMutex(res, mutex.WithOwner(id))
		if err != nil {
			return laneLock{}, nil, "", err
		}
		return rwLock(rw, true), rw.Token, "write", nil
	}
	m, err := n.locks.NewMutex(res, mutex.WithOwner(id))
	if err != nil {
		return laneLock{}, nil, "", err
	}
	return mutexLock(m), m.Token, "mutex", nil
}

// takeoverOf is takeover on res: lt (Mutexes) or lwt (RWMutex writers).
func (w *world) takeoverOf(ctx context.Context, rng *rand.Rand, a, b *node, id, res string) {
	la, tokA, kind, err := w.takeLock(a, res, id)
	if err != nil {
		w.hist.violation("takeover lock: %v", err)
		return
	}
	wa := &laneWait{prim: kind, res: res, owner: id, node: a.i, weight: 1}
	xa := w.lockLane(ctx, a, rng, wa, la, kind, "takeover, first", func() []int64 { return []int64{tokA()} })
	if xa == nil {
		return
	}
	sleep(ctx, time.Duration((0.05+0.2*rng.Float64())*float64(w.cfg.Lease)))
	lb, tokB, _, err := w.takeLock(b, res, id)
	if err != nil {
		w.hist.violation("takeover lock: %v", err)
		return
	}
	w.count("lane.takeover")
	bctx, cancel := context.WithTimeout(ctx, w.cfg.Lease/2)
	call := time.Now()
	err = lb.lock(bctx)
	cancel()
	ret := time.Now()
	if err != nil {
		w.expected("takeover Lock", call, err, mutexErrs...)
		if res == laneRWTake {
			// Refused, it set a writer's mark (markSpans).
			w.ln.mu.Lock()
			w.ln.markers = append(w.ln.markers, &laneWait{prim: kind, res: res, owner: id, node: b.i, weight: 1, call: call, ret: ret, err: err})
			w.ln.mu.Unlock()
		}
		// The Lock may have been granted late (superseding A) and given
		// back: A's loss is then the workload's own.
		w.hist.mu.Lock()
		xa[0].expect = "its owner id's takeover Lock failed (" + err.Error() + "): granted and given back, maybe"
		w.hist.mu.Unlock()
		if errors.Is(err, mutex.ErrNotObtained) && ctx.Err() == nil && !closed(la.lost()) && !w.owedOf(xa[0]) {
			w.suspect(call, ret, []int{a.i, b.i}, res, "takeover: a Lock of %q with owner id %s, which hold #%d held, was refused (%v)", res, id, xa[0].id, err)
		}
		w.releaseLane(a, xa, la, true)
		return
	}
	xb := &hold{kind: kind, res: res, owner: id, node: b.i, weight: 1, token: tokB(), note: "takeover, second",
		call: call, start: ret, lostCh: lb.lost()}
	w.hist.begin(xb)
	w.hist.takenOver(xa[0], xb)
	w.ln.add(&laneWait{prim: kind, res: res, owner: id, node: b.i, weight: 1, call: call, ret: ret, x: xb})
	if xb.token <= xa[0].token {
		w.hist.violation("takeover: hold #%d of %q by owner id %s on node %d got token %d, not above the token %d of the hold #%d it took over",
			xb.id, res, id, b.i, xb.token, xa[0].token, xa[0].id)
	}
	// A goes on until it is told, then unlocks: that must not release B.
	select {
	case <-la.lost():
	case <-time.After(w.hist.prompt):
	case <-ctx.Done():
	}
	knew := la.err() != nil
	at := time.Now()
	w.hist.releasing(xa[0], at)
	rctx, rcancel := w.releaseCtx()
	err = la.unlock(rctx)
	rcancel()
	w.hist.end(xa[0], knew || err != nil, "Unlock after the takeover: "+fmt.Sprint(err))
	if err == nil {
		w.hist.violation("takeover: the Unlock of hold #%d of %q, taken over by hold #%d with its owner id, returned nil at %s",
			xa[0].id, res, xb.id, w.hist.since(at))
	}
	lse := leaseOf{from: call, upto: ret, watchdog: w.cfg.Lease}
	w.holdLane(ctx, rng, []*hold{xb}, lb, &lse, w.laneHold(rng), nil)
	w.releaseLane(b, []*hold{xb}, lb, true)
}

// rwTakeovers is takeovers on lwt, more often: RWMutex write holds taken
// over with their owner id ("WithOwner and WithLease work as for
// NewMutex"); tag keeps the owner ids of two of them apart.
func (w *world) rwTakeovers(ctx context.Context, rng *rand.Rand, tag string) {
	for seq := 1; ctx.Err() == nil; seq++ {
		sleep(ctx, time.Duration((0.05+0.15*rng.Float64())*float64(w.cfg.Lease)))
		open := w.openNodes()
		if len(open) == 0 || ctx.Err() != nil {
			return
		}
		a, b := open[rng.IntN(len(open))], open[rng.IntN(len(open))]
		w.count("lane.rwtakeover")
		w.takeoverOf(ctx, rng, a, b, fmt.Sprintf("W%s.%d", tag, seq), laneRWTake)
	}
}

// rwTakeContender contends for lwt with owner ids of its own: a write
// hold or a read hold (half of the time each) on the watchdog's lease.
func (w *world) rwTakeContender(ctx context.Context, n *node, rng *rand.Rand, id string) {
	rw, err := n.locks.NewRWMutex(laneRWTake, mutex.WithOwner(id))
	if err != nil {
		w.hist.violation("NewRWMutex: %v", err)
		return
	}
	write := rng.IntN(2) == 0
	kind := "read"
	if write {
		kind = "write"
	}
	wt := &laneWait{prim: kind, res: laneRWTake, owner: id, node: n.i, weight: 1}
	l := rwLock(rw, write)
	xs := w.lockLane(ctx, n, rng, wt, l, kind, "takeover contender", func() []int64 { return []int64{rw.Token()} })
	if xs == nil {
		return
	}
	lse := leaseOf{from: wt.call, upto: wt.ret, watchdog: w.cfg.Lease}
	w.holdLane(ctx, rng, xs, l, &lse, w.laneHold(rng), nil)
	w.releaseLane(n, xs, l, true)
}

// takenOver records that hold b, of the owner id of hold a, took a over:
// a is owed a loss from b's start.
func (h *history) takenOver(a, b *hold) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !a.ended && !a.owed {
		a.owed, a.owedWhy, a.owedAt = true, fmt.Sprintf("taken over by hold #%d with its owner id", b.id), b.start
	}
}
