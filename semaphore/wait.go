package semaphore

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

// waitFor is how long a waiting Acquire sleeps before trying again, given
// the script's hint (when the earliest permit expires). A queued fair
// waiter needs no timer of its own: the Manager refreshes its entry (see
// queueEntry) and wakes it when it must act (its entry is gone, permits
// expired or are free for the queue's head, the refreshes keep failing),
// as do a grant, a wake-up budget and a resubscription. Waking every
// waiter when the earliest permit expires would make them all call Redis
// where one call is enough. Its timer of ten leases is only a backstop.
func (m *Manager) waitFor(wait time.Duration) time.Duration {
	if m.opts.Fair {
		return 10 * m.lease
	}
	return wait
}

// leave takes a fair waiter that gives up out of the queue, and gives back
// a grant that reached it meanwhile: in the background, so that Acquire
// returns as soon as its context ends, or, once Close has stopped waiting
// for the background, before Acquire returns ErrClosed. Left in the queue,
// the entry would be granted permits nobody takes for a lease. After Close
// the leave has a second at most (scriptexec.AfterClose), as Close gives the group's own
// give-backs, so that a server that stopped answering holds the Acquire
// up no longer (it held it up to cleanupTimeout).
func (m *Manager) leave(s *Semaphore, id string) {
	if m.bg.Go(func() { s.cleanupInGroup(id) }) {
		return
	}
	ctx, cancel := scriptexec.AfterClose(s.m.lease)
	defer cancel()
	s.releaseCall(ctx, id, true)
}

// acquireWaiting is the unfair Acquire of n permits for id after its first
// attempt res was refused: it subscribes to the semaphore's wake-ups and
// attempts again when one comes (or the earliest permit expiry passes).
// Every attempt from here is told that the Acquire waited (see afterWait).
func (s *Semaphore) acquireWaiting(ctx context.Context, id string, n int64, res attemptResult) (*Permit, error) {
	w, err := s.m.hub.Subscribe(s.keys[2], n)
	if err != nil {
		return nil, ErrClosed // the only error of Subscribe
	}
	var p *Permit
	defer func() {
		if p != nil {
			w.Close()
		} else {
			w.Leave() // pass on a wake-up this Acquire could not use
		}
	}()
	// Try again only once the subscription is confirmed: a release between
	// the first attempt and the subscription would otherwise be missed.
	if err := w.Ready(ctx, res.wait); err != nil {
		return nil, s.waitErr(err)
	}
	for {
		if res, err = s.attempt(ctx, id, n, afterWait); res.p != nil || err != nil {
			p = res.p
			return p, err
		}
		// Woken but too few free: the rest may fit waiters behind this one.
		w.PassOn(res.free)
		if err := w.Wait(ctx, res.wait); err != nil {
			return nil, s.waitErr(err)
		}
	}
}

// acquireFair is Acquire of a fair semaphore: the first attempt queues, and
// the waiter then takes the grant a release sends it. The Manager keeps
// its queue entry alive meanwhile (see queueEntry), and wakes it to attempt
// again when a refresh finds that it must: the grant's message was lost,
// its entry was dropped, or a grant pass is due that no release will run.
//
// A grant message published before the waiter's subscription is confirmed
// is missed, so a waiter that subscribes after its first attempt attempts
// again once subscribed. When the process already has a confirmed
// subscription of the semaphore (other waiters use it, or did a moment
// ago), the waiter registers on it before its first attempt instead, and
// then nothing can be missed and that second attempt is not needed: a job
// costs the queueing attempt and the release that grants. (Registering
// first when no subscription is up would subscribe for every Acquire, even
// the many that are granted at once.)
func (s *Semaphore) acquireFair(ctx context.Context, n int64) (p *Permit, err error) {
	id := s.newID()
	var w *notify.Waiter
	live := false // registered on a confirmed subscription before the first attempt
	if s.m.hub.Subscribed(s.keys[2]) {
		if w, err = s.m.hub.SubscribeID(s.keys[2], n, id); err != nil {
			return nil, ErrClosed // the only error of SubscribeID
		}
		live = w.Confirmed()
	}
	res, err := s.attempt(ctx, id, n, firstTry)
	if res.p != nil || err != nil {
		if w != nil {
			w.Close()
		}
		if errors.Is(err, ErrClosed) && !res.sent.IsZero() {
			// Close gave the attempt up (see attemptOnce): it may have
			// queued id, and a waiter that Close ends leaves the queue.
			// Sent now, this may reach Redis before the attempt, whose
			// late reply then makes releaseLate leave again; with no
			// reply in Close's second, this is the only leave.
			s.m.leave(s, id)
		}
		return res.p, err
	}
	if w == nil {
		if w, err = s.m.hub.SubscribeID(s.keys[2], n, id); err != nil {
			s.m.leave(s, id)
			return nil, ErrClosed
		}
	}
	var entry *lease.Entry
	defer func() {
		entry.Stop()
		if p != nil {
			w.Close()
			return
		}
		w.Leave()
		s.m.leave(s, id)
	}()
	entry = s.trackEntry(entry, res, id, n, w)
	if !live {
		// Not the backstop: a refresh's wake-up does not end Ready, and a
		// grant whose message came before the subscription is found only
		// by the attempt after it.
		if err := w.Ready(ctx, s.m.recheck); err != nil {
			return nil, s.waitErr(err)
		}
	}
	// A grant message that had arrived before an attempt that still found
	// this waiter queued is stale (its permit expired since); grants are
	// not told apart, so from then on only attempts count. So is one still
	// on its way: an attempt may have found a grant expired and queued the
	// waiter again before the grant's message arrives. That takes an
	// attempt whose answer came after the lease counted from the entry's
	// last write known before it (lease.Live): a grant lasts until the
	// entry it was made for would have, at least that long. It is then
	// stale too.
	stale := false
	for again := !live; ; again = true {
		if again {
			_, before := w.Granted()
			written := entry.Sent(res.sent)
			if res, err = s.attempt(ctx, id, n, afterWait); res.p != nil || err != nil {
				return res.p, err
			}
			stale = stale || before || !lease.Live(written, s.m.lease, time.Now())
			entry = s.trackEntry(entry, res, id, n, w)
		}
		if err := w.Wait(ctx, s.m.waitFor(res.wait)); err != nil {
			return nil, s.waitErr(err)
		}
		if grant, got := w.Granted(); got && !stale && s.m.opts.ReplicaAcks == 0 {
			// A release granted the permits to this waiter. (With
			// ReplicaAcks the next attempt confirms them through WAIT.)
			if p, err = s.takeGrant(ctx, id, n, grant, entry.Sent(res.sent)); p != nil || err != nil {
				if p != nil {
					p.handoff = true
				}
				return p, err
			}
		}
		if s.m.closed.Load() {
			return nil, ErrClosed
		}
	}
}

// takeGrant makes the Permit that a release granted to the waiting Acquire
// id. sent is when the request that last wrote the waiter's queue entry
// (its own last attempt, or the Manager's last refresh of it) was sent: the
// grant came after that request ran, and the permit expires when the entry
// would have, so its lease is counted from then.
func (s *Semaphore) takeGrant(ctx context.Context, id string, n int64, grant string, sent time.Time) (*Permit, error) {
	if w, err := strconv.ParseInt(grant, 10, 64); err != nil || w != n {
		return nil, nil // not ours to read: the next attempt finds out
	}
	p, err := s.newPermit(ctx, id, n, sent)
	if errors.Is(err, lease.ErrLate) {
		return nil, nil // given back: the next attempt queues again
	}
	return p, err
}

// queueEntry is a waiting fair Acquire's entry in the semaphore's queue.
// The Manager's keeper refreshes it every recheck together with the
// entries of the other waiting Acquires of its cluster slot
// (semaphore_queue_refresh, up to lease.MaxBatch a call), instead of each
// waiter calling Redis every recheck. A refresh that finds the entry gone
// (a release granted the waiter permits and the message was lost, or the
// entry was dropped as dead) ends the refreshes and wakes the waiter,
// whose own attempt then finds its permit or queues again. One that finds
// a grant pass due that no release will run (a permit expired without a
// release, permits free for the queue's head, a capacity lowered below the
// waiter's weight) wakes one waiter of the semaphore and goes on: its
// attempt runs the pass for the whole queue. So permits whose holder died
// reach the queue within a recheck of their expiry. The keeper tracks the
// entry as a lease of 3*recheck, so that it refreshes it every recheck;
// the entry itself lives a full lease on the server.
type queueEntry struct {
	s      *Semaphore
	id     string
	weight string
	w      *notify.Waiter
}

// trackEntry returns the entry to keep refreshing after an attempt res of
// the Acquire id of n permits, which left it queued: e while the keeper
// still refreshes it, else a new one counted from res. e may be nil.
func (s *Semaphore) trackEntry(e *lease.Entry, res attemptResult, id string, n int64, w *notify.Waiter) *lease.Entry {
	if e.Live() {
		return e
	}
	e.Stop()
	qe := &queueEntry{s: s, id: id, weight: strconv.FormatInt(n, 10), w: w}
	return s.m.keeper.AddEntry(res.sent, 3*s.m.recheck, s.qgroup, qe, w.Wake)
}

// refreshEntries is the keeper's refresh of the queue entries of items
// (*queueEntry, all in one group) in one call. Each semaphore's keys are
// sent once, with the entries of it in the call pointing at them.
func (m *Manager) refreshEntries(ctx context.Context, items []any, errs []error) error {
	keys := batchKeys{which: queueKeys, keys: make([]string, 0, 8)}
	args := make([]string, 1+3*len(items))
	args[0] = m.leaseMs
	for i, it := range items {
		e := it.(*queueEntry)
		args[1+3*i], args[2+3*i], args[3+3*i] = keys.number(e.s), e.id, e.weight
	}
	vals, err := m.queueRefresh.Exec(ctx, keys.keys, args).ToArray()
	if err != nil {
		return err
	}
	if vals.Len() != len(items) {
		return fmt.Errorf("semaphore: refresh of %d queue entries answered %d", len(items), vals.Len())
	}
	for i, it := range items {
		switch state, err := vals.At(i).AsInt64(); {
		case err != nil:
			errs[i] = err
		case state == 0:
			errs[i] = errNotQueued
		case state == 2:
			// Refreshed, and its own attempt is needed (see
			// semaphore_queue_refresh); the refreshes go on.
			it.(*queueEntry).w.Wake()
		}
	}
	return nil
}

// errNotQueued is what a refresh reports of a waiter no longer queued (see
// semaphore_queue_refresh): it ends the keeper's refreshes and wakes the
// waiter.
var errNotQueued = fmt.Errorf("%w: not queued", lease.ErrGone)

// waitErr turns an error of notify's Ready or Wait into Acquire's.
func (s *Semaphore) waitErr(err error) error {
	switch {
	case errors.Is(err, notify.ErrClosed):
		return ErrClosed
	case errors.Is(err, notify.ErrSubscribe):
		return fmt.Errorf("semaphore: acquire %q: %w", s.name, inner(err))
	default:
		return s.notObtained(err)
	}
}
