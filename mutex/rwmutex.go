package mutex

// The read-write lock. It shares a Locker's watchdog, subscriptions and
// give-back machinery with Mutex and follows the same rules for owners,
// leases, loss, fencing tokens and abandoned attempts; this file only
// describes where it differs.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/obs"
	"github.com/sluicekit/sluice/scriptcache"
)

// ErrUpgrade means Lock was called on an RWMutex that holds read holds but
// not the write lock. Upgrading in place would deadlock as soon as two
// readers tried it at once; release the read holds first (a writer may take
// read holds, so the other way round, downgrading, works).
var ErrUpgrade = errors.New("mutex: write lock requested while holding only read holds")

// maxWriterMark bounds the writer-waiting mark (see RWMutex).
const maxWriterMark = 2 * time.Second

// rwScripts are the read-write lock's scripts, looked up once per RWMutex.
type rwScripts struct {
	lock, rlock, unlock, runlock, renewBatch, abandon, force, info *scriptcache.Script
}

func (l *Locker) rwScripts() (*rwScripts, error) {
	s := &rwScripts{}
	for name, dst := range map[string]**scriptcache.Script{
		"rwmutex_lock": &s.lock, "rwmutex_rlock": &s.rlock, "rwmutex_unlock": &s.unlock,
		"rwmutex_runlock": &s.runlock, "rwmutex_renew_batch": &s.renewBatch, "rwmutex_abandon": &s.abandon,
		"rwmutex_force": &s.force, "rwmutex_info": &s.info,
	} {
		var err error
		if *dst, err = l.sc.Script(name); err != nil {
			return nil, fmt.Errorf("mutex: %w", err)
		}
	}
	return s, nil
}

// NewRWMutex returns an RWMutex for the read-write lock called name, with
// its own owner id. It does not talk to Redis. WithOwner and WithLease work
// as for NewMutex; the lease applies to the write and the read holds alike.
// Fair mode (Options.Fair, WithFair) does not apply: an RWMutex has its own
// policy, described on the type. With Options.ReplicaAcks set, write and
// read acquisitions alike wait for the replicas.
//
// A read-write lock and a Mutex of the same name are different locks (their
// keys differ): they do not exclude each other.
func (l *Locker) NewRWMutex(name string, opts ...LockOption) (*RWMutex, error) {
	if err := keyspace.CheckName(name); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidName, err)
	}
	// The options are written for a Mutex; apply them to a scratch one and
	// take what they set.
	scratch := &Mutex{l: l, set: &l.defaults}
	for _, opt := range opts {
		if err := opt.applyTo(scratch); err != nil {
			return nil, err
		}
	}
	s, err := l.rwScripts()
	if err != nil {
		return nil, err
	}
	p := l.opts.Prefix
	h, z, tomb := keyspace.Key(p, name, ":rw.h"), keyspace.Key(p, name, ":rw.z"), keyspace.Key(p, name, ":rw.t")
	marks := keyspace.Key(p, name, ":rw.m")
	rch, wch := keyspace.Key(p, name, ":rw.rd"), keyspace.Key(p, name, ":rw.wr")
	rw := &RWMutex{
		l:           l,
		s:           s,
		name:        name,
		owner:       scratch.owner,
		lease:       scratch.set.lease,
		watchdog:    scratch.set.watchdog,
		leaseMs:     scratch.set.leaseMs,
		keepMs:      scratch.set.keepMs,
		mark:        min(scratch.set.lease, maxWriterMark),
		lockKeys:    []string{h, z, tomb, marks},
		unlockKeys:  []string{h, rch, wch},
		runlockKeys: []string{z, wch},
		renewKeys:   []string{h, z},
		abandonKeys: []string{h, z, tomb, rch, wch, marks},
		forceKeys:   []string{h, z, rch, wch},
		rch:         rch,
		wch:         wch,
	}
	rw.markMs = strconv.FormatInt(rw.mark.Milliseconds(), 10)
	if rw.owner == "" {
		rw.owner = uuid.NewString()
	}
	rw.nonce = strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
	rw.w.rw, rw.w.write, rw.r.rw = rw, true, rw
	if rw.watchdog {
		rw.group = l.rwGroups.Group(h)
	}
	return rw, nil
}

// RWMutex is one owner of one named read-write lock: any number of readers
// or one writer at a time.
//
// # Holds
//
// Lock takes the write lock and RLock a read hold; both nest, and each
// Unlock or RUnlock undoes one. An RWMutex that holds the write lock may
// also take read holds (they then go through whatever is waiting) and keep
// them after its Unlock: that downgrades the lock without letting a writer
// in between. The opposite, Lock while holding only read holds, returns
// ErrUpgrade at once instead of deadlocking.
//
// As with Mutex, the owner is the value: goroutines that must exclude each
// other need an RWMutex each, even readers that share (two goroutines
// calling RLock on one value just nest).
//
// # Writers are not starved
//
// A Lock that finds the lock taken (by readers or another writer) leaves a
// writer-waiting mark in Redis that lasts min(lease, 2 s) and renews it on
// each of its attempts, at least every third of that. While any waiting
// writer's mark runs, new readers are refused; readers that already hold
// may still nest, and the writer's own read holds go through, so the
// readers drain and the writer gets in, taking its mark out. A writer that
// gives up (or fails: its last attempt's reply was lost) withdraws its
// mark; every mark is its Lock call's own, so neither a grant nor a
// withdrawal ends the mark of another waiting writer, even one of the
// same RWMutex value. One that crashes holds up new readers for one mark
// at most. TryLock
// leaves no mark. Among waiting writers there is no queue: whichever tries
// first after a release wins, as with Mutex. The policy prefers writers:
// while writers keep arriving, new readers wait. A waiting writer makes one
// attempt per third of the mark even if nothing wakes it, to renew its mark
// and to notice readers whose leases ran out.
//
// Because of the mark, a goroutine that holds a read hold through one
// RWMutex and asks for another read hold of the same name through a second
// RWMutex can deadlock against a waiting writer (the writer waits for the
// first hold, the second waits for the writer); nest on one value instead.
//
// # Leases
//
// The write lock and every read acquisition have a lease of their own,
// renewed by the Locker's watchdog (or a fixed lease, WithLease), and the
// server judges each from its own end time: a crashed reader's hold ends
// with its lease and no longer keeps writers out. The watchdog renews the
// write and read holds of all read-write locks of one cluster slot
// together, up to 512 per script call, and each hold is answered on its
// own: one found gone is lost alone. Expired readers are
// removed at most 16 at a time by later acquisitions, so no call's work
// grows with a crowd of dead readers; until then they are only ignored.
//
// # Loss
//
// Lost's channel closes at the first loss of any hold this value has (the
// write lock or its read acquisition) and stays closed until the value
// holds nothing and acquires again; Err says which hold was lost and why.
// The rules of Mutex apply to each kind of hold: a loss reported during a
// final Unlock or RUnlock counts only if the release fails, and the first
// Unlock or RUnlock after a loss gives back what Redis may still keep.
//
// # Fencing tokens
//
// Each outermost write acquisition gets a token, strictly greater than
// those of every earlier write acquisition of the name, with the same
// caveats as Mutex tokens. Read holds get none.
//
// # Waking
//
// Waiting writers and waiting readers listen on two channels. A writer's
// release (Unlock, the give-back of an abandoned Lock, ForceUnlock) wakes
// one waiting writer per process and every waiting reader; while a
// writer-waiting mark runs, a reader is refused again and waits for the end
// of the mark, so a mark left by a writer that crashed holds it up no
// longer. A writer that gives up wakes the readers when its withdrawal ends
// the mark or brings its end forward. The last reader's release wakes one
// waiting writer per process. A reader whose lease runs out publishes
// nothing, so a writer refused by readers sleeps until the first of their
// leases ends (at most a third of the mark), not the last: when the
// readers that outlast it release, the expired one no longer counts.
//
// # Keys
//
// A read-write lock named N uses PREFIX{N}:rw.h (the writer, the last token
// and the writer-waiting mark), PREFIX{N}:rw.z (read acquisitions by lease
// end), PREFIX{N}:rw.m (waiting writers' marks by end), PREFIX{N}:rw.t
// (tombstones of abandoned attempts) and the channels
// PREFIX{N}:rw.rd (readers) and PREFIX{N}:rw.wr (writers), all in one cluster
// slot. Every key has a TTL no longer than the longest lease or mark it
// covers; a free lock leaves nothing after min(1 s, lease), or a lease
// after an abandoned attempt.
//
// Its methods are safe for concurrent use.
type RWMutex struct {
	l                                                         *Locker
	s                                                         *rwScripts
	name                                                      string
	owner                                                     string
	lease                                                     time.Duration
	watchdog                                                  bool
	group                                                     *lease.Group // renews the watchdog's leases with others; nil for a fixed lease
	leaseMs, keepMs, markMs                                   string
	mark                                                      time.Duration // writer-waiting mark
	lockKeys, unlockKeys, runlockKeys, renewKeys, abandonKeys []string
	forceKeys                                                 []string
	rch, wch                                                  string // readers' and writers' wake-up channels
	nonce                                                     string // random; attempt ids are nonce.seq

	op       sync.Mutex // one script call at a time, so hold counts stay in step
	attempts uint64     // outermost attempts so far, names each; guarded by op

	mu   sync.Mutex // guards the fields below; never held across a call
	w, r rwSide
	gen  uint64        // counts outermost acquisitions of either kind
	lost chan struct{} // made on demand by Lost; closedChan once lost
	err  error
	// scoped cancels the contexts Context made while something is held.
	scoped lease.Scopes
}

// rwSide is the state of one kind of hold (write or read) of an RWMutex,
// and what the watchdog renews for its current hold. Its fields, except rw
// and write, are guarded by RWMutex.mu.
type rwSide struct {
	rw    *RWMutex // set once
	write bool     // set once

	holds int64
	since time.Time // when the current hold began; kept only with an observer
	id    string    // write: the token as sent; read: the acquisition id
	token int64     // write only
	gen   uint64    // of the current acquisition
	lse   *lease.Lease
	// releasing is the gen whose final release is in flight; a loss
	// reported meanwhile waits in pending (see Mutex.Unlock).
	releasing uint64
	pending   error
	// orphan is the id of a hold declared lost that the server may still
	// keep; the next release gives it back.
	orphan string
	// unacked: a hold of this kind the caller got was lost and no release
	// of this kind has been called since (see Mutex.unacked).
	unacked bool
}

func (rw *RWMutex) side(write bool) *rwSide {
	if write {
		return &rw.w
	}
	return &rw.r
}

func kind(write bool) string {
	if write {
		return "write"
	}
	return "read"
}

// Name returns the lock's name.
func (rw *RWMutex) Name() string { return rw.name }

// Owner returns this RWMutex's owner id.
func (rw *RWMutex) Owner() string { return rw.owner }

// Lock acquires the write lock, or one more write hold if this RWMutex
// already holds it, waiting as long as ctx allows. If ctx ends first it
// returns an error wrapping ErrNotObtained and ctx.Err(), holds nothing
// more, and withdraws its writer-waiting mark. Late grants and late nested
// answers are handled as by Mutex.Lock.
func (rw *RWMutex) Lock(ctx context.Context) error { return rw.observed(ctx, true, false) }

// RLock takes a read hold, or one more if this RWMutex already has one,
// waiting as long as ctx allows; errors as for Lock.
func (rw *RWMutex) RLock(ctx context.Context) error { return rw.observed(ctx, false, false) }

// TryLock makes one attempt at the write lock: nil if it is now held by
// this RWMutex, an error wrapping ErrNotObtained if readers or another
// writer hold it, or if the grant came too late to be a hold (see
// Mutex.TryLock). It leaves no writer-waiting mark.
func (rw *RWMutex) TryLock(ctx context.Context) error { return rw.observed(ctx, true, true) }

// TryRLock makes one attempt at a read hold: nil if granted, an error
// wrapping ErrNotObtained if a writer holds the lock or waits for it, or if
// the grant came too late to be a hold (see Mutex.TryLock).
func (rw *RWMutex) TryRLock(ctx context.Context) error { return rw.observed(ctx, false, true) }

// observed runs acquire, or try if try is set, and reports its outcome
// when the Locker has an observer: an outermost hold of the kind, or the
// failure.
func (rw *RWMutex) observed(ctx context.Context, write, try bool) error {
	o := rw.l.obs
	if o == nil {
		if try {
			return rw.try(ctx, write)
		}
		return rw.acquire(ctx, write)
	}
	start := time.Now()
	var err error
	if try {
		err = rw.try(ctx, write)
	} else {
		err = rw.acquire(ctx, write)
	}
	if err != nil {
		busy := scriptcache.ReasonError
		if errors.Is(err, errHeld) {
			busy = scriptcache.ReasonBusy
		}
		o.Observe(scriptcache.Event{Kind: scriptcache.EventAcquireFailed, Primitive: scriptcache.PrimitiveRWMutex, Name: rw.name, Wait: time.Since(start), Weight: 1,
			Reason: obs.FailReason(err, ErrClosed, ErrNotReplicated, busy), Err: err})
		return err
	}
	rw.mu.Lock()
	sd := rw.side(write)
	outer := sd.holds == 1
	if outer {
		sd.since = time.Now()
	}
	rw.mu.Unlock()
	if outer {
		o.Observe(scriptcache.Event{Kind: scriptcache.EventAcquired, Primitive: scriptcache.PrimitiveRWMutex, Name: rw.name, Wait: time.Since(start), Weight: 1})
	}
	return nil
}

// lossUnacked returns the loss (wrapping ErrLost) of a hold, of either
// kind, that the caller got and has not released since, or nil: until
// that release, Lock and RLock would join a hold that is gone, and fail
// with the loss instead (as Mutex.Lock does).
func (rw *RWMutex) lossUnacked() error {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.w.unacked || rw.r.unacked {
		return fmt.Errorf("%w (Unlock or RUnlock releases it)", rw.err)
	}
	return nil
}

func (rw *RWMutex) try(ctx context.Context, write bool) error {
	if err := rw.lossUnacked(); err != nil {
		return err
	}
	ok, _, err := rw.attempt(ctx, write, "")
	if ok || err != nil {
		return ctxErr(ctx, rw.name, err)
	}
	return fmt.Errorf("%w: %q (%s) %w", ErrNotObtained, rw.name, kind(write), errHeld)
}

func (rw *RWMutex) acquire(ctx context.Context, write bool) (err error) {
	if err := rw.lossUnacked(); err != nil {
		return err
	}
	mark := ""
	if write {
		// A refused attempt leaves this Lock's writer-waiting mark; take
		// it back unless this Lock ends up holding (the grant took it
		// out). Also when the first attempt fails: refused, its reply may
		// have been lost.
		mark = rw.newMarkID()
		defer func() {
			if err != nil && !errors.Is(err, ErrUpgrade) {
				rw.giveBack(mark, "m", mark)
			}
		}()
	}
	ok, wait, err := rw.attemptInTime(ctx, write, mark)
	if ok || err != nil {
		return ctxErr(ctx, rw.name, err)
	}
	ch := rw.rch
	if write {
		ch = rw.wch
	}
	wt, err := rw.l.hub.Subscribe(ch, 1)
	if err != nil {
		return ErrClosed
	}
	defer func() {
		if ok {
			wt.Close()
		} else {
			wt.Leave()
		}
	}()
	if err := wt.Ready(ctx, rw.capWait(write, wait)); err != nil {
		return waitErr(ctx, rw.name, err)
	}
	for {
		if ok, wait, err = rw.attemptInTime(ctx, write, mark); ok {
			return nil
		}
		if err != nil {
			return ctxErr(ctx, rw.name, err)
		}
		if err := wt.Wait(ctx, rw.capWait(write, wait)); err != nil {
			return waitErr(ctx, rw.name, err)
		}
		if rw.l.closed.Load() {
			return ErrClosed
		}
	}
}

// attemptInTime is attempt for a waiting Lock or RLock: a grant that came
// too late to be a hold (given back) is followed at once by another
// attempt, as long as ctx allows. TryLock and TryRLock fail on it instead.
func (rw *RWMutex) attemptInTime(ctx context.Context, write bool, mark string) (bool, time.Duration, error) {
	for {
		ok, wait, err := rw.attempt(ctx, write, mark)
		if !errors.Is(err, lease.ErrLate) || ctx.Err() != nil {
			return ok, wait, err
		}
	}
}

// capWait bounds a waiting writer's sleep so that it renews its mark in
// time.
func (rw *RWMutex) capWait(write bool, wait time.Duration) time.Duration {
	if write {
		return min(wait, rw.mark/3)
	}
	return wait
}

// newMarkID names the writer-waiting mark of one Lock call: an id of the
// attempt ids' form that no attempt uses.
func (rw *RWMutex) newMarkID() string {
	rw.op.Lock()
	defer rw.op.Unlock()
	rw.attempts++
	return rw.nonce + "." + strconv.FormatUint(rw.attempts, 10)
}

// attempt runs the lock or rlock script once. It reports whether the hold
// is now taken and, if not, how long to wait before trying again. mark
// names the writer-waiting mark a write attempt leaves if refused ("":
// none). A grant whose answer came too late to be a hold is given back,
// and attempt returns an error wrapping ErrNotObtained and lease.ErrLate
// (see attemptInTime).
func (rw *RWMutex) attempt(ctx context.Context, write bool, mark string) (bool, time.Duration, error) {
	if rw.l.closed.Load() {
		return false, 0, ErrClosed
	}
	rw.op.Lock()
	defer rw.op.Unlock()
	rw.mu.Lock()
	sd := rw.side(write)
	holds, heldGen, id := sd.holds, sd.gen, sd.id
	writeToken := ""
	if rw.w.holds > 0 {
		writeToken = rw.w.id
	}
	upgrade := write && holds == 0 && rw.r.holds > 0
	rw.mu.Unlock()
	if upgrade {
		return false, 0, fmt.Errorf("%w: %q", ErrUpgrade, rw.name)
	}

	sent := time.Now()
	var script *scriptcache.Script
	var argv []string
	attemptID := ""
	if holds == 0 {
		rw.attempts++
		attemptID = rw.nonce + "." + strconv.FormatUint(rw.attempts, 10)
	}
	if write {
		script = rw.s.lock
		markMs := "0"
		if mark != "" {
			markMs = rw.markMs
		}
		argv = []string{rw.owner, rw.leaseMs, strconv.FormatInt(holds, 10), attemptID, id, markMs, mark}
	} else {
		script = rw.s.rlock
		ref := attemptID
		if holds > 0 {
			ref = id
		}
		argv = []string{rw.owner, rw.leaseMs, strconv.FormatInt(holds, 10), ref, writeToken}
	}
	kindArg := "r"
	if write {
		kindArg = "w"
	}
	var r scriptcache.Array
	var err error
	acks := int64(-1) // not asked
	if rw.l.opts.ReplicaAcks > 0 && holds == 0 {
		var res scriptcache.Reply
		res, acks, err = rw.l.bg.ExecWaitOrLate(ctx, script, rw.lockKeys, argv, int64(rw.l.opts.ReplicaAcks), rw.l.opts.ReplicaTimeout,
			func(late scriptcache.Reply, _ int64, _ error) {
				if grantedOrUnknown(late) {
					rw.giveBack(attemptID, kindArg, mark)
				}
			})
		if err == nil {
			r, err = res.ToArray()
		} else if !leftToLate(ctx, err) {
			// The call failed on its own: it may have granted, or left
			// a mark, and no late func runs for it (see
			// Mutex.attemptOnce).
			rw.giveBack(attemptID, kindArg, mark)
		}
	} else {
		rep := script.Exec(ctx, rw.lockKeys, argv)
		if r, err = rep.ToArray(); err != nil && holds == 0 && !rep.ServerError() {
			// The outcome is unknown and nobody would know of a grant:
			// give it back at once (see Mutex, abandoned attempts), and
			// the mark a refusal would have left.
			rw.giveBack(attemptID, kindArg, mark)
		}
	}
	if err != nil {
		if !errors.Is(err, ErrClosed) && rw.l.closed.Load() {
			// As for Mutex: a Lock waiting when its Locker closed
			// returns ErrClosed, though its call failed on its own.
			return false, 0, fmt.Errorf("mutex: lock %q (%s): %w: %w", rw.name, kind(write), inner(ErrClosed), inner(err))
		}
		return false, 0, fmt.Errorf("mutex: lock %q (%s): %w", rw.name, kind(write), inner(err))
	}
	if r.Len() != 3 {
		return false, 0, fmt.Errorf("mutex: lock %q (%s): unexpected reply of %d values", rw.name, kind(write), r.Len())
	}
	got, _ := r.At(0).AsInt64()
	n, _ := r.At(1).AsInt64()
	if got < 0 {
		return false, 0, rw.foundNotHeld(write, heldGen)
	}
	if got == 0 {
		return false, max(time.Duration(n)*time.Millisecond, time.Millisecond), nil
	}
	token, _ := r.At(2).AsInt64()
	newID := attemptID
	if write {
		newID = strconv.FormatInt(token, 10)
	}
	if acks >= 0 && acks < int64(rw.l.opts.ReplicaAcks) {
		rw.releaseGrant(ctx, write, newID)
		return false, 0, fmt.Errorf("%w: %q: %d of %d replicas", ErrNotReplicated, rw.name, acks, rw.l.opts.ReplicaAcks)
	}
	if holds > 0 {
		// As for Mutex.nest: the nested answer extends no lease, so one
		// that came when the hold's lease was over finds it lost.
		rw.mu.Lock()
		lse := sd.lse
		rw.mu.Unlock()
		if lse != nil && !lse.Live(time.Now()) {
			rw.lose(write, heldGen, lease.ErrExpired)
		}
		rw.mu.Lock()
		defer rw.mu.Unlock()
		if sd.gen != heldGen || sd.holds == 0 {
			// Declared lost while the call was in flight, or just now.
			return false, 0, rw.err
		}
		if write {
			sd.holds = n
		} else {
			sd.holds++
		}
		return true, 0, nil
	}

	// An outermost hold: start watching its lease, unless the answer came
	// too late to be a hold (see Mutex.startHold).
	if !lease.Live(sent, rw.lease, time.Now()) {
		rw.releaseGrant(ctx, write, newID)
		return false, 0, fmt.Errorf("%w: %q (%s): %w", ErrNotObtained, rw.name, kind(write), lease.ErrLate)
	}
	rw.mu.Lock()
	rw.gen++
	gen := rw.gen
	if rw.w.holds == 0 && rw.r.holds == 0 {
		rw.err, rw.lost = nil, nil // a fresh start: nothing else is held
	}
	sd.gen, sd.holds, sd.id, sd.token, sd.orphan, sd.unacked = gen, 1, newID, token, "", false
	rw.mu.Unlock()
	onLost := func(err error) { rw.lose(write, gen, err) }
	var lse *lease.Lease
	if rw.group != nil {
		lse = rw.l.keeper.AddBatched(sent, rw.lease, rw.group, sd, onLost)
	} else {
		lse = rw.l.keeper.Add(sent, rw.lease, nil, onLost) // a fixed lease: never renewed
	}
	rw.mu.Lock()
	if sd.gen == gen && sd.holds > 0 {
		sd.lse = lse
		rw.mu.Unlock()
		return true, 0, nil
	}
	lostErr := rw.err
	sd.unacked = false // told by this error; no hold to release
	rw.mu.Unlock()
	rw.releaseGrant(ctx, write, newID)
	if errors.Is(lostErr, lease.ErrClosed) {
		return false, 0, ErrClosed
	}
	return false, 0, fmt.Errorf("%w: %w", ErrNotObtained, inner(lostErr))
}

// giveBack sends, in the background, the rwmutex_abandon script for an
// attempt nobody waits for (kind "w" or "r"), or to withdraw the
// writer-waiting mark of one Lock call (kind "m"); mark names that Lock
// call's mark, withdrawn in every kind ("": none). Like Locker.giveBack,
// the Locker's Close waits for it.
func (rw *RWMutex) giveBack(attempt, kind, mark string) {
	l := rw.l
	// Once the Locker is closed, the lease (or the mark) will end it.
	l.bg.Go(func() {
		ctx, cancel := l.bg.Bounded(rw.lease) // Close ends it too
		defer cancel()
		rw.s.abandon.Exec(ctx, rw.abandonKeys, []string{rw.owner, attempt, kind, l.pubMode, rw.keepMs, rw.leaseMs, mark})
	})
}

// releaseGrant gives back, at once, a grant this RWMutex will not keep.
// Called with rw.op held.
//
// As Mutex.releaseGrant, it runs under the Locker's bound, not the
// caller's context: a lease, or a second after Close.
func (rw *RWMutex) releaseGrant(_ context.Context, write bool, id string) {
	ctx, cancel := rw.l.grantBound(rw.lease)
	defer cancel()
	if write {
		rw.s.unlock.Exec(ctx, rw.unlockKeys, []string{rw.owner, "1", id, rw.l.pubMode, rw.keepMs})
	} else {
		rw.s.runlock.Exec(ctx, rw.runlockKeys, []string{id, rw.l.pubMode, rw.keepMs})
	}
}

// foundNotHeld records that the server no longer has acquisition gen of
// the given kind, as a nested Lock or RLock found, and returns the error.
func (rw *RWMutex) foundNotHeld(write bool, gen uint64) error {
	rw.mu.Lock()
	sd := rw.side(write)
	lse := sd.lse
	if sd.gen == gen && sd.holds > 0 {
		sd.lse = nil
	} else {
		lse = nil
	}
	rw.mu.Unlock()
	if lse != nil {
		lse.Stop()
	}
	rw.lose(write, gen, errFoundNotHeld)
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.err != nil {
		return rw.err
	}
	return fmt.Errorf("%w: %q (%s): %w", ErrLost, rw.name, kind(write), errFoundNotHeld)
}

// renewRW is the watchdog's renewal of the current holds of items
// (*rwSide, of RWMutexes with the watchdog lease, in one group) in one
// call. Each lock's keys are sent once, with the holds of it in the call
// pointing at them.
func (l *Locker) renewRW(ctx context.Context, items []any, errs []error) error {
	first := items[0].(*rwSide).rw
	keys := make([]string, 0, 8)
	args := make([]string, 1+3*len(items))
	args[0] = first.leaseMs     // the Locker's WatchdogLease, as every watchdog hold has
	var index map[string]string // state hash -> its lock's position in keys, as sent
	var prev *RWMutex
	var j string
	for i, it := range items {
		sd := it.(*rwSide)
		rw := sd.rw
		// Holds of one lock often come together: no lookup then.
		if rw != prev {
			prev = rw
			var ok bool
			if j, ok = index[rw.renewKeys[0]]; !ok {
				keys = append(keys, rw.renewKeys[0], rw.renewKeys[1])
				j = strconv.Itoa(len(keys) / 2)
				if index == nil {
					index = make(map[string]string)
				}
				index[rw.renewKeys[0]] = j
			}
		}
		owner := "" // a read hold
		if sd.write {
			owner = rw.owner
		}
		rw.mu.Lock()
		id := sd.id
		rw.mu.Unlock()
		args[1+3*i], args[2+3*i], args[3+3*i] = j, owner, id
	}
	vals, err := first.s.renewBatch.Exec(ctx, keys, args).ToArray() // every RWMutex of l has the same scripts
	if err != nil {
		return err
	}
	if vals.Len() != len(items) {
		return fmt.Errorf("mutex: renewal of %d read-write holds answered %d", len(items), vals.Len())
	}
	for i := range len(items) {
		switch ok, err := vals.At(i).AsInt64(); {
		case err != nil:
			errs[i] = err
		case ok == 0:
			errs[i] = errRWRenewGone
		case ok < 0:
			errs[i] = lease.ErrWrongType
		}
	}
	return nil
}

// errRWRenewGone is the loss reason when the watchdog finds a write or read
// hold gone.
var errRWRenewGone = fmt.Errorf("%w: deleted, expired or forced", lease.ErrGone)

// lose records the loss of acquisition gen of the given kind.
func (rw *RWMutex) lose(write bool, gen uint64, cause error) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	sd := rw.side(write)
	if sd.gen != gen || sd.holds == 0 {
		return
	}
	if sd.releasing == gen {
		if sd.pending == nil {
			sd.pending = cause
		}
		return
	}
	rw.loseLocked(write, cause)
}

// loseLocked declares the current hold of the given kind lost. Called with
// rw.mu held.
func (rw *RWMutex) loseLocked(write bool, cause error) {
	sd := rw.side(write)
	sd.holds, sd.lse, sd.orphan, sd.unacked = 0, nil, sd.id, true
	rw.err = fmt.Errorf("%w: %q (%s): %w", ErrLost, rw.name, kind(write), inner(lossCause(cause)))
	if o := rw.l.obs; o != nil { // before the holder is told
		o.Observe(scriptcache.Event{Kind: scriptcache.EventLost, Primitive: scriptcache.PrimitiveRWMutex, Name: rw.name, Hold: time.Since(sd.since), Weight: 1,
			Reason: obs.LossReason(cause), Err: rw.err})
	}
	if rw.lost != nil && rw.lost != closedChan {
		close(rw.lost)
	}
	rw.lost = closedChan
	rw.endScopedLocked(rw.err)
}

// Unlock gives back one write hold; the last one releases the write lock
// and wakes waiters. Errors as for Mutex.Unlock: ErrNotHeld if this
// RWMutex does not hold the write lock (wrapping Err after a loss, whose
// leftovers the first such Unlock gives back), and any other error leaves
// the hold counted so that calling Unlock again is safe.
func (rw *RWMutex) Unlock(ctx context.Context) error { return rw.release(ctx, true) }

// RUnlock gives back one read hold; the last one releases the read
// acquisition, and the last reader's release wakes a waiting writer.
// Nested read holds are counted here, so only the last RUnlock talks to
// Redis. Errors as for Unlock.
func (rw *RWMutex) RUnlock(ctx context.Context) error { return rw.release(ctx, false) }

func (rw *RWMutex) release(ctx context.Context, write bool) error {
	rw.op.Lock()
	defer rw.op.Unlock()
	rw.mu.Lock()
	sd := rw.side(write)
	holds, id, lostErr, heldGen, orphan := sd.holds, sd.id, rw.err, sd.gen, sd.orphan
	switch {
	case holds == 0:
		sd.orphan, sd.unacked = "", false
	case holds == 1:
		sd.releasing = heldGen
	case !write:
		sd.holds-- // a nested read hold: nothing on the server
		rw.mu.Unlock()
		return nil
	}
	rw.mu.Unlock()
	if holds == 0 {
		if orphan != "" {
			rw.releaseGrant(ctx, write, orphan)
		}
		if lostErr != nil {
			return fmt.Errorf("%w: %w", ErrNotHeld, inner(lostErr))
		}
		return fmt.Errorf("%w: %q (%s)", ErrNotHeld, rw.name, kind(write))
	}
	var left int64
	var err error
	if write {
		left, err = rw.s.unlock.Exec(ctx, rw.unlockKeys, []string{rw.owner, strconv.FormatInt(holds, 10), id, rw.l.pubMode, rw.keepMs}).AsInt64()
	} else {
		left, err = rw.s.runlock.Exec(ctx, rw.runlockKeys, []string{id, rw.l.pubMode, rw.keepMs}).AsInt64()
	}
	rw.mu.Lock()
	defer rw.mu.Unlock()
	pending := sd.pending
	sd.releasing, sd.pending = 0, nil
	if err != nil {
		if pending != nil && sd.gen == heldGen && sd.holds > 0 {
			rw.loseLocked(write, pending)
		}
		return fmt.Errorf("mutex: unlock %q (%s): %w", rw.name, kind(write), inner(err))
	}
	if sd.gen != heldGen || sd.holds == 0 {
		sd.unacked = false // told now
		return fmt.Errorf("%w: %w", ErrNotHeld, inner(rw.err))
	}
	if left < 0 {
		if sd.lse != nil {
			sd.lse.Stop()
		}
		rw.loseLocked(write, errors.New("found not held at unlock"))
		sd.orphan, sd.unacked = "", false
		return fmt.Errorf("%w: %w", ErrNotHeld, inner(rw.err))
	}
	sd.holds = left
	if left == 0 {
		if sd.lse != nil {
			sd.lse.Stop()
			sd.lse = nil
		}
		sd.token = 0
		if o := rw.l.obs; o != nil {
			o.Observe(scriptcache.Event{Kind: scriptcache.EventReleased, Primitive: scriptcache.PrimitiveRWMutex, Name: rw.name, Hold: time.Since(sd.since), Weight: 1})
		}
		if rw.w.holds == 0 && rw.r.holds == 0 {
			rw.lost = nil // Lost returns closedChan until the next hold
			if len(rw.scoped) > 0 {
				rw.endScopedLocked(fmt.Errorf("%w: %q: released", ErrNotHeld, rw.name))
			}
		}
	}
	return nil
}

// Token returns the fencing token of the current write hold, or 0 if this
// RWMutex does not hold the write lock.
func (rw *RWMutex) Token() int64 {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.w.holds == 0 {
		return 0
	}
	return rw.w.token
}

// Holds returns how many write and read holds this RWMutex has.
func (rw *RWMutex) Holds() (write, read int64) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.w.holds, rw.r.holds
}

// Lost returns a channel that is closed when a hold of this RWMutex is
// lost (see RWMutex). If nothing is held it returns a closed channel. A
// normal Unlock or RUnlock does not close it.
func (rw *RWMutex) Lost() <-chan struct{} {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.w.holds == 0 && rw.r.holds == 0 {
		return closedChan
	}
	if rw.lost == nil {
		rw.lost = make(chan struct{})
	}
	return rw.lost
}

// Err returns why a hold was last lost (wrapping ErrLost), or nil. It is
// reset when the RWMutex acquires again while holding nothing.
func (rw *RWMutex) Err() error {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.err
}

// RWInfo is what Redis says about a read-write lock.
type RWInfo struct {
	Writer        string        // owner id of the writer; "" if none
	WriteHolds    int64         // the writer's hold count
	Token         int64         // token of the current (or last) write acquisition
	WriteRemain   time.Duration // remaining write lease; 0 if no writer
	Readers       int64         // read acquisitions whose lease runs
	WriterWaiting time.Duration // remaining writer-waiting mark; 0 if none
}

// Info reads the lock's state from Redis: whoever holds it, not only this
// RWMutex.
func (rw *RWMutex) Info(ctx context.Context) (RWInfo, error) {
	vals, err := rw.s.info.Exec(ctx, rw.renewKeys, nil).ToArray()
	if err != nil {
		return RWInfo{}, fmt.Errorf("mutex: info %q: %w", rw.name, inner(err))
	}
	if vals.Len() != 6 {
		return RWInfo{}, fmt.Errorf("mutex: info %q: unexpected reply of %d values", rw.name, vals.Len())
	}
	var in RWInfo
	in.Writer, _ = vals.At(0).ToString()
	in.WriteHolds, _ = vals.At(1).AsInt64()
	in.Token, _ = vals.At(2).AsInt64()
	remain, _ := vals.At(3).AsInt64()
	in.WriteRemain = time.Duration(remain) * time.Millisecond
	in.Readers, _ = vals.At(4).AsInt64()
	mark, _ := vals.At(5).AsInt64()
	in.WriterWaiting = time.Duration(mark) * time.Millisecond
	return in, nil
}

// ForceUnlock releases the lock whoever holds it, the writer and every
// reader, and wakes the waiters. It reports whether anything was held. The
// holders learn of it at their next renewal (or release) and are told
// through Lost. A writer-waiting mark stays. Its cost grows with the
// number of readers.
func (rw *RWMutex) ForceUnlock(ctx context.Context) (bool, error) {
	vals, err := rw.s.force.Exec(ctx, rw.forceKeys, []string{rw.l.pubMode, rw.keepMs}).ToArray()
	if err == nil && vals.Len() != 2 {
		err = fmt.Errorf("unexpected reply of %d values", vals.Len())
	}
	if err != nil {
		return false, fmt.Errorf("mutex: force unlock %q: %w", rw.name, inner(err))
	}
	w, _ := vals.At(0).AsInt64()
	r, _ := vals.At(1).AsInt64()
	return w+r > 0, nil
}
