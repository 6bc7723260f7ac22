package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/sluicekit/sluice/semaphore"
)

// The capacity lanes: a plain and a fair semaphore whose capacity an
// operator (capacitySetter) sets, again and again, to 1 to 5 while two
// goroutines of every node take permits of weight 1 to 4 through
// Semaphores made with capacity 3. The package doc's "Capacity" promises
// are judged both ways:
//
//   - never more weight granted than the capacity that may be in force
//     (history.begin, with the setter's calls in capChanges);
//   - an Acquire for no more than the capacity in force all through the
//     call is not refused with ErrInvalidWeight, and while a set capacity
//     is in force all through it, no Semaphore's own capacity is
//     ErrCapacityMismatch ("a set capacity overrides every Semaphore's
//     own");
//   - Info, while a permit is held: Capacity the capacity in force and
//     CapacitySet whether SetCapacity set it, Available = Capacity − Used
//     (0 while a lowered capacity is exceeded); Available no more than
//     the capacity less the permit held.
//
// The capacity in force is known for a call only when no change (a
// SetCapacity, a FLUSHALL or restart, which removes a set capacity)
// overlapped it and the last before it succeeded; the checks are decided
// after the run (every change's span is known then), and a fault of the
// node or the server excuses them (suspect).
const (
	laneCapSem  = "lcs"
	laneCapFair = "lcf"
	// laneCapMade is the capacity the lanes' Semaphores are made with;
	// laneCapMax the largest the setter sets.
	laneCapMade = 3
	laneCapMax  = 5
)

func (w *world) capLaneOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	w.capPermit(ctx, n, rng, id, n.sems, laneCapSem)
}

func (w *world) capFairLaneOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	w.capPermit(ctx, n, rng, id, n.fairSems, laneCapFair)
}

// capPermit takes 1 to 4 permits of res through mgr, holds them as the
// lanes do, checks Info now and then, and releases them.
func (w *world) capPermit(ctx context.Context, n *node, rng *rand.Rand, id string, mgr *semaphore.Manager, res string) {
	s, err := mgr.NewSemaphore(res, laneCapMade, semaphore.WithOwner(id))
	if err != nil {
		w.hist.violation("NewSemaphore: %v", err)
		return
	}
	weight := int64(1)
	switch k := rng.IntN(8); {
	case k == 7:
		weight = 4
	case k == 6:
		weight = 3
	case k >= 4:
		weight = 2
	}
	try := rng.IntN(4) == 0
	w.count("lane.capacity")
	actx, cancel := context.WithTimeout(ctx, w.laneTimeout(rng))
	call := time.Now()
	var p *semaphore.Permit
	if try {
		p, err = s.TryAcquire(actx, weight)
	} else {
		p, err = s.Acquire(actx, weight)
	}
	cancel()
	ret := time.Now()
	if err != nil {
		w.capRefusal(res, n.i, weight, call, ret, err)
		return
	}
	x := &hold{kind: "permit", res: res, owner: p.ID(), node: n.i, weight: weight, note: "capacity lane", call: call, start: ret, valid: p.Valid(), lostCh: p.Lost(), try: try}
	w.hist.begin(x)
	if rng.IntN(2) == 0 {
		w.capInfoHeld(ctx, mgr, s, x)
	}
	sleep(ctx, w.laneHold(rng))
	w.releasePermit(n, x, p)
}

// capRefusal judges a failed acquisition of a capacity lane: the
// documented errors, and neither ErrInvalidWeight for a weight within the
// capacity in force all through the call nor ErrCapacityMismatch while a
// set capacity was (decided after the run).
func (w *world) capRefusal(res string, node int, weight int64, call, ret time.Time, err error) {
	invalid, mismatch := errors.Is(err, semaphore.ErrInvalidWeight), errors.Is(err, semaphore.ErrCapacityMismatch)
	switch {
	case invalid:
		w.count("lane.capacity.invalid")
	case mismatch:
		w.count("lane.capacity.mismatch")
	}
	if !invalid && !mismatch {
		w.expected("capacity lane acquisition", call, err, semErrs...)
		return
	}
	w.later(func() {
		h := w.hist
		h.mu.Lock()
		c, set, ok := h.capacityKnownLocked(res, call, ret)
		h.mu.Unlock()
		switch {
		case !ok:
		case invalid && weight <= c:
			w.suspect(call, ret, []int{node}, res, "capacity lane %q: an Acquire of weight %d (called %s) failed with %v while the capacity in force was %d (set %v) all through it", res, weight, w.hist.since(call), err, c, set)
		case mismatch && set:
			w.suspect(call, ret, []int{node}, res, "capacity lane %q: an Acquire (called %s) failed with %v while a capacity set by SetCapacity (%d) was in force all through it", res, w.hist.since(call), err, c)
		}
	})
}

// capInfoHeld reads Info and Available of res while x is held, and tries a
// permit through a Semaphore made with another capacity (2), and judges
// them after the run against the capacity in force through the calls.
func (w *world) capInfoHeld(ctx context.Context, mgr *semaphore.Manager, s *semaphore.Semaphore, x *hold) {
	w.count("lane.capinfo")
	ictx, cancel := context.WithTimeout(ctx, w.cfg.Lease/4)
	defer cancel()
	call := time.Now()
	in, err := s.Info(ictx)
	if err != nil {
		w.expected("Semaphore.Info", call, err)
		return
	}
	avail, err := s.Available(ictx)
	if err != nil {
		w.expected("Semaphore.Available", call, err, semaphore.ErrCapacityMismatch)
		return
	}
	// Below the lanes' own, so that a grant it makes (no capacity set, no
	// permit held) never lets more in than the history's capacity.
	other, err := mgr.NewSemaphore(x.res, laneCapMade-1)
	if err != nil {
		w.hist.violation("NewSemaphore: %v", err)
		return
	}
	op, merr := other.TryAcquire(ictx, 1)
	if merr == nil {
		rctx, rcancel := w.releaseCtx()
		_ = op.Release(rctx)
		rcancel()
	}
	ret := time.Now()
	w.later(func() {
		h := w.hist
		h.mu.Lock()
		c, set, ok := h.capacityKnownLocked(x.res, call, ret)
		live := !x.told && !x.lost() && (!x.ended || x.end.After(ret))
		h.mu.Unlock()
		if !ok {
			return
		}
		var wrong []string
		// With none set, the permits' own: the lanes' or other's.
		if in.CapacitySet != set || set && in.Capacity != c || !set && in.Capacity != c && in.Capacity != laneCapMade-1 {
			wrong = append(wrong, fmt.Sprintf("Capacity %d (set %v), want %d (set %v)", in.Capacity, in.CapacitySet, c, set))
		}
		if in.Available != max(in.Capacity-in.Used, 0) || in.Used < in.Holders {
			wrong = append(wrong, fmt.Sprintf("Info %+v: Available not Capacity - Used, or Used under Holders", in))
		}
		if live && (in.Used < x.weight || in.Holders < 1 || avail > max(c-x.weight, 0)) {
			wrong = append(wrong, fmt.Sprintf("Info %+v and Available %d while this permit held %d of %d", in, avail, x.weight, c))
		}
		if set && errors.Is(merr, semaphore.ErrCapacityMismatch) {
			wrong = append(wrong, fmt.Sprintf("a TryAcquire through a Semaphore of capacity %d returned %v under a set capacity", laneCapMade-1, merr))
		}
		if len(wrong) > 0 {
			w.suspect(call, ret, []int{x.node}, x.res, "capacity lane: Info of %q at %s, permit #%d of weight %d held: %s", x.res, w.hist.since(call), x.id, x.weight, strings.Join(wrong, "; "))
		}
	})
}

// capacitySetter sets the capacity lanes' capacity, one lane at a time,
// every tenth to third of a lease, to 1 to laneCapMax, through a node drawn
// at random, and records each call (history.setCapacity).
func (w *world) capacitySetter(ctx context.Context, rng *rand.Rand) {
	for i := 0; ctx.Err() == nil; i++ {
		sleep(ctx, time.Duration((0.1+0.23*rng.Float64())*float64(w.cfg.Lease)))
		open := w.openNodes()
		if len(open) == 0 || ctx.Err() != nil {
			return
		}
		n := open[rng.IntN(len(open))]
		mgr, res := n.sems, laneCapSem
		if i%2 == 1 {
			mgr, res = n.fairSems, laneCapFair
		}
		s, err := mgr.NewSemaphore(res, laneCapMade)
		if err != nil {
			w.hist.violation("NewSemaphore: %v", err)
			return
		}
		c := 1 + rng.Int64N(laneCapMax)
		sctx, cancel := context.WithTimeout(ctx, w.cfg.Lease/2)
		at := time.Now()
		err = s.SetCapacity(sctx, c)
		cancel()
		w.hist.setCapacity(res, n.i, at, time.Now(), c, err != nil)
		w.count("lane.setcapacity")
		if err != nil && !n.closed.Load() {
			w.expected("SetCapacity", at, err)
		}
	}
}

// later adds a check to decide once the run is over.
func (w *world) later(check func()) {
	w.ln.mu.Lock()
	w.ln.later = append(w.ln.later, check)
	w.ln.mu.Unlock()
}
