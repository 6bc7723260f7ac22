package mutex

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicekit/sluice/internal/scriptexec"
	"github.com/sluicekit/sluice/scriptcache"
)

// Unlock gives back one hold; the last one releases the lock and wakes a
// waiter. It returns an error wrapping ErrNotHeld if this Mutex does not
// hold the lock; after a loss the error wraps Err too, and the first such
// Unlock also gives back what the server may still keep of the lost hold
// (the lease margin, a renewal whose reply was late), so that it does not
// block others for the rest of its lease. If Unlock fails with any other
// error (the reply was lost), the hold is still counted and calling Unlock
// again is safe: it never removes two.
//
// A final Unlock that succeeds is never followed by a loss signal for that
// hold: a loss reported while it is in flight (a renewal that ran just after
// the release and found the key gone) is dropped, since the release itself
// proves that the hold lasted until then.
func (m *Mutex) Unlock(ctx context.Context) error {
	m.op.Lock()
	defer m.op.Unlock()
	m.mu.Lock()
	holds, tokenArg, lostErr, heldGen, orphaned := m.holds, m.tokenArg, m.err, m.gen, m.orphaned
	switch holds {
	case 0:
		m.orphaned, m.unacked = false, false
	case 1:
		m.releasing = true // gen stays heldGen: starting a hold takes m.op
	}
	m.mu.Unlock()
	if holds == 0 {
		if orphaned {
			m.unlockCall(ctx, 1, tokenArg)
		}
		if lostErr != nil {
			return fmt.Errorf("%w: %w", ErrNotHeld, inner(lostErr))
		}
		return fmt.Errorf("%w: %q", ErrNotHeld, m.Name())
	}
	left, err := m.unlockCall(ctx, holds, tokenArg).AsInt64()
	m.mu.Lock()
	defer m.mu.Unlock()
	pending := m.pending
	m.releasing, m.pending = false, nil
	if err != nil {
		if pending != nil && m.gen == heldGen && m.holds > 0 {
			m.loseLocked(pending)
		}
		return fmt.Errorf("mutex: unlock %q: %w", m.Name(), inner(err))
	}
	if m.gen != heldGen || m.holds == 0 {
		// The hold was declared lost while this call was in flight (a
		// partial Unlock; a final one defers the loss). A partial Unlock
		// leaves holds that the next Unlock gives back.
		m.unacked = false // told now
		return fmt.Errorf("%w: %w", ErrNotHeld, inner(m.err))
	}
	if left < 0 {
		// Redis says we do not hold it, before our watchdog noticed.
		if m.lse != nil {
			m.lse.Stop()
		}
		m.loseLocked(errors.New("found not held at unlock"))
		m.orphaned, m.unacked = false, false
		return fmt.Errorf("%w: %w", ErrNotHeld, inner(m.err))
	}
	m.holds = left
	if left == 0 {
		if m.lse != nil {
			m.lse.Stop()
			m.lse = nil
		}
		m.token, m.lost = 0, nil
		if m.scoped != nil {
			m.endScopedLocked(fmt.Errorf("%w: %q: released", ErrNotHeld, m.Name()))
		}
		if o := m.l.obs; o != nil {
			o.Observe(scriptcache.Event{Kind: scriptcache.EventReleased, Primitive: m.set.prim, Name: m.Name(), Hold: time.Since(epoch) - m.since, Weight: 1})
		}
	}
	return nil
}

// unlockCall runs mutex_release's Unlock mode for the acquisition named by
// token, with the given hold count (as sent). Called with m.op held.
//
// An unfair Mutex sends only the lock's record and channel: the queue's
// keys matter only when fair waiters queued, and then the script asks for
// every key (-2) before it changes anything, and gets them at once.
func (m *Mutex) unlockCall(ctx context.Context, holds int64, token string) scriptcache.Reply {
	argv := [5]string{m.l.relModes[relUnlock], m.set.keepMs, m.owner, token}
	nargs := 4
	if holds > 1 {
		argv[4], nargs = strconv.FormatInt(holds, 10), 5
	}
	keys := m.releaseKeys()
	if !m.set.fair {
		r := m.l.release.Exec(ctx, keys[:2], argv[:nargs])
		if n, err := r.AsInt64(); err != nil || n != -2 {
			return r
		}
	}
	return m.l.release.Exec(ctx, keys[:], argv[:nargs])
}

// Indexes of Locker.relModes.
const (
	relUnlock = iota
	relGiveBack
	relForce
)

// releaseGrant gives back, at once, a grant with the given token that this
// Mutex will not keep (too few replicas, a stale nested hold, a closed
// Locker). It runs even if ctx has ended. Called with m.op held.
//
// The caller may have left, so its context plays no part: the call ends
// after a lease (the lease ends the grant anyway) or a second after the
// Locker's Close, so that a server that cannot take it (paused, cut off)
// holds neither the Lock nor Close up.
func (m *Mutex) releaseGrant(_ context.Context, token int64) {
	ctx, cancel := m.l.grantBound(m.set.lease)
	defer cancel()
	m.unlockCall(ctx, 1, strconv.FormatInt(token, 10))
}

// grantBound is the context of a grant's give-back (releaseGrant): it ends
// after lease or a second after Close; on a closed Locker (a grant whose
// answer came after Close) it gives the call that second from now, or
// the lease if shorter.
func (l *Locker) grantBound(lease time.Duration) (context.Context, context.CancelFunc) {
	if l.bg.Closed() {
		return scriptexec.AfterClose(lease)
	}
	return l.bg.Bounded(lease)
}

// ForceUnlock releases the lock whoever holds it and wakes a waiter. It
// reports whether the lock was held. The holder learns of it at its next
// renewal (or Unlock) and is told through Lost.
func (m *Mutex) ForceUnlock(ctx context.Context) (bool, error) {
	keys := m.releaseKeys()
	n, err := m.l.release.Exec(ctx, keys[:], []string{m.l.relModes[relForce], m.set.keepMs}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("mutex: force unlock %q: %w", m.Name(), inner(err))
	}
	return n == 1, nil
}
