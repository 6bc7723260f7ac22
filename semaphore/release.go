package semaphore

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicekit/sluice/internal/scriptexec"
	"github.com/sluicekit/sluice/scriptcache"
)

// Release gives the permits back and wakes waiters. It returns an error
// wrapping ErrNotHeld if they were not held any more (released before,
// expired, deleted); nothing else is freed then. Whether they expired is
// asked of the server once the lease's deadline on this client's clock
// (HeldUntil) has passed, or a loss was reported; before it, the server's
// lease has at least the margin left, and permits it still lists were
// counted all along, so nobody else was granted them. If Release fails
// with any other error (the reply was lost), calling it again is safe: it
// never frees anything but this permit, and answers ErrNotHeld if the
// first call did release it. Either way the permit is no longer renewed,
// so at worst it expires within one lease.
func (p *Permit) Release(ctx context.Context) error {
	p.op.Lock()
	defer p.op.Unlock()
	p.mu.Lock()
	released, lse, lostErr := p.released, p.lse, p.err
	// The keeper decides a loss under its own lock and reports it after:
	// one decided before the Stop below can arrive while the release is in
	// flight, and must not be signalled if the release then succeeds.
	p.releasing = !released
	p.stopped = true
	p.mu.Unlock()
	if released {
		return fmt.Errorf("%w: %q: released before", ErrNotHeld, p.s.name)
	}
	// The server need not judge whether the permit expired while the
	// lease's deadline on this client's clock has not passed: the server's
	// lease ends a margin after it, at least (semaphore_release's "n").
	judge := lostErr != nil || !lse.Live(time.Now())
	// Stop renewing first: if the release fails, the permit must not be
	// kept alive by the watchdog forever.
	lse.Stop()
	held, err := releaseHeld(p.s.releaseCall(ctx, p.id, judge), p.s.m.opts.Fair)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releasing = false
	deferred := p.deferred
	p.deferred = nil
	if held == 1 {
		p.released = true
		if len(p.scoped) > 0 {
			p.scoped.End(fmt.Errorf("%w: %q: released", ErrNotHeld, p.s.name))
		}
		if o := p.s.m.obs; o != nil {
			o.Observe(scriptcache.Event{Kind: scriptcache.EventReleased, Primitive: scriptcache.PrimitiveSemaphore, Name: p.s.event, Hold: time.Since(p.since), Weight: p.weight})
		}
		return nil
	}
	if deferred != nil {
		p.loseLocked(deferred)
	}
	if err != nil || held < 0 {
		// Not renewed any more: work under Context stops here, as after a
		// release that succeeded.
		p.scoped.End(fmt.Errorf("%w: %q: release failed, not renewed", ErrNotHeld, p.s.name))
	}
	if err != nil {
		return fmt.Errorf("semaphore: release %q: %w", p.s.name, inner(err))
	}
	if held < 0 {
		return fmt.Errorf("semaphore: release %q: unexpected reply", p.s.name)
	}
	if lostErr == nil {
		// Redis says it is gone before the watchdog noticed. Recorded
		// before the permit counts as released, which loseLocked ignores.
		p.loseLocked(fmt.Errorf("%w: %q: found not held at release", ErrLost, p.s.name))
		lostErr = p.err
	}
	p.released = true
	return fmt.Errorf("%w: %w", ErrNotHeld, inner(lostErr))
}

// releaseCall runs the release script for id: on a fair semaphore the
// queue script, which also takes id out of the queue, grants what it frees
// to the waiters and always judges whether the permit expired. An unfair
// release is told not to judge it unless judge (semaphore_release's "n"):
// a caller whose clock says the lease is not over passes false. It sends
// the two keys alone, as call does to semaphore_acquire (the script names
// the channel after the hash). See releaseHeld for the reply.
func (s *Semaphore) releaseCall(ctx context.Context, id string, judge bool) scriptcache.Reply {
	if s.m.opts.Fair {
		return s.m.queue.Exec(ctx, s.keys, []string{"r", s.capArg, "0", id, "0", s.m.pubMode})
	}
	if judge {
		return s.m.release.Exec(ctx, s.keys[:2], []string{id, s.m.pubMode})
	}
	return s.m.release.Exec(ctx, s.keys[:2], []string{id, s.m.pubMode, "n"})
}

// releaseHeld reads the reply of releaseCall: held is 1 if the permit was
// held and is now released, 0 if it was not held, -1 if the reply is not
// one of those. semaphore_release answers held alone, semaphore_queue (a
// fair semaphore's) {held, used}: each is read as the type it is, since
// reading a reply as another type costs an error's allocations.
func releaseHeld(r scriptcache.Reply, fair bool) (held int64, err error) {
	if fair {
		var vs scriptcache.Array
		if vs, err = r.ToArray(); err == nil {
			if vs.Len() != 2 {
				return -1, fmt.Errorf("unexpected reply of %d values", vs.Len())
			}
			held, err = vs.At(0).AsInt64()
		}
	} else {
		held, err = r.AsInt64()
	}
	if err != nil || held != 0 && held != 1 {
		return -1, err
	}
	return held, nil
}

// cleanup releases id (on a fair semaphore also its queue entry), best
// effort, for an Acquire that fails (its caller waits for it): within
// cleanupTimeout, or a second after Close, as every give-back of the
// Manager (a second of its own if Close came first), so that a server
// that stopped answering holds the Acquire no longer than Close. The
// caller's ctx may be done already, and did not bound it either.
func (s *Semaphore) cleanup(id string) {
	var ctx context.Context
	var cancel context.CancelFunc
	if s.m.bg.Closed() {
		ctx, cancel = scriptexec.AfterClose(cleanupTimeout)
	} else {
		ctx, cancel = s.m.bg.Bounded(cleanupTimeout)
	}
	defer cancel()
	s.releaseCall(ctx, id, true)
}

// cleanupInGroup is cleanup run in a goroutine of the Manager's group,
// which Close ends at once rather than wait cleanupTimeout for a server
// that stopped answering: the lease ends what is left.
func (s *Semaphore) cleanupInGroup(id string) {
	ctx, cancel := s.m.bg.Bounded(cleanupTimeout)
	defer cancel()
	s.releaseCall(ctx, id, true)
}
