package chaos

import (
	"time"
)

// Writers are not starved: "a Lock that finds the lock taken (by readers
// or another writer) leaves a writer-waiting mark in Redis that lasts
// min(lease, 2 s) and renews it on each of its attempts, at least every
// third of that. While any waiting writer's mark runs, new readers are
// refused". A lock held by readers is therefore not busy for a writer
// forever: readers already in drain, new ones wait, and the writer is
// due once they are gone (anytime.go checks that it is then served).
//
// Checked here, the other side: no new reader is let in while a writer
// waits. A read hold B of the lane (an outermost RLock or TryRLock, not
// a downgrade) whose call came after a writer W had called Lock and
// whose grant came before W's Lock returned is a violation if a view
// between W's call and B's call showed a live mark (W's attempt was
// refused and marked) and W kept its mark alive: no fault of W's network
// or the server, no stall of this process of a third of the mark, and
// for a mortal writer, the mark was renewed until its crash (it lives
// two thirds of its length after that at least).
func (w *world) checkWriterPreference() {
	views := w.ln.poll.views(laneRW)
	_, waits := w.laneWaits()
	var writers []*laneWait
	for _, wt := range waits {
		if wt.res == laneRW && wt.prim == "write" && !wt.try {
			writers = append(writers, wt)
		}
	}
	h := w.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, b := range waits {
		if b.res != laneRW || b.prim != "read" || b.x == nil {
			continue
		}
		for _, wr := range writers {
			until := wr.end()
			mark := min(w.leaseOfWaiter(wr), 2*time.Second)
			if !wr.cut.IsZero() {
				until = minTime(until, wr.cut.Add(mark*2/3-fifoSlack))
			}
			if !wr.call.Add(fifoSlack).Before(b.call) || !b.x.start.Before(until.Add(-fifoSlack)) {
				continue
			}
			marked := false
			for _, s := range between(views, wr.call, b.call) {
				if s.ret.Before(b.call) && s.mark > s.now {
					marked = true
					break
				}
			}
			if !marked {
				continue
			}
			from := wr.call.Add(-w.cfg.Lease)
			if h.renewalsHitLocked(from, b.x.start, wr.node) {
				continue // a fault of the writer's network or the server
			}
			if st, _ := h.stallsLocked(wr.call, b.x.start); st > mark/3 || !wr.cut.IsZero() && st > mark/6 {
				continue
			}
			h.violationLocked("writer preference: reader %s got a read hold of %q (hold #%d, called %s, granted by %s) while writer %s (node %d), refused and marked (a view showed the mark), waited from %s until %s",
				b.owner, laneRW, b.x.id, h.since(b.call), h.since(b.x.start), wr.owner, wr.node, h.since(wr.call), h.since(until))
			h.noteInvolvedLocked(b.x)
			break
		}
	}
}
