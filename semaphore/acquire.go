package semaphore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/obs"
	"github.com/sluicekit/sluice/scriptcache"
)

// Acquire takes n permits, waiting as long as ctx allows. If ctx ends first
// it returns an error wrapping ErrNotObtained and ctx.Err(), and holds
// nothing. n must be at least 1 and at most the capacity (ErrInvalidWeight):
// this Semaphore's, or the one SetCapacity set. A grant whose answer (or
// message) comes after the permit's lease, counted from the request's
// send, is over is not a permit: Acquire gives it back and tries again.
func (s *Semaphore) Acquire(ctx context.Context, n int64) (*Permit, error) {
	o := s.m.obs
	if o == nil {
		return s.acquireAny(ctx, n)
	}
	start := time.Now()
	p, err := s.acquireAny(ctx, n)
	s.observeAcquire(o, start, n, p, err, scriptcache.ReasonError)
	return p, err
}

// observeAcquire reports the outcome of an acquisition of n started at
// start: the permit p, or err with its reason (busy when it is none of the
// known ones).
func (s *Semaphore) observeAcquire(o scriptcache.Observer, start time.Time, n int64, p *Permit, err error, busy string) {
	if p != nil {
		o.Observe(scriptcache.Event{Kind: scriptcache.EventAcquired, Primitive: scriptcache.PrimitiveSemaphore, Name: s.event, Wait: time.Since(start), Weight: n, Handoff: p.handoff})
		return
	}
	o.Observe(scriptcache.Event{Kind: scriptcache.EventAcquireFailed, Primitive: scriptcache.PrimitiveSemaphore, Name: s.event, Wait: time.Since(start), Weight: n,
		Reason: obs.FailReason(err, ErrClosed, ErrNotReplicated, busy), Err: err})
}

// acquireAny is Acquire.
func (s *Semaphore) acquireAny(ctx context.Context, n int64) (*Permit, error) {
	if err := s.checkWeight(n); err != nil {
		return nil, err
	}
	if s.m.opts.Fair {
		return s.acquireFair(ctx, n)
	}
	id := s.newID()
	res, err := s.attempt(ctx, id, n, firstTry)
	if res.p != nil || err != nil {
		return res.p, err
	}
	return s.acquireWaiting(ctx, id, n, res)
}

// TryAcquire makes one attempt to take n permits: it returns the Permit, or
// an error wrapping ErrNotObtained if too few permits are free, or if the
// answer came when the permit's lease, counted from the request's send, was
// already over (the permit is given back: it is not held). On a fair
// semaphore it also fails while earlier waiters are queued, unless the
// weighted policy lets it pass them (see "Fair semaphores").
func (s *Semaphore) TryAcquire(ctx context.Context, n int64) (*Permit, error) {
	o := s.m.obs
	if o == nil {
		return s.tryAcquire(ctx, n)
	}
	start := time.Now()
	p, err := s.tryAcquire(ctx, n)
	busy := scriptcache.ReasonError
	if errors.Is(err, errTooFew) {
		busy = scriptcache.ReasonBusy
	}
	s.observeAcquire(o, start, n, p, err, busy)
	return p, err
}

// errTooFew is wrapped by TryAcquire's error when too few permits are free.
var errTooFew = errors.New("permits free")

// tryAcquire is TryAcquire.
func (s *Semaphore) tryAcquire(ctx context.Context, n int64) (*Permit, error) {
	if err := s.checkWeight(n); err != nil {
		return nil, err
	}
	res, err := s.attemptOnce(ctx, s.newID(), n, tryOnce)
	if res.p != nil || err != nil {
		return res.p, err
	}
	return nil, fmt.Errorf("%w: %q has fewer than %d %w", ErrNotObtained, s.name, n, errTooFew)
}

// checkWeight refuses what no capacity allows; the scripts refuse a weight
// above the capacity in force (status -2), which SetCapacity can change.
func (s *Semaphore) checkWeight(n int64) error {
	if n < 1 || n > MaxCapacity {
		return fmt.Errorf("%w: %d outside [1, %d] for %q", ErrInvalidWeight, n, int64(MaxCapacity), s.name)
	}
	return nil
}

func (s *Semaphore) notObtained(cause error) error {
	return fmt.Errorf("%w: %q: %w", ErrNotObtained, s.name, inner(cause))
}

// reply is the acquire script's answer.
type reply struct {
	status, used, capacity, wait int64
}

// attemptMode says how an attempt may wait, as the scripts are told: a
// refused Acquire marks the semaphore so that releases publish their
// wake-ups, and so does the grant of one that waited, so that its release
// wakes the waiters the wake-up that reached it did not (':w' in
// semaphore_acquire); a TryAcquire does not wait and marks nothing.
type attemptMode byte

const (
	tryOnce   attemptMode = iota // TryAcquire, Available
	firstTry                     // an Acquire's first attempt
	afterWait                    // an Acquire's attempts after it waited
)

// modeLetters are the letters the scripts take for each attemptMode
// (ARGV[5] of semaphore_acquire after the publish command, "s" or "p").
var modeLetters = [...]string{tryOnce: "t", firstTry: "a", afterWait: "w"}

// fairCall reports whether an attempt for n permits goes through the fair
// queue: on a fair semaphore, every attempt but Available's (n = 0).
func (s *Semaphore) fairCall(n int64) bool { return s.m.opts.Fair && n > 0 }

// call runs the acquire script with n permits (0: only reclaim and report),
// or on a fair semaphore the queue script ("t" for tryOnce, else "a"). If
// ctx ends before the reply comes, call returns ctx.Err() at once, also
// while waiting for replicas; the script may still run, and a permit it
// may have granted (or a queue entry it made) is released as soon as that
// late reply (or the news that none will come) arrives.
//
// semaphore_acquire gets the two keys alone: it names the wake-up channel
// after the hash when it publishes (s.keys[2] is s.keys[0] + ":w"), and
// each key sent costs the server a string and a table slot on every call.
func (s *Semaphore) call(ctx context.Context, id string, n int64, mode attemptMode) (reply, error) {
	script, keys := s.m.acquire, s.keys[:2]
	var args []string
	if s.fairCall(n) {
		q := "a"
		if mode == tryOnce {
			q = "t"
		}
		script, keys = s.m.queue, s.keys
		args = []string{q, s.capArg, strconv.FormatInt(n, 10), id, s.m.leaseMs, s.m.pubMode}
	} else {
		args = []string{s.capArg, strconv.FormatInt(n, 10), id, s.m.leaseMs, s.m.acquireFlags[mode]}
	}
	if acks := int64(s.m.opts.ReplicaAcks); acks > 0 && n > 0 {
		res, got, err := s.m.bg.ExecWaitOrLate(ctx, script, keys, args, acks, s.m.opts.ReplicaTimeout,
			func(r scriptcache.Reply, _ int64, _ error) { s.releaseLate(r, id) })
		if err != nil {
			// If the script ran and only WAIT failed, attempt releases the
			// grant, as after any failure other than ctx ending.
			return reply{}, err
		}
		r, err := s.parse(res, !s.fairCall(n))
		if err == nil && r.status == 1 && got < acks {
			// Too few replicas have it: a failover now could grant it again.
			s.cleanup(id)
			return reply{}, fmt.Errorf("%w: %q: %d of %d replicas", ErrNotReplicated, s.name, got, acks)
		}
		return r, err
	}
	var late func(scriptcache.Reply)
	if n > 0 {
		late = func(r scriptcache.Reply) { s.releaseLate(r, id) }
	}
	return s.parse(s.m.bg.ExecOrLate(ctx, script, keys, args, late), n > 0 && !s.fairCall(n))
}

// releaseLate handles the reply to an acquire (n > 0) whose caller had
// gone: it releases id unless the reply says nothing was granted (and, on
// a fair semaphore, nothing queued either). An unknown outcome (no reply at
// all) is released too; releasing an id that is not held frees nothing.
//
// It runs after the call has ended, also when Close gave the call up (the
// reply is then an error: the outcome is unknown), so its give-back goes
// after the call and cannot overtake it; after Close it has the second
// Close gives the group's work (see cleanupInGroup). A fair waiter that a
// given-up call queued would otherwise be granted permits nobody takes.
func (s *Semaphore) releaseLate(r scriptcache.Reply, id string) {
	if err := r.Error(); err != nil {
		if r.ServerError() {
			return // the script failed: nothing granted
		}
	} else if got, err := s.parse(r, !s.m.opts.Fair); err == nil && got.status != 1 && (!s.m.opts.Fair || got.status < 0) {
		return
	}
	s.cleanupInGroup(id)
}

// parse reads the acquire script's reply: semaphore_acquire's integer for
// a grant, or for a refusal with no permit free, else a table. integer
// says semaphore_acquire answered, which mostly answers an integer: that
// is tried first (reading a reply as the type it is not costs an error's
// allocations).
func (s *Semaphore) parse(res scriptcache.Reply, integer bool) (reply, error) {
	if integer {
		if v, err := res.AsInt64(); err == nil {
			return fromInteger(v)
		}
	}
	vs, err := res.ToArray()
	if err != nil {
		if !integer {
			if v, ierr := res.AsInt64(); ierr == nil {
				return fromInteger(v)
			}
		}
		return reply{}, err
	}
	if vs.Len() != 4 {
		return reply{}, fmt.Errorf("unexpected reply of %d values", vs.Len())
	}
	var r reply
	for i, dst := range []*int64{&r.status, &r.used, &r.capacity, &r.wait} {
		if *dst, err = vs.At(i).AsInt64(); err != nil {
			return reply{}, fmt.Errorf("unexpected reply: %w", err)
		}
	}
	switch r.status {
	case -1:
		return r, fmt.Errorf("%w: %q is held under capacity %d, this Semaphore has %d",
			ErrCapacityMismatch, s.name, r.capacity, s.capacity)
	case -2:
		return r, fmt.Errorf("%w: %q has capacity %d", ErrInvalidWeight, s.name, r.capacity)
	}
	if r.status < 0 {
		return r, fmt.Errorf("unexpected status %d", r.status)
	}
	return r, nil
}

// fromInteger reads semaphore_acquire's integer reply: 1, granted, or
// -1 - wait, not granted with no permit free.
func fromInteger(v int64) (reply, error) {
	switch {
	case v == 1:
		return reply{status: 1}, nil
	case v <= 0:
		return reply{status: 0, wait: -1 - v}, nil // used = capacity: none free
	}
	return reply{}, fmt.Errorf("unexpected reply %d", v)
}

// attemptResult is what one attempt found.
type attemptResult struct {
	p    *Permit       // granted; nil if not
	wait time.Duration // not granted: how long to wait before the next try
	free int64         // not granted: permits free
	sent time.Time     // when the request was sent
}

// attempt tries to take n permits for id (mode as for call) for an
// Acquire: once, or again at once, while ctx allows, after a grant whose
// answer came too late to be a hold (lease.ErrLate; given back, see
// newPermit). A fair Acquire then queues again: its entry went with the
// grant.
func (s *Semaphore) attempt(ctx context.Context, id string, n int64, mode attemptMode) (attemptResult, error) {
	for {
		res, err := s.attemptOnce(ctx, id, n, mode)
		if !errors.Is(err, lease.ErrLate) {
			return res, err
		}
		if cerr := ctx.Err(); cerr != nil {
			// The caller's deadline passed while the late answer was on
			// its way: Acquire gave up waiting, and says so.
			return res, fmt.Errorf("%w: %w", err, cerr)
		}
	}
}

// attemptOnce tries once to take n permits for id (mode as for call).
func (s *Semaphore) attemptOnce(ctx context.Context, id string, n int64, mode attemptMode) (attemptResult, error) {
	var res attemptResult
	if s.m.closed.Load() {
		return res, ErrClosed
	}
	res.sent = time.Now()
	r, err := s.call(ctx, id, n, mode)
	if err != nil {
		if errors.Is(err, ErrCapacityMismatch) || errors.Is(err, ErrNotReplicated) || errors.Is(err, ErrInvalidWeight) {
			return res, err
		}
		if errors.Is(err, ErrClosed) {
			// Close gave up the call: releaseLate gives back what it may
			// have granted or queued, once the call has ended.
			return res, fmt.Errorf("semaphore: acquire %q: %w", s.name, inner(err))
		}
		if s.m.closed.Load() {
			// Close began while the call was on its way, and the call
			// failed on its own (a reset connection, the client's timeout
			// against a stopped server) before Close gave it up: the
			// Acquire was waiting when its Manager closed, and returns
			// ErrClosed, as Close promises. No give-back here (the server
			// may not answer): a fair first attempt leaves the queue
			// (acquireFair), and the lease ends what else it did.
			return res, fmt.Errorf("semaphore: acquire %q: %w: %w", s.name, inner(ErrClosed), inner(err))
		}
		if cerr := ctx.Err(); cerr == nil || !errors.Is(err, cerr) {
			// The request failed (the connection, or WAIT after the
			// script): it may have run and granted the permit anyway. Give
			// it back so a failed Acquire holds nothing. A call abandoned
			// because ctx ended hands its late reply to releaseLate instead.
			s.cleanup(id)
		}
		if ctx.Err() != nil {
			return res, s.notObtained(ctx.Err())
		}
		return res, fmt.Errorf("semaphore: acquire %q: %w", s.name, inner(err))
	}
	if r.status == 0 {
		// Wake up when the earliest permit expires, at the latest after one
		// lease (the hint is unknown, or that permit will be renewed).
		wait := time.Duration(r.wait) * time.Millisecond
		if r.wait < 0 || wait > s.m.lease {
			wait = s.m.lease
		} else if r.wait > 0 {
			wait += time.Millisecond // past the expiry, not on it
		}
		res.wait, res.free = wait, r.capacity-r.used
		return res, nil
	}
	res.p, err = s.newPermit(ctx, id, n, res.sent)
	return res, err
}

// newPermit starts tracking the permit id of weight n granted by a request
// sent at sent. A grant whose lease, counted from sent, was over when its
// answer came is no hold (lease.Live): it is given back and newPermit
// returns an error wrapping ErrNotObtained and lease.ErrLate.
func (s *Semaphore) newPermit(ctx context.Context, id string, n int64, sent time.Time) (*Permit, error) {
	if !lease.Live(sent, s.m.lease, time.Now()) {
		s.cleanup(id)
		return nil, s.notObtained(lease.ErrLate)
	}
	p := &Permit{s: s, id: id, weight: n, lost: make(chan struct{}), since: sent}
	var lse *lease.Lease
	if s.group != nil {
		lse = s.m.keeper.AddBatched(sent, s.m.lease, s.group, p, p.lose)
	} else {
		lse = s.m.keeper.Add(sent, s.m.lease, nil, p.lose) // a fixed lease: never renewed
	}
	p.mu.Lock()
	p.lse = lse
	closed := p.err != nil && errors.Is(p.err, ErrClosed)
	p.mu.Unlock()
	if closed {
		// Close ran during the request: nobody would renew this permit.
		s.cleanup(id)
		return nil, ErrClosed
	}
	return p, nil
}
