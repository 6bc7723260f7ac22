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
	ma, err := a.locks.NewMutex(laneTake, mutex.WithOwner(id))
	if err != nil {
		w.hist.violation("NewMutex: %v", err)
		return
	}
	wa := &laneWait{prim: "mutex", res: laneTake, owner: id, node: a.i, weight: 1}
	la := mutexLock(ma)
	xa := w.lockLane(ctx, a, rng, wa, la, "mutex", "takeover, first", func() []int64 { return []int64{ma.Token()} })
	if xa == nil {
		return
	}
	sleep(ctx, time.Duration((0.05+0.2*rng.Float64())*float64(w.cfg.Lease)))
	mb, err := b.locks.NewMutex(laneTake, mutex.WithOwner(id))
	if err != nil {
		w.hist.violation("NewMutex: %v", err)
		return
	}
	w.count("lane.takeover")
	bctx, cancel := context.WithTimeout(ctx, w.cfg.Lease/2)
	call := time.Now()
	err = mb.Lock(bctx)
	cancel()
	ret := time.Now()
	if err != nil {
		w.expected("takeover Lock", call, err, mutexErrs...)
		if errors.Is(err, mutex.ErrNotObtained) && ctx.Err() == nil && !closed(ma.Lost()) && !w.owedOf(xa[0]) {
			w.suspect(call, ret, []int{a.i, b.i}, laneTake, "takeover: a Lock of %q with owner id %s, which hold #%d held, was refused (%v)", laneTake, id, xa[0].id, err)
		}
		w.releaseLane(a, xa, la, true)
		return
	}
	xb := &hold{kind: "mutex", res: laneTake, owner: id, node: b.i, weight: 1, token: mb.Token(), note: "takeover, second",
		call: call, start: ret, lostCh: mb.Lost()}
	w.hist.begin(xb)
	w.hist.takenOver(xa[0], xb)
	w.ln.add(&laneWait{prim: "mutex", res: laneTake, owner: id, node: b.i, weight: 1, call: call, ret: ret, x: xb})
	if xb.token <= xa[0].token {
		w.hist.violation("takeover: hold #%d of %q by owner id %s on node %d got token %d, not above the token %d of the hold #%d it took over",
			xb.id, laneTake, id, b.i, xb.token, xa[0].token, xa[0].id)
	}
	// A goes on until it is told, then unlocks: that must not release B.
	select {
	case <-ma.Lost():
	case <-time.After(w.hist.prompt):
	case <-ctx.Done():
	}
	knew := ma.Err() != nil
	at := time.Now()
	w.hist.releasing(xa[0], at)
	rctx, rcancel := w.releaseCtx()
	err = ma.Unlock(rctx)
	rcancel()
	w.hist.end(xa[0], knew || err != nil, "Unlock after the takeover: "+fmt.Sprint(err))
	if err == nil {
		w.hist.violation("takeover: the Unlock of hold #%d of %q, taken over by hold #%d with its owner id, returned nil at %s",
			xa[0].id, laneTake, xb.id, w.hist.since(at))
	}
	lb := mutexLock(mb)
	lse := leaseOf{from: call, upto: ret, watchdog: w.cfg.Lease}
	w.holdLane(ctx, rng, []*hold{xb}, lb, &lse, w.laneHold(rng), nil)
	w.releaseLane(b, []*hold{xb}, lb, true)
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
