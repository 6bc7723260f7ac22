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
//
// They run beside the wake-up probes, on names nothing else uses
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
			w.hist.violation("MultiMutex nested Lock probe: %v", err)
		}
	})
	wg.Wait()
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
		return fmt.Errorf("Lock of %s: %w", batchNames[0], err)
	}
	defer func() {
		rctx, rcancel := w.releaseCtx()
		defer rcancel()
		_ = victim.Unlock(rctx) // lost by design: ErrNotHeld, or the string's WRONGTYPE
	}()
	if err := bystander.Lock(ctx); err != nil {
		return fmt.Errorf("Lock of %s: %w", batchNames[1], err)
	}
	key := keyspace.Key("sluice:mutex:", batchNames[0], "")
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
		return fmt.Errorf("Unlock of %s, renewed in one batch with %s whose key an operator overwrote with a string: %w", batchNames[1], batchNames[0], err)
	}
	return nil
}

func (w *world) probeSetNest() error {
	ctx, cancel := context.WithTimeout(context.Background(), 4*w.cfg.Lease)
	defer cancel()
	names := []string{"probe.n0", "probe.n1"}
	mm, err := w.admin.locks.NewMultiMutex(names)
	if err != nil {
		return err
	}
	if err := mm.Lock(ctx); err != nil {
		return fmt.Errorf("Lock: %w", err)
	}
	defer func() {
		rctx, rcancel := w.releaseCtx()
		defer rcancel()
		_ = mm.Unlock(rctx) // lost by design: ErrNotHeld; gives back the other member
	}()
	// The second member in the set's order: the first stays held.
	if err := w.delKeys(mm.Names()[1]); err != nil {
		return fmt.Errorf("DEL of %s: %w", mm.Names()[1], err)
	}
	del := time.Now()
	select {
	case <-mm.Lost():
	case <-ctx.Done():
		return fmt.Errorf("the set was not told of its member %s's loss in %v", mm.Names()[1], time.Since(del).Round(time.Millisecond))
	}
	err = mm.Lock(ctx)
	switch {
	case err == nil:
		return errors.New("a nested Lock after a member's loss returned nil: it joined a hold that was gone")
	case !errors.Is(err, mutex.ErrLost):
		return fmt.Errorf("a nested Lock after a member's loss returned %v, not the loss (ErrLost)", err)
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
			case !errors.Is(r.err, semaphore.ErrClosed) && took > 0:
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
