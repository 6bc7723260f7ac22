package chaos

import (
	"slices"
	"time"
)

// A wait is a blocking acquisition that gave up when its context ended.
type wait struct {
	kind      string // "mutex", "write", "read", "permit"
	res       string
	who       string // the waiter, for reports
	weight    int64
	call, ret time.Time
	state     string // the resource's keys in Redis when it gave up
}

// partial records that a MultiMutex's Lock, from call to ret, may have
// held res while it waited for a later name of its set: no hold of the
// API's, but a waiter on res may wait for it.
func (h *history) partial(res string, call, ret time.Time) {
	h.mu.Lock()
	h.partials = append(h.partials, &hold{kind: "set", res: res, call: call, start: call, end: ret, ended: true})
	h.mu.Unlock()
}

func (h *history) gaveUp(wt wait) {
	h.mu.Lock()
	h.waits = append(h.waits, wt)
	h.mu.Unlock()
}

// checkLiveness finds waiters that gave up although what they waited for
// stayed free for longer than bound while they waited, with no fault in
// force around the wait: a release that woke nobody, a lost hand-off. A
// lock is free for a waiter while no hold of it (no write hold, for a
// reader) is in progress and no MultiMutex Lock may hold it (partial); a semaphore while at least 2 permits (the
// heaviest request) are free. Hand-offs take time, so only a free spell
// longer than bound counts.
func (h *history) checkLiveness(bound time.Duration) {
	h.mu.Lock()
	waits := h.waits
	byRes := map[string][]*hold{}
	for _, x := range h.done {
		byRes[x.res] = append(byRes[x.res], x)
	}
	partials := map[string][]*hold{}
	for _, x := range h.partials {
		partials[x.res] = append(partials[x.res], x)
	}
	h.mu.Unlock()
	for _, wt := range waits {
		if h.faultNear(wt.call, wt.ret, 0) {
			continue
		}
		if gap, at := freeSpell(wt, slices.Concat(byRes[wt.res], partials[wt.res]), h.capacity[wt.res]); gap > bound {
			h.mu.Lock()
			h.violationLocked("liveness: %s waiter %s on %q (called %s) gave up after %v although it was free for %v from %s, with no fault in force; Redis then:%s",
				wt.kind, wt.who, wt.res, h.since(wt.call), wt.ret.Sub(wt.call).Round(time.Millisecond), gap.Round(time.Millisecond), h.since(at), wt.state)
			var near []*hold
			for _, x := range byRes[wt.res] {
				if x.end.After(at.Add(-bound)) && x.start.Before(at.Add(gap+bound)) {
					near = append(near, x)
				}
			}
			h.noteInvolvedLocked(near...)
			h.mu.Unlock()
		}
	}
}

// freeSpell returns the longest spell within the wait in which the
// resource was free for the waiter, and when it began.
func freeSpell(wt wait, holds []*hold, capacity int64) (time.Duration, time.Time) {
	type edge struct {
		at time.Time
		d  int64
	}
	var es []edge
	for _, x := range holds {
		if !x.end.After(wt.call) || !x.start.Before(wt.ret) {
			continue
		}
		var w int64
		switch {
		case wt.kind == "permit":
			w = x.weight
		case wt.kind == "read" && x.kind == "read":
			continue
		default:
			w = 1
		}
		es = append(es, edge{maxTime(x.start, wt.call), w}, edge{minTime(x.end, wt.ret), -w})
	}
	slices.SortFunc(es, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return int(b.d - a.d) // starts before ends at one instant
	})
	busy := func(used int64) bool {
		if wt.kind == "permit" {
			return used > capacity-2
		}
		return used > 0
	}
	var used int64
	var longest time.Duration
	var longestAt time.Time
	freeFrom := wt.call
	for _, e := range es {
		was := busy(used)
		used += e.d
		switch now := busy(used); {
		case !was && now:
			if d := e.at.Sub(freeFrom); d > longest {
				longest, longestAt = d, freeFrom
			}
		case was && !now:
			freeFrom = e.at
		}
	}
	if !busy(used) {
		if d := wt.ret.Sub(freeFrom); d > longest {
			longest, longestAt = d, freeFrom
		}
	}
	return longest, longestAt
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
