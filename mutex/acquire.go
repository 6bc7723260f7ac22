package mutex

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/obs"
	"github.com/sluicekit/sluice/scriptcache"
)

// Lock acquires the lock, or one more hold of it if this Mutex already holds
// it, waiting as long as ctx allows. If ctx ends first it returns an error
// wrapping ErrNotObtained and ctx.Err(), and holds nothing more. A grant
// whose answer comes after its lease, counted from the request's send, is
// over is no hold: Lock gives it back and tries again. A nested Lock
// answered after the hold's lease is over returns ErrLost.
func (m *Mutex) Lock(ctx context.Context) error {
	o := m.l.obs
	if o == nil {
		_, _, err := m.lock(ctx)
		return err
	}
	start := time.Now()
	outer, handoff, err := m.lock(ctx)
	m.observeAcquire(o, start, outer, handoff, err, scriptcache.ReasonError)
	return err
}

// observeAcquire reports the outcome of an acquisition started at start:
// an outermost hold (handed over or not), or err with its reason (busy
// when it is none of the known ones).
func (m *Mutex) observeAcquire(o scriptcache.Observer, start time.Time, outer, handoff bool, err error, busy string) {
	switch {
	case err != nil:
		o.Observe(scriptcache.Event{Kind: scriptcache.EventAcquireFailed, Primitive: m.set.prim, Name: m.Name(), Wait: time.Since(start), Weight: 1,
			Reason: obs.FailReason(err, ErrClosed, ErrNotReplicated, busy), Err: err})
	case outer:
		o.Observe(scriptcache.Event{Kind: scriptcache.EventAcquired, Primitive: m.set.prim, Name: m.Name(), Wait: time.Since(start), Weight: 1, Handoff: handoff})
	}
}

// TryLock makes one attempt: it returns nil if the lock is now held by this
// Mutex, or an error wrapping ErrNotObtained if another owner holds it (or,
// for a fair Mutex, if the lock is free but others wait in its queue), or if
// the answer came when the lease it granted, counted from the request's
// send, was already over (the grant is given back: it is not a hold).
func (m *Mutex) TryLock(ctx context.Context) error {
	o := m.l.obs
	if o == nil {
		_, err := m.tryLock(ctx)
		return err
	}
	start := time.Now()
	outer, err := m.tryLock(ctx)
	busy := scriptcache.ReasonError
	if errors.Is(err, errHeld) {
		busy = scriptcache.ReasonBusy
	}
	m.observeAcquire(o, start, outer, false, err, busy)
	return err
}

// errHeld is wrapped by TryLock's error when another owner holds the lock.
var errHeld = errors.New("is held")

// tryLock is TryLock; it also reports whether it took an outermost hold.
func (m *Mutex) tryLock(ctx context.Context) (bool, error) {
	if err := m.lossUnacked(); err != nil {
		return false, err
	}
	var id string
	res, err := m.attempt(ctx, &id, true, false)
	for err == nil && res.again {
		res, err = m.attempt(ctx, &id, true, false)
	}
	if res.ok || err != nil {
		return res.ok && !res.nested, ctxErr(ctx, m.Name(), err)
	}
	return false, fmt.Errorf("%w: %q %w", ErrNotObtained, m.Name(), errHeld)
}

// lossUnacked returns the loss (wrapping ErrLost) of a hold the caller
// got and has not released since with Unlock, or nil. Until that Unlock a
// Lock or TryLock would join, as a nested hold, a hold that is gone: it
// fails with the loss instead, and the loss is never erased by a fresh
// hold started in its place.
func (m *Mutex) lossUnacked() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.unacked {
		return fmt.Errorf("%w (Unlock releases it)", m.err)
	}
	return nil
}

// attemptResult is what one run of the lock script found.
type attemptResult struct {
	ok     bool          // held now
	nested bool          // ... as one more hold of an outer one
	handed bool          // ... because a release handed it to this attempt
	queued bool          // not held; a fair Lock is in the queue
	again  bool          // not held; a fair call dropped dead queue entries and must call again at once
	wait   time.Duration // not held: the holder's remaining lease, or 0
	sent   time.Time     // when the request was sent
}

// attempt runs the lock script once. An outermost attempt uses the Lock
// call's attempt id, *id, made here on the first attempt. A fair try
// respects the queue without joining it. waited tells an unfair Lock's
// attempt after a refusal: if it takes the lock, it marks the record so that
// its release publishes a wake-up (the one it was woken by may have been
// the only one its process got; see mutex_lock's w).
//
// A grant whose answer came too late to be a hold (lease.ErrLate: given
// back at once) fails a TryLock with an error wrapping ErrNotObtained; a
// waiting Lock tries again at once, as long as ctx allows. A fair Lock
// then queues again: its entry went with the grant.
func (m *Mutex) attempt(ctx context.Context, id *string, try, waited bool) (attemptResult, error) {
	for {
		res, err := m.attemptOnce(ctx, id, try, waited)
		if try || !errors.Is(err, lease.ErrLate) || ctx.Err() != nil {
			return res, err
		}
	}
}

// attemptOnce is one run of attempt.
func (m *Mutex) attemptOnce(ctx context.Context, id *string, try, waited bool) (attemptResult, error) {
	var res attemptResult
	if m.l.closed.Load() {
		return res, ErrClosed
	}
	m.op.Lock()
	defer m.op.Unlock()
	m.mu.Lock()
	holds, heldGen, tokenArg := m.holds, m.gen, m.tokenArg
	m.mu.Unlock()

	res.sent = time.Now()
	if holds > 0 {
		return res, m.nestOnce(ctx, heldGen, holds, tokenArg, &res)
	}
	if *id == "" {
		*id = m.nextAttemptID()
	}
	// On the stack: a rueidis call does not keep them (see
	// scriptcache.Cache.eval), and other clients get copies.
	argv := [4]string{m.set.leaseMs, m.owner, *id}
	nargs := 3
	switch {
	case m.set.fair && try:
		argv[3] = "t"
	case m.set.fair:
		argv[3] = "f"
	case waited:
		argv[3] = "w"
	}
	if argv[3] != "" {
		nargs = 4
	}
	keys := m.lockKeys()
	nkeys := len(keys) // a fair call's enqueue writes the entries, KEYS[4]
	if !m.set.fair {
		nkeys--
	}
	var r lockReply
	var err error
	acks := int64(-1) // not asked
	if m.l.opts.ReplicaAcks > 0 {
		var rr scriptcache.Reply
		attempt := *id
		// Copies on the heap: the call may outlive this Lock (its caller
		// left), and its NOSCRIPT retry resends them.
		rr, acks, err = m.l.bg.ExecWaitOrLate(ctx, m.l.lock, slices.Clone(keys[:nkeys]), slices.Clone(argv[:nargs]), int64(m.l.opts.ReplicaAcks), m.l.opts.ReplicaTimeout,
			func(late scriptcache.Reply, _ int64, _ error) {
				// Whatever the replicas said, nobody waits for this grant.
				if grantedOrUnknown(late) || m.set.fair {
					m.l.giveBack(m, attempt)
				}
			})
		if err == nil {
			r, err = parseLockReply(rr)
		} else if !leftToLate(ctx, err) && (grantedOrUnknown(rr) || m.set.fair) {
			// The call failed on its own (the connection, or WAIT after
			// the script): it may have granted, and no late func will
			// run for it. Give it back, as below.
			m.abandonAttempt(try, *id)
		}
	} else {
		rep := m.l.lock.Exec(ctx, keys[:nkeys], argv[:nargs])
		if r, err = parseLockReply(rep); err != nil && !rep.ServerError() {
			// ctx ended before the reply, or the connection failed: the
			// attempt may run, or have run.
			m.abandonAttempt(try, *id)
		}
	}
	if err != nil {
		if !errors.Is(err, ErrClosed) && m.l.closed.Load() {
			// Close began while the call was on its way, and the call
			// failed on its own before Close gave it up: the Lock was
			// waiting when its Locker closed, and returns ErrClosed, as
			// Close promises (the give-back above went first).
			return res, fmt.Errorf("mutex: lock %q: %w: %w", m.Name(), inner(ErrClosed), inner(err))
		}
		return res, fmt.Errorf("mutex: lock %q: %w", m.Name(), inner(err))
	}
	got, n := r.got, r.n
	if got == 0 {
		switch {
		case n == -2: // free, but a fair waiter before this one has the turn
			res.wait = 0
		case n == -3:
			// 16 dead queue entries dropped, more may follow: the call
			// neither took the lock nor queued, and nothing will wake a
			// waiter for it (no release is coming); call again at once.
			res.again = true
			return res, nil
		case n < 0:
			res.wait = m.set.lease // no TTL: someone set the key by hand
		default:
			res.wait = max(time.Duration(n)*time.Millisecond, time.Millisecond)
		}
		res.queued = m.set.fair && !try
		return res, nil
	}
	token := r.token
	if acks >= 0 && acks < int64(m.l.opts.ReplicaAcks) {
		// Too few replicas have it: a failover now could hand it to
		// someone else, so give it back.
		m.releaseGrant(ctx, token)
		return res, fmt.Errorf("%w: %q: %d of %d replicas", ErrNotReplicated, m.Name(), acks, m.l.opts.ReplicaAcks)
	}
	if err := m.startHold(ctx, res.sent, token, n); err != nil {
		return res, err
	}
	res.ok, res.handed = true, got == 2
	return res, nil
}

// nestOnce runs mutex_nest for a Lock of a Mutex that holds acquisition
// gen (holds of it, with the token tokenArg), and records the hold it
// grants. Called with m.op held.
func (m *Mutex) nestOnce(ctx context.Context, gen uint64, holds int64, tokenArg string, res *attemptResult) error {
	argv := [3]string{m.owner, tokenArg, strconv.FormatInt(holds, 10)}
	keys := [1]string{m.key(keyLock)}
	n, err := m.l.nest.Exec(ctx, keys[:], argv[:]).AsInt64()
	if err != nil {
		return fmt.Errorf("mutex: lock %q: %w", m.Name(), inner(err))
	}
	if n < 0 {
		// The outer hold is gone (expired, deleted, taken over): the
		// outer section no longer excludes anyone. Report the loss; never
		// start a new hold the caller would take for the old.
		return m.foundNotHeld(gen)
	}
	return m.nest(gen, n, res)
}

// nest records the nested hold a Lock's reply granted (n holds now) in
// acquisition gen. The nested Lock leaves the lease alone, so its answer
// extends nothing: if it came when the hold's lease was over on the client
// (the keeper was about to declare it lost), the hold is lost and Lock
// reports it instead of joining a hold that may have ended. Either way,
// once lost, the server counted one more hold of that acquisition; the
// Unlock that gives back the orphan releases it whatever its count. Called
// with m.op held.
func (m *Mutex) nest(gen uint64, n int64, res *attemptResult) error {
	m.mu.Lock()
	lse := m.lse
	m.mu.Unlock()
	if lse != nil && !lse.Live(time.Now()) {
		m.lose(gen, lease.ErrExpired)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gen != gen || m.holds == 0 {
		return m.err // declared lost while the call was in flight, or just now
	}
	m.holds = n
	res.ok, res.nested = true, true
	return nil
}

// newAttemptID names a new outermost attempt.
func (m *Mutex) newAttemptID() string {
	m.op.Lock()
	defer m.op.Unlock()
	return m.nextAttemptID()
}

// nextAttemptID names a new outermost attempt: "nonce.seq", seq increasing
// per Mutex value. Called with m.op held.
func (m *Mutex) nextAttemptID() string {
	m.attempts++
	var buf [64]byte // on the stack: the id's one allocation is the string
	return string(strconv.AppendUint(append(append(buf[:0], m.nonce()...), '.'), m.attempts, 10))
}

// startHold records an outermost hold with the given token and starts
// watching its lease, counted from sent. A grant whose lease, so counted,
// was over when its answer came is no hold (lease.Live): it is given back
// and startHold returns an error wrapping ErrNotObtained and lease.ErrLate.
// Called with m.op held.
func (m *Mutex) startHold(ctx context.Context, sent time.Time, token, n int64) error {
	if !lease.Live(sent, m.set.lease, time.Now()) {
		m.releaseGrant(ctx, token)
		return notObtained(m.Name(), lease.ErrLate)
	}
	m.mu.Lock()
	m.gen++
	gen := m.gen
	m.holds, m.token, m.err, m.lost, m.orphaned, m.unacked = n, token, nil, nil, false, false
	m.since = sent.Sub(epoch)
	m.tokenArg = strconv.FormatInt(token, 10)
	m.mu.Unlock()
	// A nil group: a fixed lease, watched but not renewed.
	lse := m.l.keeper.AddHeld(sent, m.set.lease, m.group, (*heldMutex)(m), gen)
	m.mu.Lock()
	if m.gen == gen && m.holds > 0 {
		m.lse = lse
		m.mu.Unlock()
		return nil
	}
	// Lost before it could be tracked: the Locker was closed during the
	// call (nobody would renew it) or its lease has already run out. The
	// caller is told by Lock's error, and gets no hold to Unlock.
	lostErr := m.err
	m.unacked = false
	m.mu.Unlock()
	m.releaseGrant(ctx, token)
	if errors.Is(lostErr, lease.ErrClosed) {
		return ErrClosed
	}
	return fmt.Errorf("%w: %w", ErrNotObtained, inner(lostErr))
}

// foundNotHeld records that the server no longer has acquisition gen,
// as a nested Lock found, and returns the loss error.
func (m *Mutex) foundNotHeld(gen uint64) error {
	m.mu.Lock()
	lse := m.lse
	if m.gen == gen && m.holds > 0 {
		m.lse = nil
	} else {
		lse = nil
	}
	m.mu.Unlock()
	if lse != nil {
		lse.Stop() // it would renew the stale token
	}
	m.lose(gen, errFoundNotHeld)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	return fmt.Errorf("%w: %q: %w", ErrLost, m.Name(), errFoundNotHeld)
}

// lockReply is mutex_lock's answer: got is 1 when the lock is held (2
// when this attempt held it already), with n holds and the token; 0 when
// refused, with n the remaining lease in ms or a code (-1 no TTL, -2 a fair
// waiter has the turn, -3 call again at once).
type lockReply struct{ got, n, token int64 }

// parseLockReply decodes the reply r to an outermost Lock. The common
// answers are one integer: a grant's token, or -1 - the remaining lease in
// ms of a refusal; the others a table of three.
func parseLockReply(r scriptcache.Reply) (lockReply, error) {
	if err := r.Error(); err != nil {
		return lockReply{}, err
	}
	if v, err := r.AsInt64(); err == nil {
		if v > 0 {
			return lockReply{got: 1, n: 1, token: v}, nil
		}
		if v < 0 {
			return lockReply{n: -1 - v}, nil
		}
		return lockReply{}, errors.New("unexpected reply 0")
	}
	a, err := r.ToArray()
	if err != nil {
		return lockReply{}, err
	}
	if a.Len() != 3 {
		return lockReply{}, fmt.Errorf("unexpected reply of %d values", a.Len())
	}
	var out lockReply
	out.got, _ = a.At(0).AsInt64()
	out.n, _ = a.At(1).AsInt64()
	out.token, _ = a.At(2).AsInt64()
	return out, nil
}

// grantedOrUnknown reports whether the reply to an outermost lock attempt
// shows that it took the lock, or cannot tell (the connection failed).
func grantedOrUnknown(r scriptcache.Reply) bool {
	if r.Error() != nil {
		return !r.ServerError()
	}
	res, err := parseLockReply(r)
	return err == nil && res.got >= 1
}

// abandonAttempt undoes an attempt whose outcome is unknown: nobody would
// know of its grant (or its queue entry). The give-back goes at once; its
// tombstone makes it work in whichever order the two reach Redis. A fair
// Lock's attempt may have queued: it leaves the queue even after Close
// (see leaveQueue).
func (m *Mutex) abandonAttempt(try bool, attempt string) {
	if m.set.fair && !try {
		m.leaveQueue(true, attempt)
	} else {
		m.l.giveBack(m, attempt)
	}
}

// leftToLate reports whether ExecWaitOrLate returned err because its
// caller left (ctx ended, or Close gave the call up): the call's late func
// then gets its reply. Any other error is the call's own, and no late func
// runs for it.
func leftToLate(ctx context.Context, err error) bool {
	if errors.Is(err, ErrClosed) {
		return true
	}
	cerr := ctx.Err()
	return cerr != nil && errors.Is(err, cerr)
}

// giveBack releases, in the background, the lock an abandoned outermost
// attempt took: its caller stopped waiting and the late reply shows a grant,
// or the connection failed with the outcome unknown. Nobody would know of
// the hold, and everyone would wait out its lease. It is sent only once the
// attempt can no longer run after it (rueidis spreads calls over several
// connections, so sending it earlier could overtake the attempt), and it
// names the attempt, so it leaves alone any hold a later attempt made.
// Once the Locker is closed, nothing is sent (the lease will end it) and
// giveBack reports false; see leaveQueue for the one exception.
func (l *Locker) giveBack(m *Mutex, attempt string) bool {
	return l.bg.Go(func() {
		ctx, cancel := l.bg.Bounded(m.set.lease) // Close ends it too
		defer cancel()
		l.sendGiveBack(ctx, m, attempt)
	})
}

// sendGiveBack runs mutex_release's give-back of attempt.
func (l *Locker) sendGiveBack(ctx context.Context, m *Mutex, attempt string) {
	keys := m.releaseKeys()
	l.release.Exec(ctx, keys[:], []string{l.relModes[relGiveBack], m.set.keepMs, m.owner, attempt, m.set.leaseMs})
}

func notObtained(name string, cause error) error {
	return fmt.Errorf("%w: %q: %w", ErrNotObtained, name, inner(cause))
}

// ctxErr turns a failed call on name into ErrNotObtained when it failed
// because ctx ended, so callers see one error for "gave up waiting" however
// it happened.
func ctxErr(ctx context.Context, name string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		return notObtained(name, cerr)
	}
	// rueidis may see the deadline pass before the context's own timer
	// has fired.
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return notObtained(name, err)
	}
	return err
}
