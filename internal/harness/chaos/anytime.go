package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/sluicekit/sluice/mutex"
)

// Liveness at any time of the run: a lane waiter must be served within a
// bound once Redis shows that it is due, whatever made it due: an Unlock,
// an RUnlock, a Release, a give-back of an abandoned attempt, a lease that
// ran out (a hold left to expire, a crashed client's), a lease shortened
// by Extend, a writer's mark that ended (a crashed writer's), a fair
// queue's dead head. The poller's views (poll.go) say what the server
// holds; a waiter is due in a view when
//
//   - a Mutex (plain) or a Mutex of one MultiMutex member: nobody holds it;
//   - a MultiMutex: each of its names is free or held by the set itself;
//   - a fair Mutex: nobody holds it and the queue's first live entry is
//     the waiter's (or the queue has none);
//   - a reader: no writer holds it and no writer's mark runs;
//   - a writer: no writer and no live reader holds it;
//   - a plain semaphore: the live permits leave room for its weight;
//   - a fair semaphore: they do, and its entry heads the queue (or none
//     does).
//
// A run of consecutive views (none more than pollGap apart) in which the
// waiter was due, less the spells in which some conflicting hold of the
// workload was in progress (a hold granted and released between two
// views), is how long the waiter went unserved. Over the bound, less the
// time this process stalled in it, it is a violation unless a fault that
// could touch the waiter (its node's network, the server, an operator on
// the resource) was in force then. The bound is a quarter lease (a wake-up
// and an attempt); a third of a lease more where the library finds the
// change by polling, as documented: a writer waiting for readers whose
// leases run out, a fair semaphore's permits that expired, a fair lock
// whose holder's lease ran out under a queue.
func (w *world) dueBound(prim string) time.Duration {
	b := w.cfg.Lease / 4
	switch prim {
	case "write", "fair", "fairpermit":
		b += w.cfg.Lease / 3
	}
	return b
}

// due reports whether wt is due in view s (views holds the other views of
// s's round, by resource, for a MultiMutex), and the state for a report.
func due(wt *laneWait, s snap, views map[string]snap) (bool, string) {
	switch wt.prim {
	case "mutex":
		return s.owner == "", "free"
	case "multi":
		var st []string
		for _, name := range wt.names {
			v, ok := views[name]
			if !ok || v.owner != "" && v.owner != wt.owner {
				return false, ""
			}
			st = append(st, fmt.Sprintf("%s held by %q", name, v.owner))
		}
		return true, strings.Join(st, ", ")
	case "fair":
		if s.owner != "" {
			return false, ""
		}
		if h, ok := s.head(); ok {
			return h.owner == wt.owner, fmt.Sprintf("free, queue %s", queueText(s))
		}
		return true, fmt.Sprintf("free, queue %s", queueText(s))
	case "read":
		return s.owner == "" && s.mark <= s.now, fmt.Sprintf("no writer, mark ended %d ms before", s.now-s.mark)
	case "write":
		return s.owner == "" && s.readers == 0, "no writer, no reader"
	case "permit":
		c := laneCapacity(wt.res)
		return s.used+wt.weight <= c, fmt.Sprintf("%d of %d used", s.used, c)
	case "fairpermit":
		c := laneCapacity(wt.res)
		if s.used+wt.weight > c {
			return false, ""
		}
		text := fmt.Sprintf("%d of %d used, queue %s", s.used, c, queueText(s))
		if h, ok := s.head(); ok {
			return h.owner == wt.owner, text
		}
		return true, text
	}
	return false, ""
}

func queueText(s snap) string {
	var q []string
	for _, e := range s.queue {
		live := ""
		if !s.live(e) {
			live = " (dead)"
		}
		q = append(q, fmt.Sprintf("%s w%d%s", e.owner, e.weight, live))
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// conflicts reports whether hold o keeps waiter wt out.
func conflicts(wt *laneWait, o *hold) bool {
	if o.owner == wt.owner {
		return false
	}
	switch wt.prim {
	case "read":
		return o.kind == "write"
	case "write":
		return o.kind == "write" || o.kind == "read"
	case "permit", "fairpermit":
		return o.kind == "permit"
	}
	return o.kind == "mutex" || o.kind == "set"
}

// checkAnytime checks every blocking lane acquisition against the views.
func (w *world) checkAnytime() {
	ls := w.ln
	ls.mu.Lock()
	waits := slices.Clone(ls.waits)
	ls.mu.Unlock()
	h := w.hist
	h.mu.Lock()
	byRes := map[string][]*hold{}
	for _, x := range h.done {
		byRes[x.res] = append(byRes[x.res], x)
	}
	h.mu.Unlock()
	views := map[string][]snap{}
	rounds := map[string]map[int]snap{}
	for res := range laneResources() {
		views[res] = ls.poll.views(res)
		m := map[int]snap{}
		for _, s := range views[res] {
			m[s.round] = s
		}
		rounds[res] = m
	}
	ls.mu.Lock()
	markers := slices.Clone(ls.markers)
	ls.mu.Unlock()
	marks := w.markSpans(append(markers, waits...))
	for _, wt := range waits {
		if wt.try {
			continue
		}
		var holds []*hold
		for _, res := range wt.resources() {
			for _, o := range byRes[res] {
				if conflicts(wt, o) {
					holds = append(holds, o)
				}
			}
		}
		w.checkWaitDue(wt, views[wt.res], rounds, holds, marks[wt.res])
	}
}

// markLimit is the longest a writer's mark runs: min(lease, 2 s) (the
// RWMutex doc, "Writers are not starved").
const markLimit = 2 * time.Second

// A span is a stretch of time.
type span struct{ from, to time.Time }

// markSpans returns, by resource, when a writer's mark could run: from a
// write acquisition's call to its grant (a grant takes its mark out) or,
// for one that gave up, a quarter lease past its return (the give-back
// withdraws it); a mark long past (markLimit) if its writer crashed, or if
// a fault of its node or the server came near (the withdrawal may not
// have reached Redis). A reader that a view shows refused only by a mark
// that no writer could have set then is due (stranded by a mark that
// outlived its writer's wait).
func (w *world) markSpans(waits []*laneWait) map[string][]span {
	h := w.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string][]span{}
	for _, wt := range waits {
		if wt.prim != "write" {
			continue
		}
		end := wt.end()
		switch {
		case wt.node < 0:
			end = maxTime(end, wt.cut).Add(markLimit)
		case wt.x == nil && h.renewalsHitLocked(wt.call, wt.ret.Add(w.cfg.Lease/4), wt.node):
			end = end.Add(markLimit)
		case wt.x == nil:
			end = end.Add(w.cfg.Lease / 4)
		}
		out[wt.res] = append(out[wt.res], span{wt.call, end})
	}
	return out
}

// markJustified reports whether a writer's mark seen in a view taken in
// [call, ret] may be one a writer set: some mark span overlaps the
// markLimit before ret.
func markJustified(spans []span, call, ret time.Time) bool {
	for _, m := range spans {
		if !m.from.After(ret) && !m.to.Before(call.Add(-markLimit/8)) {
			return true
		}
	}
	return false
}

// resources are the names wt waits for.
func (wt *laneWait) resources() []string {
	if wt.names != nil {
		return wt.names
	}
	return []string{wt.res}
}

func (w *world) checkWaitDue(wt *laneWait, views []snap, rounds map[string]map[int]snap, holds []*hold, marks []span) {
	end := wt.end()
	if !wt.cut.IsZero() && wt.cut.Before(end) {
		end = wt.cut // a dead waiter is due nothing
	}
	var run []snap
	var state string
	flush := func() {
		if len(run) > 0 {
			w.judgeRun(wt, run, state, holds)
		}
		run = nil
	}
	for _, s := range between(views, wt.call, end) {
		if s.ret.After(end) {
			break
		}
		if len(run) > 0 && s.call.Sub(run[len(run)-1].ret) > pollGap {
			flush()
		}
		var others map[string]snap
		if wt.names != nil {
			others = map[string]snap{}
			for _, name := range wt.names {
				if v, ok := rounds[name][s.round]; ok {
					others[name] = v
				}
			}
		}
		ok, st := due(wt, s, others)
		switch {
		case ok || wt.prim != "read" || s.owner != "" || s.mark <= s.now:
		case s.ownMark >= 0 && s.ownMark < s.mark:
			// A grant or a withdrawal brings the mark back to the
			// latest one a waiting writer still keeps (rwmutex_lock,
			// rwmutex_abandon): past them all, nobody waits for it.
			ok, st = true, fmt.Sprintf("no writer; a mark to %d ms later, past every waiting writer's own (%d ms later)", s.mark-s.now, max(s.ownMark-s.now, 0))
		case !markJustified(marks, s.call, s.ret):
			ok, st = true, fmt.Sprintf("no writer; a mark to %d ms later that no writer waiting could have set", s.mark-s.now)
		}
		if !ok {
			flush()
			continue
		}
		if len(run) == 0 {
			state = st
		}
		run = append(run, s)
	}
	flush()
}

// judgeRun decides a run of views (consecutive, in order) in which wt was
// due. A run that a release of the workload began (its hold ended cleanly
// just before the first view) is held to the wake-up's bound, a quarter
// lease, whatever the primitive: a release wakes its waiters, and only
// what frees a resource without a release waits for a poll.
//
// A hold in progress excuses the time it spans only if no view of the run
// saw it (a view called after its grant returned and returning before its
// release was called): such a hold, granted and released between two
// views, may have kept the waiter out unseen. One that a view saw was
// counted in that view, which still showed the waiter due: a semaphore's
// permits that leave room for the waiter do not keep it out (a fair
// waiter whose weight fits exactly, left waiting, was excused by the
// other holders' permits, seen or not).
func (w *world) judgeRun(wt *laneWait, run []snap, state string, holds []*hold) {
	first, last := run[0], run[len(run)-1]
	bound := w.dueBound(wt.prim)
	if w.releasedJustBefore(wt, holds, first) || w.forcedJustBefore(wt, first) {
		bound = w.cfg.Lease / 4
	}
	from, to := first.ret, last.call
	if to.Sub(from) <= bound {
		return
	}
	// The longest spell of the run with no conflicting hold in progress.
	var busy []span
	for _, o := range holds {
		if o.start.Before(to) && o.end.After(from) && !seenBy(run, o) {
			busy = append(busy, span{maxTime(o.start, from), minTime(o.end, to)})
		}
	}
	slices.SortFunc(busy, func(a, b span) int { return a.from.Compare(b.from) })
	a, b := from, from
	cur := from
	for _, s := range append(busy, span{to, to}) {
		if s.from.Sub(cur) > b.Sub(a) {
			a, b = cur, s.from
		}
		cur = maxTime(cur, s.to)
	}
	if b.Sub(a) <= bound {
		return
	}
	h := w.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, f := range h.faults {
		if f.from.After(b) || f.to.Before(a.Add(-w.cfg.Lease/4)) {
			continue
		}
		if f.what == "forceunlock" && !forceDeletes(f.res) {
			// A lock's ForceUnlock "wakes the waiters" (a semaphore's is
			// a DEL, which wakes nobody): it explains its holders'
			// losses, not a waiter left asleep on a free lock.
			continue
		}
		if f.res == "" && (f.node < 0 || f.node == wt.node) || slices.Contains(wt.resources(), f.res) {
			return
		}
	}
	if _, st := h.stallsLocked(a, b); b.Sub(a)-st <= bound {
		h.excused = append(h.excused, fmt.Sprintf("%s waiter %s on %q: due for %v, of which the process stalled %v",
			wt.prim, wt.owner, wt.res, b.Sub(a).Round(time.Millisecond), st.Round(time.Millisecond)))
		return
	}
	got := "gave up (" + errText(wt.err) + ")"
	if wt.x != nil {
		got = "got it"
	}
	h.violationLocked("liveness: %s waiter %s (node %d) on %q, waiting from %s, was due from %s to %s (%v, bound %v; Redis: %s) with no hold in progress and no fault in force; it %s at %s",
		wt.prim, wt.owner, wt.node, wt.res, h.since(wt.call), h.since(a), h.since(b), b.Sub(a).Round(time.Millisecond), bound, state, got, h.since(wt.end()))
	var near []*hold
	for _, o := range holds {
		if o.end.After(a.Add(-w.cfg.Lease)) && o.start.Before(b) {
			near = append(near, o)
		}
	}
	h.noteInvolvedLocked(near[max(0, len(near)-4):]...)
}

// releasedJustBefore reports whether one of holds ended with a release
// that returned nil in the poll before view s, and no hold that began
// before s ended otherwise after it: a fair Unlock hands the lock on, and
// when the new holder's lease then runs out, it is the expiry that frees
// the lock, found by polling (seen: a hand-off at 13.219 s, the new hold
// left to expire at 13.320 s, the view free at 13.343 s).
//
// A hand-off may also go to a waiter that is no hold of the history: a
// crashed client's queue entry (a mortal's), still live, gets the lock
// for what is left of the entry's lease, and the end of that lease frees
// the lock with no message. The package documents this ("a waiter granted
// the lock that died before it knew stalls the queue no longer than that
// grant's lease plus one recheck"): the next waiter is woken by its
// Locker's refresh of its entry, within the polling bound. So where the
// views show the lock's record (a Mutex, fair or plain), a release freed
// the lock only if the view still shows the released hold's token: a grant
// after the release writes its own, and a grant whose lease ran out takes
// the record with it (seen on go-redis: a release at 2.267 s, the lock
// free at 2.334 s with the next waiter at the queue's head, woken by the
// refresh at 2.931 s, 597 ms on, judged against the wake-up's 500 ms).
// A release that frees the lock and wakes nobody still leaves its own
// token in the record, and is held to the wake-up's bound.
func (w *world) releasedJustBefore(wt *laneWait, holds []*hold, s snap) bool {
	h := w.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, o := range holds {
		if o.told || o.expect != "" || o.end.After(s.ret) || !o.end.After(s.call.Add(-pollGap-fifoSlack)) {
			continue
		}
		if slices.ContainsFunc(holds, func(x *hold) bool {
			return (x.told || x.expect != "") && x.start.Before(s.ret) && x.end.After(o.end)
		}) {
			continue
		}
		if recordShown(wt) && o.res == wt.res && o.token != 0 && o.token != s.token {
			continue
		}
		return true
	}
	return false
}

// forcedJustBefore reports whether an operator's ForceUnlock of wt's lock
// was done in the poll before view s. A ForceUnlock "wakes the waiters"
// (the writers and the readers of an RWMutex), so a waiter due from s on
// is held to the wake-up's bound, as after a release, even a writer that
// would otherwise find its readers gone by polling.
func (w *world) forcedJustBefore(wt *laneWait, s snap) bool {
	h := w.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, o := range h.ops {
		if o.what == "ForceUnlock" && o.res == wt.res && !forceDeletes(o.res) && !o.end.IsZero() &&
			o.end.After(s.call.Add(-pollGap-fifoSlack)) && !o.end.After(s.ret) {
			return true
		}
	}
	return false
}

// recordShown reports whether the views of wt's resource show a lock
// record's token (pollMutex).
func recordShown(wt *laneWait) bool {
	switch wt.prim {
	case "mutex", "fair":
		return true
	}
	return false
}

// checkGiveBacks: an acquisition that failed (its context ended, a Try
// answered too late, a connection error) holds nothing afterwards: "a Lock
// attempt abandoned that way, or cut off by a connection error, is given
// back at once", a fair waiter that gives up "gives back a grant that
// reached it meanwhile", and a MultiMutex whose Lock fails "holds none of
// the names it took". Once a quarter lease has passed since it returned,
// no view may show the lock held by its owner id, unless a fault of its
// node's network or the server could have delayed the attempt past its
// give-back ("an attempt delayed past its tombstone can still grant, and
// that grant ends with its lease").
func (w *world) checkGiveBacks() {
	_, waits := w.laneWaits()
	bound := w.cfg.Lease / 4
	h := w.hist
	for _, wt := range waits {
		if wt.x != nil || !wt.cut.IsZero() || wt.node < 0 {
			continue
		}
		switch wt.prim {
		case "mutex", "fair", "multi", "write":
		default:
			continue
		}
		h.mu.Lock()
		faulted := h.renewalsHitLocked(wt.call.Add(-w.cfg.Lease), wt.ret.Add(w.cfg.Lease), wt.node)
		h.mu.Unlock()
		if faulted {
			continue
		}
		for _, res := range wt.resources() {
			for _, s := range between(w.ln.poll.views(res), wt.ret.Add(bound), wt.ret.Add(w.cfg.Lease)) {
				if s.owner != wt.owner {
					continue
				}
				h.mu.Lock()
				if _, st := h.stallsLocked(wt.ret, s.ret); s.call.Sub(wt.ret)-st > bound {
					h.violationLocked("give-back: a %s of %q by %s (node %d) failed at %s (%s), but Redis showed %q held by it at %s, with no fault in force",
						wt.prim, wt.res, wt.owner, wt.node, h.since(wt.ret), errText(wt.err), res, h.since(s.call))
				}
				h.mu.Unlock()
				break
			}
		}
	}
}

// giveBacks makes node n abandon Lock attempts on a lock of its own (lg<i>,
// plain, and lgf<i>, fair), with contexts of a fraction of a millisecond
// to three: most end while the attempt is on its way, and the attempt is
// given back whether Redis granted it or not. A quarter lease later a
// TryLock of another Mutex must get the lock (the give-back ended the
// grant, and a fair attempt's queue entry), unless a fault of n's network
// or the server was in force.
func (w *world) giveBacks(ctx context.Context, n *node, rng *rand.Rand) {
	for seq := 1; ctx.Err() == nil && !n.closed.Load(); seq++ {
		sleep(ctx, time.Duration(rng.Float64()*float64(w.cfg.Lease)/40))
		lk, name := n.locks, fmt.Sprintf("lg%d", n.i)
		if seq%2 == 0 {
			lk, name = n.fair, fmt.Sprintf("lgf%d", n.i)
		}
		m, err := lk.NewMutex(name, mutex.WithOwner(fmt.Sprintf("n%dg.%d", n.i, seq)))
		if err != nil {
			w.hist.violation("NewMutex: %v", err)
			return
		}
		w.count("lane.giveback")
		actx, cancel := context.WithTimeout(ctx, time.Duration((0.2+2.8*rng.Float64())*float64(time.Millisecond)))
		call := time.Now()
		err = m.Lock(actx)
		cancel()
		if err == nil {
			w.unlockSure(ctx, m) // its own lock
			continue
		}
		w.expected("an abandoned Lock", call, err, mutexErrs...)
		abandoned := err
		sleep(ctx, w.cfg.Lease/4)
		if ctx.Err() != nil {
			return
		}
		t, err := lk.NewMutex(name)
		if err != nil {
			w.hist.violation("NewMutex: %v", err)
			return
		}
		tctx, tcancel := context.WithTimeout(ctx, w.cfg.Lease/4)
		tcall := time.Now()
		err = t.TryLock(tctx)
		tcancel()
		if err == nil {
			w.unlockSure(ctx, t)
			continue
		}
		// A refusal is Redis's answer; a TryLock whose context ended
		// first (mutex: not obtained: context deadline exceeded, seen
		// under load with no fault) got none, and tells nothing of the
		// give-back.
		if errors.Is(err, mutex.ErrNotObtained) && !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			w.suspect(call, time.Now(), []int{n.i}, "", "give-back: a Lock of %q (%s) abandoned at %s (%v); a TryLock of it %v later, with nobody else using it and no fault in force, was refused: %v",
				name, m.Owner(), w.hist.since(call), abandoned, tcall.Sub(call).Round(time.Millisecond), err)
		}
	}
}

// seenBy reports whether some view of run was taken while hold o was
// certainly held in Redis: called after its grant returned, returned
// before its release was called.
func seenBy(run []snap, o *hold) bool {
	i := searchSnaps(run, o.start)
	return i < len(run) && !o.end.IsZero() && !run[i].ret.After(o.end)
}

// unlockSure unlocks m, again while Unlock fails with the outcome unknown:
// a Mutex whose Unlock failed still counts its hold, and the watchdog
// keeps it (see Mutex.Unlock), so a lane that dropped it would find its
// own lock held for the rest of the run.
func (w *world) unlockSure(ctx context.Context, m *mutex.Mutex) {
	w.releaseSure(ctx, m.Unlock)
}
