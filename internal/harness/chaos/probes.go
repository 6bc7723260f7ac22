package chaos

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/semaphore"
)

// The seam probes stage, once the workload is over and every fault healed,
// combinations the random workload meets only now and then, each with a
// rule from the README's guarantees:
//
//   - batch: the watchdog renews a Locker's holds of one slot in one script
//     call, "and each gets its own answer: a key overwritten with another
//     type of value loses only the holds kept in it, never the rest". The
//     admin node holds two locks of one slot, an operator overwrites one's
//     key with a string, and the other must stay held.
//   - set: "a MultiMutex with one lost member is lost as a set", and a
//     Lock before the Unlock of a lost hold "returns the loss (wrapping
//     ErrLost) and starts nothing". The admin node holds a set of two, an
//     operator deletes one member's key, and once the set's Lost has
//     closed a nested Lock must return ErrLost.
//   - limiter bursts: a burst on a fresh key of a fixed window and of a
//     GCRA limiter stays within Rate per window and within Burst plus the
//     tokens refilled meanwhile (probeLimiterBursts).
//   - read lock: a reader is refused while a writer holds, and gets in
//     once it has released (probeReaderBesideWriter).
//   - Unlock: an Unlock of a hold an operator ended leaves the next
//     owner's hold alone (probeUnlockAfterTakeover).
//
// Others (Do, a permit released once gone, the loss margin, a late Try)
// are described where they are defined. They run beside the wake-up probes, on names nothing else uses
// (probeName), and take about a lease and a half.
func (w *world) probeSeams() {
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := w.probeBatch(); err != nil {
			w.hist.violation("renewal batch probe: %v", err)
		}
	})
	wg.Go(func() {
		if err := w.probeSetNest(); err != nil {
			w.hist.violation("nested Lock probe: %v", err)
		}
	})
	wg.Go(func() {
		if err := w.probeLimiterBursts(); err != nil {
			w.hist.violation("limiter burst probe: %v", err)
		}
		if err := w.probeReaderBesideWriter(); err != nil {
			w.hist.violation("read lock probe: %v", err)
		}
		if err := w.probeUnlockAfterTakeover(); err != nil {
			w.hist.violation("Unlock probe: %v", err)
		}
	})
	wg.Go(func() {
		if err := w.probeDo(); err != nil {
			w.hist.violation("Do probe: %v", err)
		}
		if err := w.probeReleaseGone(); err != nil {
			w.hist.violation("permit release probe: %v", err)
		}
	})
	// Faults of a node's network: on a single server (a cluster has no
	// fault proxies), on open nodes other than the wake-up probes' waiter.
	// (probeLateTries runs on that one after them.)
	if open := w.openNodes(); w.cl == nil && len(open) >= 2 {
		wg.Go(func() {
			if err := w.probeMargin(open[1]); err != nil {
				w.hist.violation("loss margin probe: %v", err)
			}
		})
	}
	wg.Wait()
}

// probeLateTries runs probeLateTry on the first open node (the wake-up
// probes' waiter, which they no longer use), on a single server.
func (w *world) probeLateTries() {
	if open := w.openNodes(); w.cl == nil && len(open) >= 1 {
		if err := w.probeLateTry(open[0]); err != nil {
			w.hist.violation("late Try probe: %v", err)
		}
	}
}

// batchNames are two lock names whose keys share a cluster slot (on a
// single server every key shares the watchdog's one group): the
// watchdog renews them in one call.
var batchNames = func() [2]string {
	seen := map[uint16]string{}
	for i := 0; ; i++ {
		name := "probe.b" + strconv.Itoa(i)
		slot := keyspace.Slot(keyspace.Key("sluice:mutex:", name, ""))
		if o, ok := seen[slot]; ok {
			return [2]string{o, name}
		}
		seen[slot] = name
	}
}()

func (w *world) probeBatch() error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*w.cfg.Lease)
	defer cancel()
	l := w.admin.locks
	victim, err := l.NewMutex(batchNames[0])
	if err != nil {
		return err
	}
	bystander, err := l.NewMutex(batchNames[1])
	if err != nil {
		return err
	}
	if err := victim.Lock(ctx); err != nil {
		return fmt.Errorf("the Lock of %s: %w", batchNames[0], err)
	}
	defer func() {
		rctx, rcancel := w.releaseCtx()
		defer rcancel()
		_ = victim.Unlock(rctx) // lost by design: ErrNotHeld, or the string's WRONGTYPE
	}()
	if err := bystander.Lock(ctx); err != nil {
		return fmt.Errorf("the Lock of %s: %w", batchNames[1], err)
	}
	key := keyspace.Key("sluice:mutex:", batchNames[0], "")
	w.scriptErrs.foreignData(batchNames[0])
	srv, err := w.owner(key)
	if err != nil {
		return err
	}
	if _, err := srv.Do("SET", key, "operator", "PX", strconv.FormatInt(w.cfg.Lease.Milliseconds(), 10)); err != nil {
		return fmt.Errorf("SET of %s: %w", key, err)
	}
	set := time.Now()
	select {
	case <-victim.Lost():
	case <-ctx.Done():
		return fmt.Errorf("%s, whose key became a string, was not told of its loss in %v", batchNames[0], time.Since(set).Round(time.Millisecond))
	}
	// Every renewal batch sent from now on holds only the bystander; a
	// batch that failed for the victim's key would have let the
	// bystander's lease run out by a lease after the SET.
	sleep(ctx, time.Until(set.Add(w.cfg.Lease+w.cfg.Lease/4)))
	if err := bystander.Err(); err != nil {
		return fmt.Errorf("%s, renewed in one batch with %s whose key an operator overwrote with a string, was lost too: %w", batchNames[1], batchNames[0], err)
	}
	rctx, rcancel := w.releaseCtx()
	defer rcancel()
	if err := bystander.Unlock(rctx); err != nil {
		return fmt.Errorf("the Unlock of %s, renewed in one batch with %s whose key an operator overwrote with a string: %w", batchNames[1], batchNames[0], err)
	}
	return nil
}

// nestable is a lock whose Lock nests while it holds.
type nestable interface {
	Lock(context.Context) error
	Unlock(context.Context) error
	Lost() <-chan struct{}
}

// probeNestAfterLoss: the lock holds, an operator deletes the key of
// victim (one of its names), and once its Lost has closed a nested Lock
// must return the loss.
func (w *world) probeNestAfterLoss(what string, l nestable, victim string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*w.cfg.Lease)
	defer cancel()
	if err := l.Lock(ctx); err != nil {
		return fmt.Errorf("%s: Lock: %w", what, err)
	}
	defer func() {
		rctx, rcancel := w.releaseCtx()
		defer rcancel()
		_ = l.Unlock(rctx) // lost by design: ErrNotHeld; gives back what is left
	}()
	if err := w.delKeys(victim); err != nil {
		return fmt.Errorf("%s: DEL of %s: %w", what, victim, err)
	}
	del := time.Now()
	select {
	case <-l.Lost():
	case <-ctx.Done():
		return fmt.Errorf("%s: not told of the DEL of %s in %v", what, victim, time.Since(del).Round(time.Millisecond))
	}
	err := l.Lock(ctx)
	switch {
	case err == nil:
		return fmt.Errorf("%s: a nested Lock after the loss of %s returned nil: it joined (or started afresh) a hold that was gone", what, victim)
	case !errors.Is(err, mutex.ErrLost):
		return fmt.Errorf("%s: a nested Lock after the loss of %s returned %s, not the loss (ErrLost)", what, victim, errText(err))
	}
	return nil
}

func (w *world) probeSetNest() error {
	mm, err := w.admin.locks.NewMultiMutex([]string{"probe.n0", "probe.n1"})
	if err != nil {
		return err
	}
	// The second member in the set's order: the first stays held.
	if err := w.probeNestAfterLoss("MultiMutex", mm, mm.Names()[1]); err != nil {
		return err
	}
	m, err := w.admin.fair.NewMutex("probe.n2")
	if err != nil {
		return err
	}
	return w.probeNestAfterLoss("Mutex", m, "probe.n2")
}

// probeDo: Do returns an error wrapping ErrLost if the hold was lost
// while fn ran, "including a loss its own final release finds (a
// ForceUnlock, a DEL ...)". fn deletes the lock's key and returns at
// once, before the watchdog could notice.
func (w *world) probeDo() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*w.cfg.Lease)
	defer cancel()
	m, err := w.admin.locks.NewMutex("probe.do")
	if err != nil {
		return err
	}
	ran := false
	err = m.Do(ctx, func(context.Context) error {
		ran = true
		return w.delKeys("probe.do")
	})
	switch {
	case !ran:
		return fmt.Errorf("fn did not run in Do: %w", err)
	case !errors.Is(err, mutex.ErrLost):
		return fmt.Errorf("a Do whose fn deleted the lock's key returned %s, not the loss (ErrLost) its release found", errText(err))
	}
	return nil
}

// probeReleaseGone: a release of a permit that is gone frees nothing
// (semaphore_release: "a release of a permit that is gone ... frees
// nothing and changes nothing"). B holds a permit of a semaphore of
// capacity 2, an operator deletes the semaphore, C takes both permits,
// B releases (its permit is gone): C still holds all of it, so a
// TryAcquire of one more must fail.
func (w *world) probeReleaseGone() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*w.cfg.Lease)
	defer cancel()
	s, err := w.admin.sems.NewSemaphore("probe.r", 2)
	if err != nil {
		return err
	}
	b, err := s.Acquire(ctx, 1)
	if err != nil {
		return fmt.Errorf("the Acquire of B: %w", err)
	}
	if err := w.delKeys("probe.r"); err != nil {
		return fmt.Errorf("DEL: %w", err)
	}
	c, err := s.Acquire(ctx, 2)
	if err != nil {
		return fmt.Errorf("the Acquire of C after the DEL: %w", err)
	}
	defer func() { _ = c.Release(ctx) }()
	_ = b.Release(ctx) // gone: ErrNotHeld (or ErrLost)
	d, err := s.TryAcquire(ctx, 1)
	if err == nil {
		_ = d.Release(ctx)
		if c.Err() == nil {
			return errors.New("semaphore of capacity 2 over capacity: a TryAcquire of 1 was granted while C, not told of a loss, held 2 (a release of a permit that was gone freed one)")
		}
	}
	return nil
}

// closeInFlight starts an Acquire on each of n's Managers, on a semaphore
// of server srv nothing else uses, while srv is stopped, and gives them
// time to be sent (a lease/8: an Acquire not yet sent when Close comes
// only makes the probe weaker, never wrong). It returns a function to call
// once Close has been called at closeAt, which waits for the Acquires and
// checks that they returned ErrClosed within closeBound of it: the README
// says an Acquire still waiting for its reply with a context that can end
// "returns ErrClosed at once" when its Manager closes. Their contexts
// allow three leases, as long as the workload's longest waits.
func (w *world) closeInFlight(n *node, name string) (check func(closeAt time.Time)) {
	type result struct {
		at  time.Time
		err error
	}
	mgrs := []*semaphore.Manager{n.sems, n.fairSems}
	results := make(chan result, len(mgrs))
	start := time.Now()
	for _, mgr := range mgrs {
		s, err := mgr.NewSemaphore(name, 1)
		if err != nil {
			w.hist.violation("NewSemaphore: %v", err)
			results <- result{time.Now(), nil}
			continue
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*w.cfg.Lease)
			defer cancel()
			p, err := s.Acquire(ctx, 1)
			if err == nil {
				_ = p.Release(ctx) // the Manager is closed: ErrClosed; the lease ends it
			}
			results <- result{time.Now(), err}
		}()
	}
	time.Sleep(w.cfg.Lease / 8)
	return func(closeAt time.Time) {
		for range mgrs {
			r := <-results
			switch took := r.at.Sub(closeAt); {
			case r.err == nil:
				// Granted before Close: the server answered it before it
				// stopped. Nothing was in flight.
			case took > closeBound:
				w.hist.violation("an Acquire in flight to a stopped server returned %v after its Manager's Close was called (%v), bound %v", took.Round(time.Millisecond), r.err, closeBound)
			case !errors.Is(r.err, semaphore.ErrClosed) && took > 0 && !w.hist.nodeFaultIn(start, closeAt, n.i):
				// (A fault of the node's network or of the server in
				// force since the probe began can end the call before
				// Close, with its own error; the Acquire then gives back
				// what the call may have taken, which waits on the
				// stopped server until Close ends it, so it returns after
				// Close: soak seed ...789, a blackhole of the node that
				// had just ended.)
				w.hist.violation("an Acquire in flight to a stopped server returned %v at its Manager's Close, not ErrClosed", r.err)
			}
		}
	}
}

// closeProbeName returns a semaphore name, used by nothing else, whose
// key is on server srv.
func (w *world) closeProbeName(srvIndex int) (string, error) {
	for i := range 1000 {
		name := "probe.c" + strconv.Itoa(i)
		if w.cl == nil {
			return name, nil
		}
		owner, err := w.owner(keyspace.Key("sluice:sem:", name, ""))
		if err != nil {
			return "", err
		}
		if owner == w.servers()[srvIndex] {
			return name, nil
		}
	}
	return "", errors.New("no probe name on the stopped master")
}

// openNodes returns the nodes not closed, in order.
func (w *world) openNodes() []*node {
	var out []*node
	for _, n := range w.nodes {
		if !n.closed.Load() {
			out = append(out, n)
		}
	}
	return out
}

// probeMargin stages the race a lease exists for, once, where nothing
// else happens: node x holds a lock, the admin node waits for it, and x
// is cut off from Redis until the waiter has it. The README: "Lost closes
// before anyone else can get the lock, provided the process is scheduled
// within that margin": x's loss signal must have closed by the waiter's
// grant, allowing for the process's stalls around it (as the exclusion
// rule does). Then x's nested Lock must return the loss, and its Unlock
// must not return nil.
func (w *world) probeMargin(x *node) error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*w.cfg.Lease)
	defer cancel()
	xm, err := x.locks.NewMutex("probe.race")
	if err != nil {
		return err
	}
	ym, err := w.admin.locks.NewMutex("probe.race")
	if err != nil {
		return err
	}
	if err := xm.Lock(ctx); err != nil {
		return fmt.Errorf("x's Lock: %w", err)
	}
	var lostAt time.Time
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-xm.Lost():
			lostAt = time.Now()
		case <-ctx.Done():
		}
	}()
	granted := make(chan error, 1)
	var grantAt time.Time
	go func() {
		err := ym.Lock(ctx)
		grantAt = time.Now()
		granted <- err
	}()
	w.hist.fault(time.Now(), time.Now().Add(4*w.cfg.Lease), "probe cut", "", x.i)
	if x.cuts.Add(1) == 1 {
		x.proxy.Blackhole(true)
	}
	err = <-granted
	if x.cuts.Add(-1) == 0 {
		x.proxy.Blackhole(false)
	}
	if err != nil {
		<-watched
		return fmt.Errorf("the waiter's Lock, with the holder cut off: %w", err)
	}
	defer func() {
		rctx, rcancel := w.releaseCtx()
		defer rcancel()
		_ = ym.Unlock(rctx)
	}()
	<-watched
	if lostAt.IsZero() {
		return fmt.Errorf("the holder cut off was never told of its loss, although the waiter got the lock at %s", w.hist.since(grantAt))
	}
	w.hist.mu.Lock()
	st, _ := w.hist.stallsLocked(grantAt.Add(-w.cfg.Lease/4), lostAt)
	w.hist.mu.Unlock()
	if late := lostAt.Sub(grantAt); late > st+stallSlack {
		return fmt.Errorf("exclusion: the holder cut off was told of its loss %v after the waiter got the lock (longest stall %v)", late.Round(time.Millisecond), st.Round(time.Millisecond))
	}
	if err := xm.Lock(ctx); err == nil || !errors.Is(err, mutex.ErrLost) {
		if err == nil {
			_ = xm.Unlock(ctx)
		}
		return fmt.Errorf("the holder's nested Lock after its loss returned %s, not the loss (ErrLost)", errText(err))
	}
	if err := xm.Unlock(ctx); err == nil {
		return errors.New("the holder's Unlock after its loss returned nil")
	}
	return nil
}

// probeLateTry: a Try form's grant that comes back after the lease less
// the margin (counted from the call) is not a hold: the README says the
// Try forms then fail with ErrNotObtained. Node n's replies are delayed
// by more than a lease, so its TryLock of a free lock is answered late.
func (w *world) probeLateTry(n *node) error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*w.cfg.Lease)
	defer cancel()
	m, err := n.locks.NewMutex("probe.late")
	if err != nil {
		return err
	}
	base := w.cfg.Lease * 6 / 10 // each way: a round trip of 1.2 leases
	w.hist.fault(time.Now(), time.Now().Add(4*w.cfg.Lease), "probe lag", "", n.i)
	n.proxy.SetLatency(base, 0)
	call := time.Now()
	err = m.TryLock(ctx)
	ret := time.Now()
	n.proxy.SetLatency(0, 0)
	if err != nil {
		return nil // ErrNotObtained, as it should
	}
	rctx, rcancel := w.releaseCtx()
	defer rcancel()
	_ = m.Unlock(rctx)
	limit := w.cfg.Lease - w.cfg.Lease/10
	w.hist.mu.Lock()
	st, _ := w.hist.stallsLocked(call, ret)
	w.hist.mu.Unlock()
	if over := ret.Sub(call) - limit; over > 0 && st+stallSlack < over {
		return fmt.Errorf("late grant taken as a hold: a TryLock answered %v after its call (replies delayed %v each way) returned nil, past the lease less the margin (%v)",
			ret.Sub(call).Round(time.Millisecond), base, limit)
	}
	return nil
}

// probeLimiterBursts sends a burst of single requests to a fresh key of a
// fixed window and of a GCRA limiter, each with a period far longer than
// the burst, and counts the allowed ones against the package doc: a fixed
// window allows Rate per window (it begins with the window's first
// request, so the burst stays in one), a GCRA limiter is "a token bucket of
// Burst tokens refilled at Rate per Period": in a span s from a full
// bucket, at most Burst plus the tokens refilled in s, rounded up.
func (w *world) probeLimiterBursts() error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*w.cfg.Lease)
	defer cancel()
	period := 10 * w.cfg.Lease
	for _, tc := range []struct {
		algo  ratelimit.Algorithm
		limit ratelimit.Limit
	}{
		{ratelimit.FixedWindow, ratelimit.Limit{Rate: 5, Period: period}},
		{ratelimit.GCRA, ratelimit.Limit{Rate: 5, Period: period, Burst: 3}},
	} {
		l, err := ratelimit.New(w.admin.sc, ratelimit.Options{Algorithm: tc.algo, Limit: tc.limit, Prefix: "sluice:rl:probe:", DisableDenyCache: true})
		if err != nil {
			return err
		}
		key := "burst." + algoName(tc.algo)
		start := time.Now()
		allowed := 0
		for range 2*tc.limit.Rate + 2 {
			res, err := l.Allow(ctx, key)
			if err != nil {
				return fmt.Errorf("%s: %w", algoName(tc.algo), err)
			}
			if res.Allowed {
				allowed++
			}
		}
		span := time.Since(start)
		bound := tc.limit.Rate // one fixed window: the burst is far shorter
		if tc.algo == ratelimit.GCRA {
			bound = tc.limit.Burst + int((span*time.Duration(tc.limit.Rate)+tc.limit.Period-1)/tc.limit.Period)
		}
		if span < period/2 && allowed > bound {
			return fmt.Errorf("%s %v: %d of %d requests in %v allowed, more than %d", algoName(tc.algo), tc.limit, allowed, 2*tc.limit.Rate+2, span.Round(time.Millisecond), bound)
		}
		if err := l.Reset(ctx, key); err != nil {
			return fmt.Errorf("%s: Reset: %w", algoName(tc.algo), err)
		}
	}
	return nil
}

// probeReaderBesideWriter: while a writer holds a read-write lock, a
// reader of another Locker is refused ("readers exclude writers and
// writers exclude everyone"); once the writer has released, it gets in.
func (w *world) probeReaderBesideWriter() error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*w.cfg.Lease)
	defer cancel()
	writer, err := w.admin.locks.NewRWMutex("probe.rb")
	if err != nil {
		return err
	}
	reader, err := w.admin.fair.NewRWMutex("probe.rb")
	if err != nil {
		return err
	}
	if err := writer.Lock(ctx); err != nil {
		return fmt.Errorf("writer's Lock: %w", err)
	}
	err = reader.TryRLock(ctx)
	rctx, rcancel := w.releaseCtx()
	defer rcancel()
	if err == nil {
		_ = reader.RUnlock(rctx)
		if writer.Err() == nil {
			_ = writer.Unlock(rctx)
			return errors.New("a TryRLock got a read hold while a writer, not told of a loss, held the write lock")
		}
	} else if !errors.Is(err, mutex.ErrNotObtained) {
		_ = writer.Unlock(rctx)
		return fmt.Errorf("TryRLock while a writer holds: %w, want ErrNotObtained", err)
	}
	if err := writer.Unlock(rctx); err != nil {
		return fmt.Errorf("writer's Unlock: %w", err)
	}
	if err := reader.TryRLock(ctx); err != nil {
		return fmt.Errorf("TryRLock of a free lock: %w", err)
	}
	return reader.RUnlock(rctx)
}

// errText is err's text for a report, "<nil>" if there is none.
func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// probeUnlockAfterTakeover: A holds a lock, an operator force-unlocks it,
// B takes it, and A's Unlock comes. Mutual exclusion: C's TryLock must
// then be refused while B, not told of a loss, holds (A's Unlock must not
// have ended B's hold).
func (w *world) probeUnlockAfterTakeover() error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*w.cfg.Lease)
	defer cancel()
	rctx, rcancel := w.releaseCtx()
	defer rcancel()
	var ms [3]*mutex.Mutex
	for i := range ms {
		m, err := w.admin.locks.NewMutex("probe.u")
		if err != nil {
			return err
		}
		ms[i] = m
	}
	a, b, c := ms[0], ms[1], ms[2]
	if err := a.Lock(ctx); err != nil {
		return fmt.Errorf("the Lock of A: %w", err)
	}
	if err := w.forceUnlock(ctx, "probe.u"); err != nil {
		_ = a.Unlock(rctx)
		return fmt.Errorf("ForceUnlock: %w", err)
	}
	if err := b.Lock(ctx); err != nil {
		_ = a.Unlock(rctx)
		return fmt.Errorf("the Lock of B after the ForceUnlock: %w", err)
	}
	defer func() { _ = b.Unlock(rctx) }()
	_ = a.Unlock(rctx) // its hold is gone: ErrNotHeld or ErrLost
	if err := c.TryLock(ctx); err == nil {
		_ = c.Unlock(rctx)
		if b.Err() == nil {
			return errors.New("after A's Unlock of a hold an operator had ended, C's TryLock got the lock B held, and B was not told of a loss")
		}
	}
	return nil
}
