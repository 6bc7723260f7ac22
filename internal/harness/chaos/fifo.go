package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// FIFO of the fair lanes, from the poller's views of their queues. Both
// ways: a waiter served out of order is a violation even if nobody held
// the lock twice, and so is a fair TryLock that jumps a queue.
//
// Fair Mutex (lf): "waiting Locks queue in Redis in arrival order, and a
// release hands the lock straight to the first live waiter"; "a fair
// TryLock fails while others wait". For every hold B of the lane and every
// waiter A whose live entry a view showed before B's Lock was called (A
// arrived first): if A got the lock too, its token is below B's (tokens
// grow with every grant, so they give the grant order); if A gave up
// (its context ended), B was granted only after A could have left, at
// its deadline. The documented exceptions: an entry not refreshed for a
// lease is dead and skipped (A's node cut off, this process stalled, A a
// mortal that crashed: its entry lives until a lease after its last
// refresh), and faults of the server.
//
// Fair semaphore (lfs): "weighted requests are served in queue order while
// the head fits. A head that does not fit does not stop lighter waiters
// behind it that do: they may pass it, but at most 16 times". B passed A
// when B was granted while A, queued before B's call (a view before it),
// was still queued (a view after B's grant shows A's entry, live). That is
// allowed only for B lighter than A (A did not fit where B did); and while
// A headed the queue in both views, at most 16 times.
func (w *world) checkFIFO() {
	w.checkFairMutex()
	w.checkFairSemaphore()
	for _, res := range []string{laneFair, laneFSem, lanePass, laneLongFair} {
		w.checkQueueOrder(res)
	}
}

// checkQueueOrder checks the queue itself, as Redis keeps it, where the
// checks above look only at who got the lock or permits first: an entry
// keeps its place until it leaves the queue (granted, given up, dead), and
// a waiter joins at the end. So two entries live in two views keep their
// order: A before B in one view and B before A in a later one means that
// one of them left and came back, which a live waiter's entry does only if
// it died meanwhile (entryExcusedLocked: not refreshed for a lease, the
// waiter's network or this process stalled), or if the server lost the
// queue (a server-wide fault) or an operator removed it. A script that
// drops other waiters' entries (a queue deleted while it still holds
// some) sends them to the back in whatever order they come back: their
// grants may still come in an order the checks above allow, this one
// sees the reordering.
func (w *world) checkQueueOrder(res string) {
	views := w.ln.poll.views(res)
	byOwner, _ := w.laneWaits()
	h := w.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	type pair struct{ a, b string } // a < b
	type seen struct {
		aFirst bool
		view   int // the first view that showed both live
		last   int // the last one that showed them in that order
	}
	first := map[pair]seen{}
	flagged := map[pair]bool{}
	for i, v := range views {
		live := v.liveQueue()
		for x := range live {
			for y := x + 1; y < len(live); y++ {
				ex, ey := live[x], live[y]
				p, aFirst := pair{ex.id, ey.id}, true
				if ey.id < ex.id {
					p, aFirst = pair{ey.id, ex.id}, false
				}
				was, ok := first[p]
				if !ok {
					first[p] = seen{aFirst, i, i}
					continue
				}
				if was.aFirst == aFirst {
					was.last = i
					first[p] = was
					continue
				}
				if flagged[p] {
					continue
				}
				// ey was ahead of ex in view was.view.
				s := views[was.view]
				wx, wy := byOwner[ex.owner], byOwner[ey.owner]
				if wx == nil || wy == nil || w.entryExcusedLocked(wx, s.call, v.ret) || w.entryExcusedLocked(wy, s.call, v.ret) ||
					h.serverWideLocked(s.call, v.ret) || h.operatorBetweenLocked(res, s.call, v.ret) ||
					mayHaveExpired(views[was.last], ex.id, v.now) || mayHaveExpired(views[was.last], ey.id, v.now) {
					first[p] = seen{aFirst, i, i} // the order from here on
					continue
				}
				flagged[p] = true
				h.violationLocked("queue order: in %q, %s (entry %s) was ahead of %s (entry %s) at %s, and behind it at %s, both live: a live entry keeps its place",
					res, ey.owner, ey.id, ex.owner, ex.id, h.since(views[was.last].at()), h.since(v.at()))
			}
		}
	}
}

// mayHaveExpired reports whether entry id, with the expiry view v (the
// last to show it in its old place) gave it, may have died by the server
// time now: then it may have been dropped and come back at the tail,
// whatever the stall and fault records say (a refresh late for reasons
// they do not see). A refresh after v only moves the expiry later.
func mayHaveExpired(v snap, id string, now int64) bool {
	for _, e := range v.queue {
		if e.id == id {
			return e.expiry <= now
		}
	}
	return true // not shown (past the first 32): nothing known
}

// passBound is how many grants may pass a fair semaphore's blocked head.
const passBound = 16

// fifoSlack allows for the round trip between a hold's grant and the
// return the harness sees.
const fifoSlack = 50 * time.Millisecond

// entryExcused reports whether waiter a's queue entry may have died (not
// refreshed for a lease) or the queue lost (a server fault) in [from, to].
// The lease is a's own: a mortal's Locker has a quarter of the run's, so
// its entry dies after a quarter of the time. Called with h.mu held.
func (w *world) entryExcusedLocked(a *laneWait, from, to time.Time) bool {
	h := w.hist
	lease := w.leaseOfWaiter(a)
	if h.renewalsHitLocked(from.Add(-lease), to, a.node) {
		return true
	}
	if _, st := h.stallsLocked(from.Add(-lease), to); st > lease/3 {
		return true
	}
	return false
}

// crashedEntryRanOut reports whether a crashed waiter's entry id may have
// been found dead before t by the server's own record: the last view
// returned before t that shows the entry gives it an expiry that, counted
// from that view's call, comes before t. A refresh after that view could
// only have moved it later, and a script drops an entry only once it has
// expired. A crashed waiter's refreshes end at the crash, but the last of
// them can come late for reasons the stall and fault records do not see
// (a slow round trip on a loaded machine: soak seed ...788, cluster, a
// mortal with a quarter of the run's lease); the expiry on the server is
// what the scripts act on. Only for a crashed waiter: for a live one a
// short expiry is itself what the oracle must catch (a script that dates
// entries wrongly). A view that does not show the entry proves nothing
// (it may be past the view's first 32, or gone wrongly): the search goes
// on back.
func crashedEntryRanOut(a *laneWait, views []snap, id string, t time.Time) bool {
	if a.cut.IsZero() {
		return false
	}
	for i := searchSnaps(views, t) - 1; i >= 0; i-- {
		v := views[i]
		if !v.ret.Before(t) {
			continue
		}
		for _, f := range v.queue {
			if f.id == id {
				return v.call.Add(time.Duration(f.expiry-v.now) * time.Millisecond).Before(t)
			}
		}
	}
	return false
}

func queuedBefore(views []snap, t time.Time) ([]entry, snap, bool) {
	i := searchSnaps(views, t)
	for i--; i >= 0; i-- {
		if views[i].ret.Before(t) {
			return views[i].liveQueue(), views[i], true
		}
	}
	return nil, snap{}, false
}

func (w *world) laneWaits() (map[string]*laneWait, []*laneWait) {
	w.ln.mu.Lock()
	defer w.ln.mu.Unlock()
	return w.ln.byOwner, slices.Clone(w.ln.waits)
}

func (w *world) checkFairMutex() {
	views := w.ln.poll.views(laneFair)
	byOwner, waits := w.laneWaits()
	h := w.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, b := range waits {
		if b.res != laneFair || b.x == nil {
			continue
		}
		queued, s, ok := queuedBefore(views, b.call)
		if !ok {
			continue
		}
		for _, e := range queued {
			a := byOwner[e.owner]
			if a == nil || a == b || a.call.After(s.call) {
				continue
			}
			if a.x != nil && a.x.token > b.x.token {
				if w.entryExcusedLocked(a, s.call, b.x.start) || h.serverWideLocked(s.call, b.x.start) || crashedEntryRanOut(a, views, e.id, b.x.start) {
					continue
				}
				h.violationLocked("fair order: %s got %q (hold #%d, token %d, called %s) before %s (hold #%d, token %d), whose entry was queued at %s, before that call\n%s",
					b.owner, laneFair, b.x.id, b.x.token, h.since(b.call), a.owner, a.x.id, a.x.token, h.since(s.at()),
					entryTrail(h, views, e.id, s.call, b.x.start.Add(fifoSlack)))
				h.noteInvolvedLocked(a.x, b.x)
				continue
			}
			if a.x != nil {
				continue
			}
			// A gave up: it left the queue once its context ended, or
			// its entry died a lease after its last refresh (a crash).
			var left time.Time
			switch {
			case !a.cut.IsZero() && !a.ret.Before(a.cut):
				// Still waiting at the crash: its entry lives on. (One
				// that returned before it had left already, as below.)
				left = a.cut.Add(w.leaseOfWaiter(a)*2/3 - fifoSlack)
			case errors.Is(a.err, context.DeadlineExceeded):
				left = a.deadline
			default:
				continue // another error: it may have left any time
			}
			if b.x.start.Before(left.Add(-fifoSlack)) {
				if w.entryExcusedLocked(a, s.call, b.x.start) || h.serverWideLocked(s.call, b.x.start) || crashedEntryRanOut(a, views, e.id, b.x.start) {
					continue
				}
				h.violationLocked("fair order: %s got %q (hold #%d, called %s, granted by %s) while %s, queued at %s before that call, still waited (it left at %s)\n%s",
					b.owner, laneFair, b.x.id, h.since(b.call), h.since(b.x.start), a.owner, h.since(s.at()), h.since(left),
					entryTrail(h, views, e.id, s.call, b.x.start.Add(fifoSlack)))
				h.noteInvolvedLocked(b.x)
			}
		}
	}
}

func (w *world) checkFairSemaphore() {
	for _, res := range []string{laneFSem, lanePass} {
		w.checkFairSemaphoreOf(res)
	}
}

func (w *world) checkFairSemaphoreOf(res string) {
	views := w.ln.poll.views(res)
	byOwner, waits := w.laneWaits()
	h := w.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	passes := map[string]map[string]bool{} // A's owner -> the Bs that passed it while it headed the queue
	for _, b := range waits {
		if b.res != res || b.x == nil {
			continue
		}
		queued, s, ok := queuedBefore(views, b.call)
		if !ok {
			continue
		}
		// The first view called after B's grant returned.
		j := searchSnaps(views, b.x.start)
		if j >= len(views) {
			continue
		}
		after := views[j]
		for k, e := range queued {
			a := byOwner[e.owner]
			if a == nil || a == b {
				continue
			}
			still := slices.ContainsFunc(after.queue, func(f entry) bool { return f.id == e.id && after.live(f) })
			if !still {
				continue
			}
			if w.entryExcusedLocked(a, s.call, after.ret) || h.serverWideLocked(s.call, after.ret) {
				continue
			}
			if b.weight >= a.weight {
				h.violationLocked("fair order: %s (weight %d) got permits of %q (hold #%d, called %s, granted by %s) while %s (weight %d), queued at %s before that call, still waited at %s: only a lighter waiter may pass",
					b.owner, b.weight, res, b.x.id, h.since(b.call), h.since(b.x.start), a.owner, a.weight, h.since(s.at()), h.since(after.at()))
				h.noteInvolvedLocked(b.x)
				continue
			}
			if head, ok := after.head(); k == 0 && ok && head.id == e.id {
				if passes[a.owner] == nil {
					passes[a.owner] = map[string]bool{}
				}
				passes[a.owner][b.owner] = true
			}
		}
	}
	for a, bs := range passes {
		if len(bs) > passBound {
			h.violationLocked("fair order: %d lighter waiters passed %s (weight %d) while it headed the queue of %q, more than %d",
				len(bs), a, byOwner[a].weight, res, passBound)
		}
	}
	w.cfg.Logf("%s: %s", res, passSummary(passes))
}

func passSummary(passes map[string]map[string]bool) string {
	most, who := 0, ""
	for a, bs := range passes {
		if len(bs) > most {
			most, who = len(bs), a
		}
	}
	return fmt.Sprintf("fair semaphore: %d blocked heads passed, most passes %d (%s)", len(passes), most, who)
}

// entryTrail lists what the views taken from from to to show of the queue
// entry id and of the lock (its holder and token), for a fair-order
// report: whether the entry was there, where, and how long it still had
// to live by the server's clock. At most 24 views, the last ones.
func entryTrail(h *history, views []snap, id string, from, to time.Time) string {
	i, j := searchSnaps(views, from), searchSnaps(views, to)
	i = max(i, j-24)
	var b strings.Builder
	for _, v := range views[i:j] {
		fmt.Fprintf(&b, "      view %s: holder %q token %d, %d queued", h.since(v.at()), v.owner, v.token, len(v.queue))
		k := slices.IndexFunc(v.queue, func(f entry) bool { return f.id == id })
		if k < 0 {
			b.WriteString(", the entry absent\n")
			continue
		}
		fmt.Fprintf(&b, ", the entry #%d, %d ms to live\n", k+1, v.queue[k].expiry-v.now)
	}
	return strings.TrimSuffix(b.String(), "\n")
}
