package mutex

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/obs"
	"github.com/sluicekit/sluice/scriptcache"
)

// heldMutex is a Mutex as the keeper sees it: the holder of its leases,
// told of a loss with the gen of the hold that had it, and the item that
// renewLeases renews. A type of its own keeps LeaseLost out of Mutex's
// methods.
type heldMutex Mutex

// LeaseLost records the loss of acquisition gen.
func (h *heldMutex) LeaseLost(gen uint64, err error) { (*Mutex)(h).lose(gen, err) }

// renewLeases is the watchdog's renewal of the current holds of items
// (*heldMutex, all with the watchdog lease, in one group) in one call.
func (l *Locker) renewLeases(ctx context.Context, items []any, errs []error) error {
	keys := make([]string, len(items))
	args := make([]string, 1+2*len(items))
	args[0] = (*Mutex)(items[0].(*heldMutex)).set.leaseMs // the Locker's WatchdogLease, as every watchdog hold has
	for i, it := range items {
		m := (*Mutex)(it.(*heldMutex))
		keys[i] = m.key(keyLock)
		m.mu.Lock()
		args[1+2*i], args[2+2*i] = m.owner, m.tokenArg
		m.mu.Unlock()
	}
	vals, err := l.renewBatch.Exec(ctx, keys, args).ToArray()
	if err != nil {
		return err
	}
	if vals.Len() != len(items) {
		return fmt.Errorf("mutex: renewal of %d locks answered %d", len(items), vals.Len())
	}
	for i := range len(items) {
		switch ok, err := vals.At(i).AsInt64(); {
		case err != nil:
			errs[i] = err
		case ok == 0:
			errs[i] = errRenewGone
		case ok < 0:
			errs[i] = lease.ErrWrongType
		}
	}
	return nil
}

// errRenewGone is the loss reason when the watchdog finds a hold gone.
var errRenewGone = fmt.Errorf("%w: deleted, expired or taken over", lease.ErrGone)

// errFoundNotHeld is the loss reason when a nested Lock finds the hold it
// was to nest in gone.
var errFoundNotHeld = errors.New("found not held at nested lock")

// lose records the loss of acquisition gen.
func (m *Mutex) lose(gen uint64, cause error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gen != gen || m.holds == 0 {
		return // already released, or a later acquisition
	}
	if m.releasing {
		if m.pending == nil {
			m.pending = cause // decided when the final Unlock's reply comes
		}
		return
	}
	m.loseLocked(cause)
}

// loseLocked declares the current hold lost. Called with m.mu held.
func (m *Mutex) loseLocked(cause error) {
	m.holds, m.lse, m.unacked = 0, nil, true
	m.orphaned = true // tokenArg's hold
	m.err = fmt.Errorf("%w: %q: %w", ErrLost, m.Name(), inner(lossCause(cause)))
	if o := m.l.obs; o != nil { // before the holder is told
		o.Observe(scriptcache.Event{Kind: scriptcache.EventLost, Primitive: m.set.prim, Name: m.Name(), Hold: time.Since(epoch) - m.since, Weight: 1,
			Reason: obs.LossReason(cause), Err: m.err})
	}
	m.closeLost()
	m.endScopedLocked(m.err)
	if !m.set.fair {
		// A hold that ends without a release publishes nothing. A release
		// woke one waiter of this process, which may be this hold; the
		// others sleep on the lease they saw, maybe an earlier holder's
		// (issue 32's soak: a waiter 1.6 s late after a hold left to
		// expire). One of them tries now in this hold's place. (Fair
		// waiters are woken by their queue's refresh.)
		m.l.hub.WakeOne(m.key(keyWake))
	}
}

// lossCause is the cause a holder is told: the lease keeper's closing is
// the Locker's Close, so it wraps ErrClosed (as a Permit's loss does).
func lossCause(cause error) error {
	if errors.Is(cause, lease.ErrClosed) {
		return fmt.Errorf("%w: %w", ErrClosed, inner(cause))
	}
	return cause
}

// dropHold declares the current hold lost without a word to Redis, after
// a give-back that failed: the watchdog stops renewing it, the server's
// lease ends it, and a later Unlock gives back what the server may still
// keep (as after any loss).
func (m *Mutex) dropHold(cause error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.holds == 0 {
		return
	}
	if m.lse != nil {
		m.lse.Stop()
	}
	m.loseLocked(cause)
	m.unacked = false // the caller was never given this hold
}

// closeLost closes the current hold's Lost channel. Called with m.mu held.
func (m *Mutex) closeLost() {
	if m.lost != nil {
		close(m.lost)
	}
	m.lost = closedChan
}
