package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/semaphore"
)

// worker runs random operations on node n until ctx ends or n is closed.
func (w *world) worker(ctx context.Context, n *node, j int, rng *rand.Rand) {
	owner := fmt.Sprintf("n%dw%d", n.i, j)
	seq := 0
	for ctx.Err() == nil && !n.closed.Load() {
		seq++
		id := owner + "." + strconv.Itoa(seq)
		switch k := rng.IntN(100); {
		case k < 25:
			w.mutexOp(ctx, n, rng, id, false)
		case k < 35:
			w.mutexDo(ctx, n, rng, id, false)
		case k < 50:
			w.rwOp(ctx, n, rng, id, false)
		case k < 60:
			w.multiOp(ctx, n, rng, id, false)
		case k < 75:
			w.semOp(ctx, n, rng, id, false)
		case k < 85:
			w.httpOp(ctx, n, rng)
		default:
			w.limitOp(ctx, n, rng)
		}
	}
}

// opTimeout is how long an acquisition may wait: mostly up to a lease,
// now and then up to three (a caller that waits long, which a Close must
// not wait for).
func (w *world) opTimeout(rng *rand.Rand) time.Duration {
	if rng.IntN(3) == 0 {
		return time.Duration((1 + rng.Float64()*2) * float64(w.cfg.Lease))
	}
	return time.Duration((0.1 + rng.Float64()*0.9) * float64(w.cfg.Lease))
}

// holdFor is how long a holder keeps what it got: mostly short, now and
// then longer than a lease, so that the watchdog renews it; a long holder
// (longHolder) always keeps it 2 to 4 leases, so that a partition of a
// lease and more in the middle of it outlasts the lease on the server.
func (w *world) holdFor(ctx context.Context, n *node, rng *rand.Rand, long bool) {
	if long {
		// For partitionStream, which cuts off a node that holds.
		n.longHolds.Add(1)
		defer n.longHolds.Add(-1)
	}
	d := time.Duration(rng.Float64() * float64(w.cfg.Lease) / 8)
	switch {
	case long:
		d = time.Duration((2 + 2*rng.Float64()) * float64(w.cfg.Lease))
	case rng.IntN(8) == 0:
		d = time.Duration((1 + rng.Float64()/2) * float64(w.cfg.Lease))
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func pickLock(n *node, rng *rand.Rand) (*mutex.Locker, string) {
	if rng.IntN(2) == 0 {
		return n.fair, "fair"
	}
	return n.locks, "plain"
}

// expected reports whether err is one of the errors the API documents for
// the operation (or a context error); any other error must come with a
// fault in force around the call.
func (w *world) expected(op string, call time.Time, err error, sentinels ...error) {
	if err == nil {
		return
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return
	}
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return
		}
	}
	if w.hist.faultNear(call, time.Now(), w.cfg.Lease) {
		return
	}
	w.hist.violation("%s: undocumented error with no fault in force: %v", op, err)
}

var (
	mutexErrs = []error{mutex.ErrNotObtained, mutex.ErrLost, mutex.ErrClosed, mutex.ErrNotHeld}
	semErrs   = []error{semaphore.ErrNotObtained, semaphore.ErrLost, semaphore.ErrClosed, semaphore.ErrNotHeld}
)

// releaseCtx bounds a release: it runs even when the workload is over.
func (w *world) releaseCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), w.cfg.Lease)
}

func (w *world) mutexOp(ctx context.Context, n *node, rng *rand.Rand, id string, long bool) {
	name := "m" + strconv.Itoa(rng.IntN(lockNames))
	lk, note := pickLock(n, rng)
	m, err := lk.NewMutex(name, mutex.WithOwner(id))
	if err != nil {
		w.hist.violation("NewMutex: %v", err)
		return
	}
	try := rng.IntN(4) == 0
	w.count(map[bool]string{true: "mutex.trylock", false: "mutex.lock"}[try])
	actx, cancel := context.WithTimeout(ctx, w.opTimeout(rng))
	call := time.Now()
	if try {
		err = m.TryLock(actx)
	} else {
		err = m.Lock(actx)
	}
	cancel()
	if err != nil {
		w.expected("Mutex.Lock", call, err, mutexErrs...)
		if !try {
			w.gaveUp(ctx, "mutex", name, id+" "+note+" node "+strconv.Itoa(n.i), 1, call, err)
		}
		return
	}
	x := &hold{kind: "mutex", res: name, owner: id, node: n.i, weight: 1, token: m.Token(), note: note, call: call, start: time.Now(),
		lostCh: m.Lost(), try: try}
	w.hist.begin(x)
	w.holdFor(ctx, n, rng, long)
	// Nest now and then, and always once the hold is known lost: that
	// Lock must not join it.
	if lost := m.Lost(); closed(lost) || rng.IntN(3) == 0 {
		w.nested(ctx, x, lost, m.Lock, m.Unlock)
	}
	w.release(x, m.Unlock, func() bool { return m.Err() != nil }, mutexErrs)
}

// gaveUp records a blocking acquisition that ended with its context, for
// the liveness check; not those cut short by the end of the workload.
func (w *world) gaveUp(ctx context.Context, kind, res, who string, weight int64, call time.Time, err error) {
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		ret := time.Now()
		// What Redis says of the resource now, for the report if the
		// liveness check finds the wait unexplained.
		var state string
		if !w.hist.faultNear(call, ret, 0) {
			for _, k := range holderKeys(res) {
				if srv, err := w.owner(k); err == nil {
					v, _ := srv.Do("HGETALL", k)
					ttl, _ := srv.Do("PTTL", k)
					state += fmt.Sprintf(" %s={%s} pttl %s;", k, strings.ReplaceAll(v, "\n", " "), ttl)
				}
			}
		}
		w.hist.gaveUp(wait{kind: kind, res: res, who: who, weight: weight, call: call, ret: ret, state: state})
	}
}

// nested takes and releases a nested hold: a nested Lock must not join a
// hold already known lost.
func (w *world) nested(ctx context.Context, x *hold, lost <-chan struct{}, lock, unlock func(context.Context) error) {
	w.count("nested")
	wasLost := closed(lost)
	nctx, cancel := context.WithTimeout(ctx, w.cfg.Lease/4)
	defer cancel()
	call := time.Now()
	err := lock(nctx)
	if err != nil {
		w.expected("nested Lock", call, err, mutexErrs...)
		if wasLost && !errors.Is(err, mutex.ErrLost) && !errors.Is(err, mutex.ErrClosed) && ctx.Err() == nil && !w.nodes[x.node].closed.Load() {
			// The README: a Lock before the Unlock of a lost hold
			// returns the loss (wrapping ErrLost) and starts nothing.
			w.hist.nestedNotLoss(x, err)
		}
		return
	}
	if wasLost {
		w.hist.nestedAfterLoss(x)
	}
	rctx, rcancel := w.releaseCtx()
	err = unlock(rctx)
	rcancel()
	w.expected("nested Unlock", call, err, mutexErrs...)
	w.retryRelease(w.nodes[x.node], "nested Unlock", err, unlock, mutexErrs)
}

// retryRelease calls unlock again after a release failed otherwise than
// with ErrNotHeld (the reply was lost, the slot was moving), as the README
// tells a caller to: the hold is still counted (and, for a lock, renewed),
// and a retry never gives back two. It gives up after a few leases.
func (w *world) retryRelease(n *node, op string, err error, unlock func(context.Context) error, allowed []error) {
	for range 8 {
		if err == nil || errors.Is(err, mutex.ErrNotHeld) || errors.Is(err, semaphore.ErrNotHeld) || n.closed.Load() {
			// Done, or the node was closed: its client is gone, and
			// Close's give-backs and the leases end what is left.
			return
		}
		time.Sleep(w.cfg.Lease / 8)
		w.count("release.retry")
		rctx, cancel := w.releaseCtx()
		call := time.Now()
		err = unlock(rctx)
		cancel()
		w.expected(op+" (retried)", call, err, allowed...)
	}
}

// release ends hold x: the hold interval ends when the release is called,
// and the release's error (or the holder's Err, read before it) tells
// whether the holder learnt of a loss.
//
// Any error from the release counts as telling: the holder was not told
// that its hold lasted. What the oracle refuses is a silent loss: a
// release or Do that returns nil for a hold that was gone.
func (w *world) release(x *hold, unlock func(context.Context) error, errSet func() bool, allowed []error) {
	knew := errSet()
	at := time.Now()
	w.hist.releasing(x, at)
	rctx, cancel := w.releaseCtx()
	err := unlock(rctx)
	cancel()
	n := w.nodes[x.node]
	if !n.closed.Load() {
		w.expected(x.kind+" release", at, err, allowed...)
	}
	how := "Unlock: " + fmt.Sprint(err)
	if knew {
		how = "Err set before Unlock"
	}
	w.hist.end(x, knew || err != nil, how)
	w.retryRelease(n, x.kind+" release", err, unlock, allowed)
}

func (w *world) mutexDo(ctx context.Context, n *node, rng *rand.Rand, id string, long bool) {
	name := "m" + strconv.Itoa(rng.IntN(lockNames))
	lk, note := pickLock(n, rng)
	m, err := lk.NewMutex(name, mutex.WithOwner(id))
	if err != nil {
		w.hist.violation("NewMutex: %v", err)
		return
	}
	w.count("mutex.do")
	var x *hold
	actx, cancel := context.WithTimeout(ctx, w.opTimeout(rng))
	defer cancel()
	call := time.Now()
	err = m.Do(actx, func(fctx context.Context) error {
		x = &hold{kind: "mutex", res: name, owner: id, node: n.i, weight: 1, token: m.Token(), note: note, call: call, start: time.Now(),
			lostCh: m.Lost()}
		w.hist.begin(x)
		w.holdFor(ctx, n, rng, long)
		if closed(fctx.Done()) && errors.Is(context.Cause(fctx), mutex.ErrLost) {
			w.hist.tell(x, "fn's context ended with the loss")
		}
		w.hist.releasing(x, time.Now())
		return nil
	})
	if x == nil {
		w.expected("Mutex.Do", call, err, mutexErrs...)
		return
	}
	w.expected("Mutex.Do", call, err, mutexErrs...)
	w.hist.end(x, err != nil, "Do: "+fmt.Sprint(err))
	if m.Holds() > 0 {
		// Do's Unlock failed and left the hold counted: give it back.
		w.retryRelease(n, "Mutex.Do", err, m.Unlock, mutexErrs)
	}
}

func (w *world) rwOp(ctx context.Context, n *node, rng *rand.Rand, id string, long bool) {
	name := "rw" + strconv.Itoa(rng.IntN(rwNames))
	lk, note := pickLock(n, rng)
	rw, err := lk.NewRWMutex(name, mutex.WithOwner(id))
	if err != nil {
		w.hist.violation("NewRWMutex: %v", err)
		return
	}
	write := rng.IntN(2) == 0
	kind := map[bool]string{true: "write", false: "read"}[write]
	w.count("rw." + kind)
	actx, cancel := context.WithTimeout(ctx, w.opTimeout(rng))
	call := time.Now()
	if write {
		err = rw.Lock(actx)
	} else {
		err = rw.RLock(actx)
	}
	cancel()
	if err != nil {
		w.expected("RWMutex."+kind, call, err, mutexErrs...)
		w.gaveUp(ctx, kind, name, id+" "+note+" node "+strconv.Itoa(n.i), 1, call, err)
		return
	}
	var token int64
	if write {
		token = rw.Token()
	}
	x := &hold{kind: kind, res: name, owner: id, node: n.i, weight: 1, token: token, note: note, call: call, start: time.Now(),
		lostCh: rw.Lost()}
	w.hist.begin(x)
	w.holdFor(ctx, n, rng, long)
	lock, unlock := rw.RLock, rw.RUnlock
	if write {
		lock, unlock = rw.Lock, rw.Unlock
	}
	if lost := rw.Lost(); closed(lost) || rng.IntN(3) == 0 {
		w.nested(ctx, x, lost, lock, unlock)
	}
	w.release(x, unlock, func() bool { return rw.Err() != nil }, mutexErrs)
}

func (w *world) multiOp(ctx context.Context, n *node, rng *rand.Rand, id string, long bool) {
	k := 2 + rng.IntN(2)
	names := rng.Perm(lockNames)[:k]
	var ns []string
	for _, i := range names {
		ns = append(ns, "m"+strconv.Itoa(i))
	}
	lk, note := pickLock(n, rng)
	mm, err := lk.NewMultiMutex(ns, mutex.WithOwner(id))
	if err != nil {
		w.hist.violation("NewMultiMutex: %v", err)
		return
	}
	w.count("multi.lock")
	actx, cancel := context.WithTimeout(ctx, w.opTimeout(rng))
	call := time.Now()
	err = mm.Lock(actx)
	cancel()
	// While it waits for a name, a set holds the names before it in its
	// order: those may keep other waiters out with no hold on record.
	members := mm.Names()
	for _, name := range members[:len(members)-1] {
		w.hist.partial(name, call, time.Now())
	}
	if err != nil {
		w.expected("MultiMutex.Lock", call, err, mutexErrs...)
		return
	}
	start := time.Now()
	tokens := mm.Tokens()
	var xs []*hold
	for i, name := range mm.Names() {
		x := &hold{kind: "set", res: name, set: ns, owner: id, node: n.i, weight: 1, token: tokens[i], note: note, call: call, start: start,
			lostCh: mm.Lost()}
		w.hist.begin(x)
		xs = append(xs, x)
	}
	w.holdFor(ctx, n, rng, long)
	if lost := mm.Lost(); closed(lost) || rng.IntN(3) == 0 {
		w.nested(ctx, xs[0], lost, mm.Lock, mm.Unlock)
	}
	knew := mm.Err() != nil
	at := time.Now()
	for _, x := range xs {
		w.hist.releasing(x, at)
	}
	rctx, rcancel := w.releaseCtx()
	err = mm.Unlock(rctx)
	rcancel()
	w.expected("MultiMutex.Unlock", at, err, mutexErrs...)
	for _, x := range xs {
		w.hist.end(x, knew || err != nil, "set Unlock: "+fmt.Sprint(err))
	}
	w.retryRelease(n, "MultiMutex.Unlock", err, mm.Unlock, mutexErrs)
}

// longHolder keeps node n holding something for 2 to 4 leases,
// one thing after another: the holds that a partition (partitionStream) or
// the operator's mistakes cut short, so that a loss meets what comes after
// it: the holder's watchdog, its nested Lock and its release, and a
// competitor granted what the holder lost.
func (w *world) longHolder(ctx context.Context, n *node, rng *rand.Rand) {
	seq := 0
	for ctx.Err() == nil && !n.closed.Load() {
		seq++
		id := fmt.Sprintf("n%dlong.%d", n.i, seq)
		// Mostly locks, which every worker contends for; permits of the
		// semaphore kept full (hotSemaphore), where one lost matters.
		switch k := rng.IntN(10); {
		case k < 3:
			w.mutexOp(ctx, n, rng, id, true)
		case k < 5:
			w.mutexDo(ctx, n, rng, id, true)
		case k < 7:
			w.rwOp(ctx, n, rng, id, true)
		case k < 9:
			w.multiOp(ctx, n, rng, id, true)
		default:
			w.semHold(ctx, n, rng, id, "s0", 1+rng.Int64N(2), func() { w.holdFor(ctx, n, rng, true) })
		}
	}
}

// hotSemaphore keeps s0 near its capacity from node n: permits of weight
// 1 to semCap (all of it) held for a sixteenth to half a lease, one after
// another, so that acquisitions meet a full semaphore.
func (w *world) hotSemaphore(ctx context.Context, n *node, rng *rand.Rand) {
	seq := 0
	for ctx.Err() == nil && !n.closed.Load() {
		seq++
		held := w.semHold(ctx, n, rng, fmt.Sprintf("n%dhot.%d", n.i, seq), "s0", 1+rng.Int64N(semCap), func() {
			sleep(ctx, time.Duration((0.0625+0.4375*rng.Float64())*float64(w.cfg.Lease)))
		})
		if !held {
			// A TryAcquire of a full semaphore, or an error of a fault:
			// not again at once.
			sleep(ctx, w.cfg.Lease/16)
		}
	}
}

func (w *world) semOp(ctx context.Context, n *node, rng *rand.Rand, id string, long bool) {
	_ = w.semHold(ctx, n, rng, id, "s"+strconv.Itoa(rng.IntN(semNames)), int64(1+rng.IntN(2)), func() { w.holdFor(ctx, n, rng, long) })
}

// semHold acquires weight permits of semaphore name, holds them (keep)
// and releases them. It reports whether it got them.
func (w *world) semHold(ctx context.Context, n *node, rng *rand.Rand, id, name string, weight int64, keep func()) bool {
	mgr, note := n.sems, "plain"
	if rng.IntN(2) == 0 {
		mgr, note = n.fairSems, "fair"
	}
	s, err := mgr.NewSemaphore(name, semCap)
	if err != nil {
		w.hist.violation("NewSemaphore: %v", err)
		return false
	}
	try := rng.IntN(4) == 0
	w.count(map[bool]string{true: "sem.tryacquire", false: "sem.acquire"}[try])
	actx, cancel := context.WithTimeout(ctx, w.opTimeout(rng))
	call := time.Now()
	var p *semaphore.Permit
	if try {
		p, err = s.TryAcquire(actx, weight)
	} else {
		p, err = s.Acquire(actx, weight)
	}
	cancel()
	if err != nil {
		w.expected("Semaphore.Acquire", call, err, semErrs...)
		if !try {
			w.gaveUp(ctx, "permit", name, "a "+note+" Acquire of node "+strconv.Itoa(n.i), weight, call, err)
		}
		return false
	}
	x := &hold{kind: "permit", res: name, owner: p.ID(), node: n.i, weight: weight, note: note, call: call, start: time.Now(),
		lostCh: p.Lost(), try: try}
	w.hist.begin(x)
	keep()
	w.release(x, p.Release, func() bool { return p.Err() != nil }, semErrs)
	return true
}

func (w *world) limitOp(ctx context.Context, n *node, rng *rand.Rand) {
	i := rng.IntN(len(n.limiters))
	l := n.limiters[i]
	key := "k" + strconv.Itoa(rng.IntN(limitKeys))
	switch rng.IntN(4) {
	case 0:
		// Always through one Limiter: its Prefix names the set's state.
		w.policiesOp(ctx, n.limiters[0], key, rng)
		return
	case 1:
		w.waitOp(ctx, l, key, rng)
		return
	}
	cost := 1 + rng.IntN(3)
	w.count("limit.allow")
	actx, cancel := context.WithTimeout(ctx, w.cfg.Lease/4)
	call := time.Now()
	res, err := l.AllowN(actx, key, cost)
	ret := time.Now()
	cancel()
	if err != nil {
		w.expected("Limiter.AllowN", call, err)
		return
	}
	if res.Allowed {
		w.lim.add(algoName(l.Algorithm())+"/"+key, decision{call: call, ret: ret, cost: cost, resetAfter: res.ResetAfter})
	}
}

// hammer keeps one node's limiters under pressure on one hot key: bursts
// of calls a few milliseconds apart, then quiet spells, so that every
// algorithm is pushed to its bound both in steady state (windows back to
// back) and after a quiet spell (a full GCRA bucket).
func (w *world) hammer(ctx context.Context, n *node, rng *rand.Rand) {
	for ctx.Err() == nil && !n.closed.Load() {
		l := n.limiters[rng.IntN(len(n.limiters))]
		name := algoName(l.Algorithm()) + "/hot"
		policies := rng.IntN(4) == 0
		until := time.Now().Add(time.Duration((0.15 + rng.Float64()*0.6) * float64(w.cfg.Lease)))
		for time.Now().Before(until) && ctx.Err() == nil && !n.closed.Load() {
			if policies {
				w.policiesOp(ctx, n.limiters[0], "hot", rng)
				sleep(ctx, 5*time.Millisecond)
				continue
			}
			cost := 1 + rng.IntN(2)
			w.count("limit.hammer")
			actx, cancel := context.WithTimeout(ctx, w.cfg.Lease/4)
			call := time.Now()
			res, err := l.AllowN(actx, "hot", cost)
			ret := time.Now()
			cancel()
			if err != nil {
				w.expected("Limiter.AllowN", call, err)
			} else if res.Allowed {
				w.lim.add(name, decision{call: call, ret: ret, cost: cost, resetAfter: res.ResetAfter})
			}
			sleep(ctx, 5*time.Millisecond)
		}
		sleep(ctx, time.Duration(rng.Float64()*float64(w.cfg.Lease)*0.75))
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// runOver reports whether ctx, a workload's context, has ended, or its
// deadline has passed while its timer has not yet fired: a call whose
// own deadline (a child's, or the socket's under go-redis's
// ContextTimeoutEnabled) is the run's may fail with DeadlineExceeded a
// moment before ctx.Err() says so. Its failure is the run's end, not the
// library's.
func runOver(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}
