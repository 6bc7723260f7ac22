package chaos

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/semaphore"
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
// lock is free for a waiter while no hold of it is in progress (for a
// reader too: a writer waiting behind other readers keeps new readers
// out) and no MultiMutex Lock may hold it (partial); a semaphore while no
// permit is held (a fair waiter may wait behind a head of any weight up to
// the capacity). Hand-offs take time, so only a free spell longer than
// bound, plus the time this process stalled within it, counts.
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
		if gap, at := freeSpell(wt, slices.Concat(byRes[wt.res], partials[wt.res])); gap > bound {
			h.mu.Lock()
			// A hand-off is a wake-up, a goroutine scheduled and a script
			// call: on a loaded machine each can wait for a CPU. The
			// time this process stalled within the spell is not the
			// library's (the server stalls with it).
			if _, st := h.stallsLocked(at, at.Add(gap)); gap-st <= bound {
				h.excused = append(h.excused, fmt.Sprintf("%s waiter %s on %q: free for %v, of which the process stalled %v", wt.kind, wt.who, wt.res, gap.Round(time.Millisecond), st.Round(time.Millisecond)))
				h.mu.Unlock()
				continue
			}
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
func freeSpell(wt wait, holds []*hold) (time.Duration, time.Time) {
	type edge struct {
		at time.Time
		d  int64
	}
	var es []edge
	for _, x := range holds {
		if !x.end.After(wt.call) || !x.start.Before(wt.ret) {
			continue
		}
		// A reader is not free to go in while other readers hold either:
		// a writer waiting behind them (which the history does not see)
		// keeps new readers out, so that writers are not starved.
		var w int64 = 1
		if wt.kind == "permit" {
			w = x.weight
		}
		es = append(es, edge{maxTime(x.start, wt.call), w}, edge{minTime(x.end, wt.ret), -w})
	}
	slices.SortFunc(es, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return int(b.d - a.d) // starts before ends at one instant
	})
	// Free only when nothing is held, for a permit too: a fair waiter
	// may wait behind a heavier head, whatever its own weight.
	busy := func(used int64) bool { return used > 0 }
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

// acquireFunc takes a probe's resource and returns its release.
type acquireFunc func(ctx context.Context) (release func(context.Context) error, err error)

// probeWakeUps checks that a release wakes a waiter, once the workload is
// over and the network healed. For each kind of lock and semaphore, on a
// name the workload does not use, the admin node holds it, an open node
// waits for it, and the holder releases it after a quarter lease; the
// waiter must have it within bound of the release's return. What the
// library does when a wake-up is lost (a waiter retries when the lease it
// saw would end; a fair queue's refresh) comes later than that, so a
// release that wakes nobody is found although the waiter gets there in
// the end. The holder's quarter lease is no synchronization: a waiter
// that has not started waiting by the release finds the resource free.
func (w *world) probeWakeUps(bound time.Duration) {
	waiter := w.admin
	for _, n := range w.nodes {
		if !n.closed.Load() {
			waiter = n
			break
		}
	}
	lock := func(l *mutex.Locker, name string) acquireFunc {
		return func(ctx context.Context) (func(context.Context) error, error) {
			m, err := l.NewMutex(name)
			if err != nil {
				return nil, err
			}
			return m.Unlock, m.Lock(ctx)
		}
	}
	write := func(l *mutex.Locker, name string) acquireFunc {
		return func(ctx context.Context) (func(context.Context) error, error) {
			rw, err := l.NewRWMutex(name)
			if err != nil {
				return nil, err
			}
			return rw.Unlock, rw.Lock(ctx)
		}
	}
	permit := func(m *semaphore.Manager, name string) acquireFunc {
		return func(ctx context.Context) (func(context.Context) error, error) {
			s, err := m.NewSemaphore(name, 1)
			if err != nil {
				return nil, err
			}
			p, err := s.Acquire(ctx, 1)
			if err != nil {
				return nil, err
			}
			return p.Release, nil
		}
	}
	a := w.admin
	probes := []struct {
		what           string
		holder, waiter acquireFunc
	}{
		{"mutex", lock(a.locks, "probe.m"), lock(waiter.locks, "probe.m")},
		{"fair mutex", lock(a.fair, "probe.f"), lock(waiter.fair, "probe.f")},
		{"RWMutex writer", write(a.locks, "probe.rw"), write(waiter.locks, "probe.rw")},
		{"semaphore", permit(a.sems, "probe.s"), permit(waiter.sems, "probe.s")},
		{"fair semaphore", permit(a.fairSems, "probe.fs"), permit(waiter.fairSems, "probe.fs")},
	}
	var wg sync.WaitGroup
	for _, p := range probes {
		wg.Go(func() {
			if err := w.probeWakeUp(p.holder, p.waiter, bound); err != nil {
				w.hist.violation("wake-up probe, %s: %v", p.what, err)
			}
		})
	}
	wg.Wait()
}

func (w *world) probeWakeUp(holder, waiter acquireFunc, bound time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*w.cfg.Lease)
	defer cancel()
	release, err := holder(ctx)
	if err != nil {
		return fmt.Errorf("the holder could not acquire: %w", err)
	}
	type got struct {
		at      time.Time
		release func(context.Context) error
		err     error
	}
	done := make(chan got, 1)
	go func() {
		r, err := waiter(ctx)
		done <- got{time.Now(), r, err}
	}()
	sleep(ctx, w.cfg.Lease/4)
	err = release(ctx)
	released := time.Now()
	g := <-done
	if g.err == nil {
		defer func() {
			rctx, rcancel := w.releaseCtx()
			defer rcancel()
			_ = g.release(rctx) // the probe's verdict is made; a failed release ends with the lease
		}()
	}
	switch {
	case err != nil:
		return fmt.Errorf("the holder's release: %w", err)
	case g.err != nil:
		return fmt.Errorf("the waiter did not get it (%w) in %v after the release", g.err, time.Since(released).Round(time.Millisecond))
	case g.at.Sub(released) > bound:
		return fmt.Errorf("the waiter got it %v after the release, more than %v: the release woke nobody", g.at.Sub(released).Round(time.Millisecond), bound)
	}
	return nil
}
