package mutex

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/notify"
	"github.com/sluicekit/sluice/internal/scriptexec"
)

// lock is Lock; it also reports whether the lock was acquired as an
// outermost hold (not nested) and whether a fair release handed it over.
func (m *Mutex) lock(ctx context.Context) (outer, handoff bool, _ error) {
	if err := m.lossUnacked(); err != nil {
		return false, false, err
	}
	var id string
	var w *notify.Waiter
	live := false // registered on a confirmed subscription before the first attempt
	if m.l.hub.Subscribed(m.key(keyWake)) {
		// Others in this process wait on the lock, or did a moment ago:
		// register before the first attempt, so that no release after it
		// can be missed and no second attempt is needed once subscribed
		// (see notify.Waiter.Confirmed). Registering first when no
		// subscription is up would subscribe for every Lock, even the
		// many that get the lock at once.
		id = m.newAttemptID()
		var err error
		if w, err = m.l.hub.SubscribeID(m.key(keyWake), 1, id); err != nil {
			return false, false, ErrClosed
		}
		live = w.Confirmed()
	}
	res, err := m.attempt(ctx, &id, false, false)
	if res.ok || err != nil {
		if w != nil {
			w.Close() // passes on a wake-up it got meanwhile
		}
		return res.ok && !res.nested, false, ctxErr(ctx, m.Name(), err)
	}
	queued := res.queued
	if w == nil {
		if w, err = m.l.hub.SubscribeID(m.key(keyWake), 1, id); err != nil {
			m.leaveQueue(queued, id)
			return false, false, ErrClosed
		}
	}
	var entry *lease.Entry
	ok := false
	woken := false // a Wait of this Lock ended by a wake-up
	defer func() {
		entry.Stop()
		if ok {
			w.Close()
			return
		}
		if woken && !m.set.fair {
			// A release wakes one waiter per process: this Lock had its
			// process's turn, and its timer may be the only one here that
			// covers the current hold (the others may sleep on an earlier
			// holder's lease). The next local waiter tries in its place.
			w.Wake()
		}
		w.Leave() // pass on a wake-up this Lock could not use
		m.leaveQueue(queued, id)
	}()
	entry = m.trackEntry(entry, res, id, w)
	if !live {
		// Subscribed after the first attempt: a release in between was
		// missed, so once the subscription is confirmed, try again.
		if err := w.Ready(ctx, m.readyFor(res.wait)); err != nil {
			return false, false, waitErr(ctx, m.Name(), err)
		}
	}
	// An attempt answered after the lease counted from the queue entry's
	// last write known before it (lease.Live) may have found a hand-off to
	// this waiter already over and queued it again, while the hand-off's
	// message is still on its way: from then on a grant message only wakes
	// the waiter, and its next attempt finds out whether it holds the lock.
	stale := false
	for again := !live; ; again = true {
		if again {
			written := entry.Sent(res.sent)
			if res, err = m.attempt(ctx, &id, false, true); res.ok {
				ok = true
				if res.nested {
					// Another goroutine of this Mutex took the lock
					// meanwhile; this Lock nested in it.
					m.leaveQueue(queued, id)
				}
				// handed: a fair release granted it before this waiter
				// heard of the grant (its message came before the
				// subscription, or was lost).
				return !res.nested, res.handed, nil
			}
			if err != nil {
				return false, false, ctxErr(ctx, m.Name(), err)
			}
			stale = stale || !lease.Live(written, m.set.lease, time.Now())
			queued = queued || res.queued
			entry = m.trackEntry(entry, res, id, w)
		}
		if res.again {
			continue
		}
		if err := w.Wait(ctx, m.waitFor(res.wait)); err != nil {
			return false, false, waitErr(ctx, m.Name(), err)
		}
		woken = woken || w.Woken()
		if grant, got := w.TakeGrant(); got && !stale && m.l.opts.ReplicaAcks == 0 {
			// The release handed the lock to this waiter directly. (With
			// ReplicaAcks the next attempt confirms it through WAIT.)
			var gaveBack bool
			if ok, gaveBack, err = m.takeGrant(ctx, id, grant, entry.Sent(res.sent)); ok || err != nil {
				return ok, ok, err
			}
			if gaveBack {
				// Given back under id, whose tombstone now refuses it:
				// the next attempts, outermost if the other hold ends
				// first, go under a new id. The grant took the old one's
				// queue entry.
				entry.Stop()
				entry, queued = nil, false
				id = m.newAttemptID()
				w.SetID(id)
			}
		}
		if m.l.closed.Load() {
			return false, false, ErrClosed
		}
	}
}

// waitFor is how long a waiting Lock sleeps before trying again, given the
// holder's remaining lease (0: the lock is free but a fair waiter queued
// earlier has the turn, who is about to take it). A queued fair waiter
// needs no timer of its own: the Locker refreshes its entry (see
// queueEntry) and wakes it when it must act (the entry is gone, the lock
// is free, or the refreshes keep failing), as do a grant and a
// resubscription. Its timer of ten leases is only a backstop.
func (m *Mutex) waitFor(wait time.Duration) time.Duration {
	switch {
	case !m.set.fair:
		return wait
	case wait <= 0:
		return m.set.recheck
	default:
		return 10 * m.set.lease
	}
}

// readyFor is how long a Lock that subscribed after its first attempt
// waits for the subscription's confirmation before it tries again anyway.
// An unfair Lock waits as it would sleep (waitFor): no longer than the
// holder's lease. A fair one waits a re-check, as a fair Acquire does, not
// waitFor's backstop of ten leases: the keeper's wake-up (its entry is
// gone, the lock is free) does not end Ready, and a grant whose message
// came before the subscription is found only by the attempt after it, so
// a confirmation that is late (a pub/sub connection slow to come up) would
// keep it from a lock handed to it, which would sit idle until that
// grant's lease ran out.
func (m *Mutex) readyFor(wait time.Duration) time.Duration {
	if m.set.fair {
		return m.set.recheck
	}
	return m.waitFor(wait)
}

// queueEntry is a waiting fair Lock's entry in the lock's queue. The
// Locker's keeper refreshes it every recheck together with the entries of
// the other waiting Locks of its cluster slot (mutex_queue_refresh, up to
// lease.MaxBatch a call), instead of each waiter calling Redis every
// recheck. When a refresh finds the entry gone (a release handed the lock
// to the waiter and its message was lost, or the entry was dropped as
// dead), or the lock free (nobody will release it: the head must take it),
// the waiter is woken and its own attempt does what is needed. So a waiter
// granted the lock that died before it knew stalls the queue no longer
// than that grant's lease plus one recheck. The keeper tracks the entry as a
// lease of 3*recheck, so that it refreshes it every recheck; the entry
// itself lives a full lease on the server.
type queueEntry struct {
	m  *Mutex
	id string
}

// trackEntry returns the entry to keep refreshing after an attempt res of
// the Lock id: e while the keeper still refreshes it, else a new one
// counted from res, if res left the Lock queued. e may be nil.
func (m *Mutex) trackEntry(e *lease.Entry, res attemptResult, id string, w *notify.Waiter) *lease.Entry {
	if !res.queued || e.Live() {
		return e
	}
	e.Stop()
	return m.l.keeper.AddEntry(res.sent, 3*m.set.recheck, m.l.queued.Group(m.key(keyLock)), &queueEntry{m: m, id: id}, w.Wake)
}

// refreshEntries is the keeper's refresh of the queue entries of items
// (*queueEntry, all in one group) in one call.
func (l *Locker) refreshEntries(ctx context.Context, items []any, errs []error) error {
	keys := make([]string, 0, 3*len(items))
	args := make([]string, 0, 3*len(items))
	for _, it := range items {
		e := it.(*queueEntry)
		keys = append(keys, e.m.key(keyLock), e.m.key(keyQueue), e.m.key(keyEntries))
		args = append(args, e.id, e.m.owner, e.m.set.leaseMs)
	}
	vals, err := l.queueRefresh.Exec(ctx, keys, args).ToArray()
	if err != nil {
		return err
	}
	if vals.Len() != len(items) {
		return fmt.Errorf("mutex: refresh of %d queue entries answered %d", len(items), vals.Len())
	}
	for i := range len(items) {
		switch ok, err := vals.At(i).AsInt64(); {
		case err != nil:
			errs[i] = err
		case ok == 0:
			errs[i] = errNotQueued
		case ok == 2:
			errs[i] = errFreeWhileQueued
		}
	}
	return nil
}

// What a refresh reports of a waiter that must look for itself: it is no
// longer queued, or the lock it is queued on is free (see
// mutex_queue_refresh). Both end the keeper's refreshes and wake the waiter.
var (
	errNotQueued       = fmt.Errorf("%w: not queued", lease.ErrGone)
	errFreeWhileQueued = fmt.Errorf("%w: lock free while queued", lease.ErrGone)
)

// leaveQueue takes a fair Lock that gives up out of the queue, and gives
// back the lock if a release handed it over meanwhile.
//
// A Lock that ends because the Locker was closed (Close ran while it
// waited, or while its attempt was in flight) may get here after Close
// has closed the background group, which then takes nothing more. Left
// in the queue, its entry would live for up to a lease, and a release
// could hand it the lock, which nobody would hold until that lease ended.
// So the give-back is then sent from here, before Lock returns, bounded
// as one in the background would be after Close.
func (m *Mutex) leaveQueue(queued bool, id string) {
	if !queued || m.l.giveBack(m, id) {
		return
	}
	ctx, cancel := scriptexec.AfterClose(m.set.lease)
	defer cancel()
	m.l.sendGiveBack(ctx, m, id)
}

// takeGrant starts the hold that a release handed to the waiting Lock id.
// sent is when the waiter's last attempt, which found it still queued, was
// sent: the grant came after that attempt reached Redis, and its lease ends
// when that attempt's queue entry would have, so the lease is counted from
// then.
//
// gaveBack reports that another goroutine of this Mutex held it already, so
// the grant was given back (it releases the grant if still current, and
// leaves a tombstone for id) and the Lock must go on under a new id.
func (m *Mutex) takeGrant(ctx context.Context, id, grant string, sent time.Time) (ok, gaveBack bool, _ error) {
	token, err := strconv.ParseInt(grant, 10, 64)
	if err != nil {
		return false, false, nil // not ours to parse: try again the slow way
	}
	m.op.Lock()
	defer m.op.Unlock()
	m.mu.Lock()
	holds := m.holds
	m.mu.Unlock()
	if holds > 0 {
		// Another goroutine of this Mutex holds it already; give the
		// grant back and nest on the next attempt.
		m.l.giveBack(m, id)
		return false, true, nil
	}
	if err := m.startHold(ctx, sent, token, 1); err != nil {
		if errors.Is(err, lease.ErrLate) {
			return false, false, nil // given back: the next attempt queues again
		}
		return false, false, err
	}
	return true, false, nil
}

// waitErr is Lock's error on name when waiting for a release failed: the
// Locker was closed, ctx ended, or Redis refused the subscription (an ACL
// without channel permissions), which Lock reports rather than polling at
// the pace of the holder's lease. RWMutex uses it too.
func waitErr(ctx context.Context, name string, err error) error {
	switch {
	case errors.Is(err, notify.ErrClosed):
		return ErrClosed
	case ctx.Err() != nil:
		return notObtained(name, err)
	}
	return fmt.Errorf("mutex: lock %q: %w", name, inner(err))
}
