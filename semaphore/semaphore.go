// Package semaphore is a distributed counting semaphore on Redis whose
// permits expire: at most N permits of a named semaphore are held at once
// across every process that shares one Redis server or Redis Cluster, and a
// process that dies without releasing gives its permits back when their
// lease runs out.
//
// A Manager owns what the semaphores of a process share: one pub/sub
// subscription per semaphore name that anyone here waits on, and one
// watchdog that renews every held permit. Create one per process, share it
// between all the code that uses semaphores (each Manager subscribes on its
// own, so two Managers waiting on one name cost two subscriptions and split
// the wake-ups), and Close it on shutdown. A Semaphore is a name and a
// capacity; it is cheap and holds no state of its own:
//
//	mgr, err := semaphore.NewManager(client, semaphore.Options{}) // client from sluice.New
//	defer mgr.Close()
//	sem, err := mgr.NewSemaphore("upstream", 8)
//	p, err := sem.Acquire(ctx, 1)
//	if err != nil { ... }
//	defer p.Release(ctx)
//
// Acquire(ctx, n) takes n permits at once, like x/sync/semaphore.Weighted,
// and returns a Permit whose Release gives exactly those back. Releasing a
// permit twice, or one that expired, returns ErrNotHeld and frees nothing
// that belongs to anyone else.
//
// # Capacity
//
// The capacity is stored in Redis with the permits, and comes from one of
// two places:
//
//   - The capacity a Semaphore was made with (NewSemaphore). It is fixed
//     while any permit is held: an Acquire (or Available) through a
//     Semaphore configured with another capacity fails with
//     ErrCapacityMismatch instead of letting the larger value win, so a
//     misconfigured deployment is noticed. When no permit is held,
//     whichever capacity the next Acquire brings applies.
//   - SetCapacity, which resizes the semaphore for everyone, at once and
//     while permits are held. A set capacity overrides every Semaphore's
//     own (no ErrCapacityMismatch; Acquire may take up to the set capacity,
//     even above the Semaphore's) for as long as the semaphore is in use
//     and for CapacityRetention (24 h) after its last grant, renewal or
//     release; then the configured capacities apply again. To resize for
//     good, SetCapacity and change the configuration too.
//
// Shrinking never revokes a held permit: while the weight held is at or
// above the new capacity nothing is granted, and Available reports 0.
// Growing wakes waiting Acquires (a fair semaphore grants the new permits
// to its queue at once). An Acquire for more than the capacity in force
// fails with ErrInvalidWeight, a waiting one at its next attempt.
//
// # Expiry and reclamation
//
// Every permit has a lease. With Options.Lease zero it is a WatchdogLease
// (30 s) that the Manager renews every third of it while the permit is held,
// so a crashed process frees its permits within one lease. The renewals of
// many permits, of one semaphore or several in one cluster slot, go out
// together, up to 512 per script call, and each permit is answered on its
// own: one found gone is lost alone. With a Lease set there is no renewal:
// a permit expires that long after it was granted. Expired permits are
// reclaimed by an acquire they are in the way of (one that would not be
// granted otherwise, and Available), at most 16 per call, so no call does
// unbounded work; their capacity is then announced to waiters. An acquire
// that fits anyway leaves them for later, which keeps the common case
// cheap.
//
// A holder can lose its permit: it expired (renewals failed for a whole
// lease, a paused process, a fixed lease ran out), its keys were deleted, or
// the Manager was closed. The holder is told: Lost's channel closes and Err
// returns an error wrapping ErrLost and the reason. Loss is judged on the
// client clock, counting each lease from before the request that set it was
// sent, so the signal comes before Redis can count the permit as free.
// Context gives a context that ends with the permit, and Semaphore.Do runs
// a function under n permits and reports a loss while it ran. A process
// paused past its lease (SIGSTOP, a VM freeze) hears of the loss only when
// the watchdog runs again; HeldUntil and Valid read the client clock
// instead, so a check right before a write catches it at once.
//
// # Waiting
//
// An Acquire that finds too few permits free subscribes to the semaphore's
// channel, waits for the subscription to be confirmed (so no release is
// missed), and tries again whenever a release is published or the earliest
// permit expiry passes, whichever comes first. A release publishes how many
// permits are now free, and each process wakes only as many of its local
// waiters as that many permits could satisfy, in arrival order, not the
// whole herd. A waiter that needs more permits than were freed is skipped
// for lighter ones behind it that fit, and a woken waiter that finds too few
// permits free (another process took some first) offers the rest to the
// waiters behind it. On a Redis 7 cluster the channel is sharded (SPUBLISH).
// Waiting is not fair, within a process or across processes: a request for
// many permits can be overtaken by smaller ones that fit first, and a
// process that releases can take the permits again before a waiter
// elsewhere wakes up. Options.Fair changes that (see below).
//
// Waiting needs the subscription: if Redis refuses it (an ACL user without
// access to the channel gets NOPERM, and Redis 7 users have no channel access
// unless granted, e.g. with &sluice:sem:*), an Acquire that has to wait
// returns an error wrapping ErrSubscribe and the Redis error instead of
// waiting without wake-ups. If the Manager is closed, a waiting Acquire
// returns ErrClosed at once.
//
// # Fair semaphores
//
// With Options.Fair, an Acquire that cannot be granted at once joins a
// queue kept in Redis in arrival order, and the script that frees permits
// (a release, an expiry found, SetCapacity) grants them straight to the
// waiters at the head of the queue, as far as they go, and sends each a
// message naming it: the waiter holds its permit when the message arrives,
// without another round trip and without a releasing process barging in.
// A fair TryAcquire fails while earlier waiters would be served first.
//
// Weighted requests are served in queue order while the head fits. A head
// that does not fit does not stop lighter waiters behind it that do (among
// the first 32 queued): they may pass it, but at most 16 times; after that
// nothing passes it and the permits freed are kept for it until it fits.
// So a light waiter is not held up by a heavy one while permits are free,
// and a heavy one waits at most for 16 grants past it plus the release of
// the permits held when it reached the head.
//
// The Manager refreshes the entries of its waiting Acquires every
// min(lease/3, 1 s), many in one call (one call per cluster slot and
// round, up to 512 entries), so a thousand waiters do not make a thousand
// calls a second; an entry not refreshed for a lease is dead and skipped.
// A waiter whose entry a refresh finds gone (a release granted it permits
// and the message was lost, or it was dropped as dead) is woken and looks
// at once, and so is one waiter of a semaphore whose queue is due a grant
// that no release will make (a holder's permit expired without a release,
// or permits are free for the head of the queue); otherwise a waiter calls
// Redis itself only when woken. A grant's lease ends when the waiter's
// entry would have, so a waiter that died at the head of the queue blocks
// its permits for at most its entry's lease and one refresh. An Acquire
// whose ctx ends leaves the queue at once and gives back a grant that
// reached it meanwhile, and so does one that Close ends. With ReplicaAcks,
// a grant learned by message is confirmed through WAIT like any other
// before Acquire returns. Unfair Acquires ignore the queue, so all
// processes using a name should use the same mode.
//
// # Giving up
//
// If ctx ends while waiting, Acquire returns an error wrapping ErrNotObtained
// and ctx.Err() and holds nothing. A request still in flight when ctx ends
// may be granted after all; that permit is released as soon as its reply
// arrives. If the connection fails instead, Acquire tries to release the
// permit it may have been granted, and if that fails too, the permit, never
// renewed, expires within one lease.
//
// # Failover
//
// Redis replication is asynchronous. If the primary fails after granting a
// permit but before a replica received it, the promoted replica does not
// know that permit and may grant its capacity again: the semaphore can then
// exceed N until the holders of the forgotten permits learn of it (the
// watchdog's next renewal, within a third of a lease, finds them gone and
// reports them lost; a fixed-lease permit simply runs to its end). The same
// holds after a restart without persistence. Redis semaphores bound load;
// they are not consensus.
//
// # Keys
//
// A semaphore named S is the hash PREFIX{S} (permit id to weight, plus the
// capacity and the weight in use), the sorted set PREFIX{S}:e (permit id to
// expiry, server milliseconds) and the channel PREFIX{S}:w; a fair one also
// has its queue PREFIX{S}:q (waiter to arrival) and PREFIX{S}:qe (waiter to
// entry). PREFIX defaults to "sluice:sem:"; the braces keep everything in
// one cluster slot. A permit id is a UUID, followed by "/" and the label of
// WithOwner if its Semaphore has one (Holders reads it back). The permit
// keys expire with the latest permit (or up to a sixteenth of a lease
// after it) and are deleted with the last one, the queue keys a lease
// after the last refresh (or up to a sixteenth more) and when the queue
// empties, so an idle semaphore leaves nothing behind, except a capacity
// set by SetCapacity, kept in the hash for CapacityRetention.
//
// On miniredis (tests, examples) the rueidis client needs DisableCache and
// AlwaysRESP2.
package semaphore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/google/uuid"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/notify"
	"github.com/sluicekit/sluice/internal/obs"
	"github.com/sluicekit/sluice/internal/scriptexec"
	"github.com/sluicekit/sluice/scriptcache"
)

// Errors of this package; check them with errors.Is.
var (
	// ErrNotObtained means Acquire gave up (its context ended; the error
	// also wraps ctx.Err()) or TryAcquire found too few permits free, or
	// was granted them by an answer that came after the permit's lease had
	// ended (given back at once; Acquire tries again instead).
	ErrNotObtained = errors.New("semaphore: not obtained")
	// ErrNotHeld means Release found the permit not held: already
	// released, expired, or deleted. Nothing else was changed.
	ErrNotHeld = errors.New("semaphore: permit not held")
	// ErrLost means a held permit was lost; Err wraps it with the reason.
	ErrLost = errors.New("semaphore: permit lost")
	// ErrClosed means the Manager was closed.
	ErrClosed = errors.New("semaphore: manager closed")
	// ErrCapacityMismatch means the semaphore's permits are held under a
	// different capacity than this Semaphore's (see the package doc).
	ErrCapacityMismatch = errors.New("semaphore: capacity mismatch")
	// ErrInvalidName means the semaphore name is empty or too long.
	ErrInvalidName = errors.New("semaphore: invalid name")
	// ErrInvalidCapacity means a capacity outside [1, MaxCapacity].
	ErrInvalidCapacity = errors.New("semaphore: invalid capacity")
	// ErrInvalidWeight means a number of permits outside [1, capacity].
	ErrInvalidWeight = errors.New("semaphore: invalid number of permits")
	// ErrInvalidOptions means Options are out of range.
	ErrInvalidOptions = errors.New("semaphore: invalid options")
	// ErrNotReplicated means Options.ReplicaAcks replicas did not confirm
	// a grant in time; it was released again and is not held.
	ErrNotReplicated = errors.New("semaphore: grant not acknowledged by replicas")
	// ErrSubscribe means Redis refused the subscription an Acquire needs
	// to wait (NOPERM for an ACL user without access to the channel); the
	// error also wraps the Redis error. Nothing is held.
	ErrSubscribe = errors.New("semaphore: subscription refused")
)

// Defaults and limits.
const (
	DefaultWatchdogLease  = 30 * time.Second
	DefaultPrefix         = "sluice:sem:"
	DefaultReplicaTimeout = 100 * time.Millisecond
	// CapacityRetention is how long a capacity set by SetCapacity is kept
	// after the semaphore's last grant, renewal or release.
	CapacityRetention = 24 * time.Hour
	// MaxCapacity is the largest capacity. The scripts count in Lua
	// numbers, exact integers up to 2^53; below it, used + n is exact
	// whenever it could fit, so no grant can round its way under capacity.
	MaxCapacity = 1<<53 - 1
)

// cleanupTimeout bounds the release sent for a permit granted to an
// Acquire that had given up.
const cleanupTimeout = 5 * time.Second

// bypassLimit is how many grants may pass a fair waiter that does not fit
// before the permits are kept for it; it is the constant 16 of
// semaphore_queue.lua, named here for the tests and the doc.
const bypassLimit = 16

// retentionMs is CapacityRetention as sent to the scripts.
var retentionMs = strconv.FormatInt(CapacityRetention.Milliseconds(), 10)

// Options configure a Manager. The zero value is the default.
type Options struct {
	// Lease is a fixed lease for every permit: a permit expires that long
	// after it was granted unless released before, and is never renewed.
	// Zero means a watchdog lease instead. At least 30 ms.
	Lease time.Duration
	// WatchdogLease is the lease of a permit without a fixed Lease; it is
	// renewed every WatchdogLease/3 while the permit is held, so a crashed
	// holder's permits come back within this long. Zero means
	// DefaultWatchdogLease (30 s). At least 30 ms.
	WatchdogLease time.Duration
	// Prefix starts every key. Empty means DefaultPrefix ("sluice:sem:").
	// It must not contain braces (they would move the cluster hash tag).
	Prefix string
	// ReplicaAcks, when above zero, makes every grant wait (Redis WAIT)
	// until that many replicas have it; if they do not within
	// ReplicaTimeout, the permit is released again and Acquire returns
	// ErrNotReplicated. It narrows, but cannot close, the window in which a
	// failover loses granted permits (replication stays asynchronous).
	// Acquire still returns as soon as its context ends; a grant that
	// lands after that is released when its reply comes. Zero (the
	// default) does not wait.
	ReplicaAcks int
	// ReplicaTimeout bounds the wait for ReplicaAcks. Zero means
	// DefaultReplicaTimeout (100 ms).
	ReplicaTimeout time.Duration
	// Fair makes Acquire wait in a first-come, first-served queue kept in
	// Redis, and makes a release grant the freed permits straight to the
	// waiters at its head (see "Fair semaphores" in the package doc). All
	// processes using a name should agree: an unfair Acquire ignores the
	// queue.
	Fair bool
}

func (o Options) withDefaults() (Options, error) {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if err := keyspace.CheckPrefix(o.Prefix); err != nil {
		return o, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	c := o.leaseConfig()
	if err := c.Normalize(); err != nil {
		return o, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	o.WatchdogLease, o.ReplicaTimeout = c.Watchdog, c.ReplicaTimeout
	return o, nil
}

func (o Options) leaseConfig() lease.Config {
	return lease.Config{Fixed: o.Lease, Watchdog: o.WatchdogLease, ReplicaAcks: o.ReplicaAcks, ReplicaTimeout: o.ReplicaTimeout}
}

// Manager creates Semaphores and owns what they share: the wake-up
// subscriptions and the watchdog. It is safe for concurrent use.
type Manager struct {
	opts     Options
	lease    time.Duration // every permit's lease
	watchdog bool          // renew permits (no fixed Lease)
	leaseMs  string        // lease in ms, as sent to the scripts
	pubMode  string        // "s" (SPUBLISH) or "p"
	recheck  time.Duration // how often a fair waiter's queue entry is refreshed

	acquire, release, renewBatch, holders, queue *scriptcache.Script
	queueRefresh, info                           *scriptcache.Script

	hub    *notify.Hub
	keeper *lease.Keeper
	closed atomic.Bool
	obs    scriptcache.Observer // nil: nothing reported

	// groups renew the watchdog leases together, one group per cluster
	// slot (a script's keys must share one).
	groups *lease.Slots
	// queued refresh the queue entries of waiting fair Acquires, many per
	// call, one group per cluster slot (see queueEntry); nil if not Fair.
	queued *lease.Slots

	// bg runs fair waiters leaving the queue and the calls of ExecOrLate
	// and ExecWaitOrLate whose callers may leave; Close waits for them.
	bg *scriptexec.Group
}

// NewManager returns a Manager that runs its scripts through sc. Close it
// when done.
func NewManager(sc *sluice.Client, opts Options) (*Manager, error) {
	if sc == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidOptions)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	m := &Manager{opts: opts, pubMode: "p", bg: scriptexec.NewGroup(ErrClosed)}
	c := opts.leaseConfig()
	m.lease, m.watchdog = c.Effective()
	m.leaseMs = strconv.FormatInt(m.lease.Milliseconds(), 10)
	m.recheck = min(m.lease/3, time.Second)
	if sc.ShardedPubSub() {
		m.pubMode = "s"
	}
	for name, dst := range map[string]**scriptcache.Script{
		"semaphore_acquire": &m.acquire, "semaphore_release": &m.release,
		"semaphore_renew_batch": &m.renewBatch, "semaphore_holders": &m.holders, "semaphore_queue": &m.queue,
		"semaphore_queue_refresh": &m.queueRefresh, "semaphore_info": &m.info,
	} {
		if *dst, err = sc.Script(name); err != nil {
			return nil, fmt.Errorf("semaphore: %w", err)
		}
	}
	m.obs = sc.Observer()
	m.hub = notify.NewObserved(sc.Client(), sc.ShardedPubSub(), m.obs, scriptcache.PrimitiveSemaphore, ErrSubscribe)
	m.keeper = lease.NewKeeper()
	m.groups = m.keeper.NewSlots(sc.Cluster(), m.renewPermits)
	if opts.Fair {
		m.queued = m.keeper.NewSlots(sc.Cluster(), m.refreshEntries)
	}
	return m, nil
}

// Close stops the watchdog and the subscriptions and waits for their
// goroutines. Permits still held are no longer renewed: their holders are
// told (Lost closes, Err wraps ErrLost and ErrClosed) and the permits expire
// by their lease unless released. Waiting Acquires return ErrClosed.
func (m *Manager) Close() {
	if m.closed.Swap(true) {
		return
	}
	m.hub.Close()
	m.keeper.Close()
	m.bg.Close()
}

// leave takes a fair waiter that gives up out of the queue, and gives back
// a grant that reached it meanwhile: in the background, so that Acquire
// returns as soon as its context ends, or, once Close has stopped waiting
// for the background, before Acquire returns ErrClosed. Left in the queue,
// the entry would be granted permits nobody takes for a lease.
func (m *Manager) leave(s *Semaphore, id string) {
	if !m.bg.Go(func() { s.cleanupInGroup(id) }) {
		s.cleanup(context.Background(), id)
	}
}

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

// NewSemaphore returns the semaphore called name with the given capacity.
// It does not talk to Redis; the capacity is checked against the stored one
// by Acquire (see the package doc). Semaphores of one name made with
// different options (WithOwner) share its permits.
func (m *Manager) NewSemaphore(name string, capacity int64, opts ...Option) (*Semaphore, error) {
	if err := keyspace.CheckName(name); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidName, err)
	}
	if capacity < 1 || capacity > MaxCapacity {
		return nil, fmt.Errorf("%w: %d outside [1, %d]", ErrInvalidCapacity, capacity, int64(MaxCapacity))
	}
	p := m.opts.Prefix
	s := &Semaphore{
		m:        m,
		name:     name,
		event:    name,
		capacity: capacity,
		capArg:   strconv.FormatInt(capacity, 10),
		keys: []string{keyspace.Key(p, name, ""), keyspace.Key(p, name, ":e"), keyspace.Key(p, name, ":w"),
			keyspace.Key(p, name, ":q"), keyspace.Key(p, name, ":qe")},
	}
	if m.watchdog {
		s.group = m.groups.Group(s.keys[0])
	}
	if m.queued != nil {
		s.qgroup = m.queued.Group(s.keys[0])
	}
	for _, o := range opts {
		if o.apply == nil {
			continue
		}
		if err := o.apply(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Option configures one Semaphore (Options configures the Manager).
// WithOwner and WithEventName make one; the zero Option changes nothing.
type Option struct {
	apply func(*Semaphore) error
}

// maxOwnerLen is the longest owner label, in bytes. The label travels in
// every permit id, so in every renewal of up to lease.MaxBatch permits.
const maxOwnerLen = 128

// WithOwner labels the permits this Semaphore grants with owner (a host,
// a process, a worker: whatever tells an operator who holds them), shown
// by Holders as Holder.Owner. It is a label, not an identity: every permit
// still has its own id, and two Semaphores with one label share nothing
// more than two without. The label is stored in Redis as part of the
// permit's id, only when set, so an unlabelled permit costs nothing more.
// owner must be 1 to 128 bytes without spaces or control characters
// (ErrInvalidOptions).
func WithOwner(owner string) Option {
	return Option{func(s *Semaphore) error {
		bad := strings.IndexFunc(owner, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) })
		if owner == "" || len(owner) > maxOwnerLen || bad >= 0 {
			return fmt.Errorf("%w: owner must be 1 to %d bytes without spaces or control characters", ErrInvalidOptions, maxOwnerLen)
		}
		s.owner = owner
		return nil
	}}
}

// maxEventName is the longest name of WithEventName, in bytes: that of a
// semaphore name.
const maxEventName = 1024

// WithEventName makes the Semaphore report its events to the Cache's
// observer (scriptcache.Event.Name: metric labels, log records) under name
// instead of its own name. Use it for semaphores named after request data,
// such as one per client: each name would otherwise make metric series of
// its own, named with the client's data, and an entry in the observer's
// memory that never goes. Give the name of what the configuration made,
// as ratelimit's concurrency middleware does with the prefix its
// semaphores' names share. Errors still name the semaphore. name must be
// 1 to 1024 bytes (ErrInvalidOptions).
func WithEventName(name string) Option {
	return Option{func(s *Semaphore) error {
		if name == "" || len(name) > maxEventName {
			return fmt.Errorf("%w: event name must be 1 to %d bytes", ErrInvalidOptions, maxEventName)
		}
		s.event = name
		return nil
	}}
}

// idLen is the length of a permit id without an owner label: a UUID in its
// text form. A labelled id is the UUID, ownerSep and the label; the UUID
// first keeps every id clear of the hash's reserved fields (':used').
const (
	idLen    = 36
	ownerSep = '/'
)

// newID returns a new permit id, labelled with the Semaphore's owner if it
// has one. The label is written in with the UUID, so a labelled id costs
// no more allocations than a plain one.
func (s *Semaphore) newID() string {
	if s.owner == "" {
		return uuid.NewString()
	}
	u := uuid.New()
	var text [idLen]byte
	hex.Encode(text[0:8], u[0:4])
	hex.Encode(text[9:13], u[4:6])
	hex.Encode(text[14:18], u[6:8])
	hex.Encode(text[19:23], u[8:10])
	hex.Encode(text[24:], u[10:])
	text[8], text[13], text[18], text[23] = '-', '-', '-', '-'
	var b strings.Builder
	b.Grow(idLen + 1 + len(s.owner))
	b.Write(text[:])
	b.WriteByte(ownerSep)
	b.WriteString(s.owner)
	return b.String()
}

// ownerOf returns the owner label in the permit id id, or "".
func ownerOf(id string) string {
	if len(id) > idLen+1 && id[idLen] == ownerSep {
		return id[idLen+1:]
	}
	return ""
}

// Semaphore is one named counting semaphore seen with one capacity. It
// holds no state of its own and is safe for concurrent use.
type Semaphore struct {
	m        *Manager
	name     string
	capacity int64
	capArg   string
	keys     []string     // permits hash, expiry set, wake-up channel, queue, queue entries
	group    *lease.Group // renews its permits' watchdog leases with others; nil for a fixed lease
	qgroup   *lease.Group // refreshes its fair waiters' queue entries with others; nil if not fair
	owner    string       // labels its permits' ids (WithOwner); "" for none
	event    string       // the Name of its events (WithEventName): name unless set
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Capacity returns the capacity this Semaphore was made with. A capacity
// set by SetCapacity overrides it in Redis (see the package doc).
func (s *Semaphore) Capacity() int64 { return s.capacity }

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
	res, err := s.attempt(ctx, id, n, "")
	if res.p != nil || err != nil {
		return res.p, err
	}
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
		if res, err = s.attempt(ctx, id, n, ""); res.p != nil || err != nil {
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
	res, err := s.attempt(ctx, id, n, "a")
	if res.p != nil || err != nil {
		if w != nil {
			w.Close()
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
			if res, err = s.attempt(ctx, id, n, "a"); res.p != nil || err != nil {
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
	mode := ""
	if s.m.opts.Fair {
		mode = "t"
	}
	res, err := s.attemptOnce(ctx, s.newID(), n, mode)
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

// call runs the acquire script with n permits (0: only reclaim and report),
// or for a fair mode ("a" or "t") the queue script. If ctx ends before the
// reply comes, call returns ctx.Err() at once, also while waiting for
// replicas; the script may still run, and a permit it may have granted (or
// a queue entry it made) is released as soon as that late reply (or the
// news that none will come) arrives.
func (s *Semaphore) call(ctx context.Context, id string, n int64, mode string) (reply, error) {
	script, keys := s.m.acquire, s.keys[:3]
	args := []string{s.capArg, strconv.FormatInt(n, 10), id, s.m.leaseMs, s.m.pubMode}
	if mode != "" {
		script, keys = s.m.queue, s.keys
		args = []string{mode, s.capArg, args[1], id, s.m.leaseMs, s.m.pubMode}
	}
	if acks := int64(s.m.opts.ReplicaAcks); acks > 0 && n > 0 {
		res, got, err := s.m.bg.ExecWaitOrLate(ctx, script, keys, args, acks, s.m.opts.ReplicaTimeout,
			func(r scriptcache.Reply, _ int64, _ error) { s.releaseLate(r, id, mode) })
		if err != nil {
			// If the script ran and only WAIT failed, attempt releases the
			// grant, as after any failure other than ctx ending.
			return reply{}, err
		}
		r, err := s.parse(res)
		if err == nil && r.status == 1 && got < acks {
			// Too few replicas have it: a failover now could grant it again.
			s.cleanup(ctx, id)
			return reply{}, fmt.Errorf("%w: %q: %d of %d replicas", ErrNotReplicated, s.name, got, acks)
		}
		return r, err
	}
	var late func(scriptcache.Reply)
	switch {
	case n > 0 && mode == "":
		// mode is not captured: the closure is allocated on every call.
		late = func(r scriptcache.Reply) { s.releaseLate(r, id, "") }
	case n > 0:
		late = func(r scriptcache.Reply) { s.releaseLate(r, id, mode) }
	}
	return s.parse(s.m.bg.ExecOrLate(ctx, script, keys, args, late))
}

// releaseLate handles the reply to an acquire whose caller had gone: it
// releases id unless the reply says nothing was granted (and, in a fair
// mode, nothing queued either). An unknown outcome (no reply at all) is
// released too; releasing an id that is not held frees nothing.
func (s *Semaphore) releaseLate(r scriptcache.Reply, id, mode string) {
	if s.m.bg.Closed() {
		return // Close gave up the call, or came since: the lease ends it
	}
	if err := r.Error(); err != nil {
		if r.ServerError() {
			return // the script failed: nothing granted
		}
	} else if got, err := s.parse(r); err == nil && got.status != 1 && (mode == "" || got.status < 0) {
		return
	}
	s.cleanupInGroup(id)
}

// cleanupInGroup is cleanup run in a goroutine of the Manager's group,
// which Close ends at once rather than wait cleanupTimeout for a server
// that stopped answering: the lease ends what is left.
func (s *Semaphore) cleanupInGroup(id string) {
	ctx, cancel := s.m.bg.Bounded(cleanupTimeout)
	defer cancel()
	s.releaseCall(ctx, id)
}

// parse reads the acquire script's reply.
func (s *Semaphore) parse(res scriptcache.Reply) (reply, error) {
	vs, err := res.ToArray()
	if err != nil {
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

// attemptResult is what one attempt found.
type attemptResult struct {
	p    *Permit       // granted; nil if not
	wait time.Duration // not granted: how long to wait before the next try
	free int64         // not granted: permits free
	sent time.Time     // when the request was sent
}

// attempt tries to take n permits for id (mode as for call) for a waiting
// Acquire: once, or again at once, while ctx allows, after a grant whose
// answer came too late to be a hold (lease.ErrLate; given back, see
// newPermit). A fair Acquire then queues again: its entry went with the
// grant.
func (s *Semaphore) attempt(ctx context.Context, id string, n int64, mode string) (attemptResult, error) {
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
func (s *Semaphore) attemptOnce(ctx context.Context, id string, n int64, mode string) (attemptResult, error) {
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
			// Close gave up the call: no give-back (the server may not
			// answer), the lease ends what it may have granted.
			return res, fmt.Errorf("semaphore: acquire %q: %w", s.name, inner(err))
		}
		if cerr := ctx.Err(); cerr == nil || !errors.Is(err, cerr) {
			// The request failed (the connection, or WAIT after the
			// script): it may have run and granted the permit anyway. Give
			// it back so a failed Acquire holds nothing. A call abandoned
			// because ctx ended hands its late reply to releaseLate instead.
			s.cleanup(ctx, id)
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
		s.cleanup(ctx, id)
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
		s.cleanup(ctx, id)
		return nil, ErrClosed
	}
	return p, nil
}

// cleanup releases id (on a fair semaphore also its queue entry), best
// effort, with its own deadline since ctx may be done already.
func (s *Semaphore) cleanup(ctx context.Context, id string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	s.releaseCall(cctx, id)
}

// releaseCall runs the release script for id: on a fair semaphore the
// queue script, which also takes id out of the queue and grants what it
// frees to the waiters.
func (s *Semaphore) releaseCall(ctx context.Context, id string) scriptcache.Reply {
	if s.m.opts.Fair {
		return s.m.queue.Exec(ctx, s.keys, []string{"r", s.capArg, "0", id, "0", s.m.pubMode})
	}
	return s.m.release.Exec(ctx, s.keys[:3], []string{id, s.m.pubMode})
}

// Available returns how many permits are free now (0 while a lowered
// capacity is still exceeded). It reclaims expired permits on the way, so
// their capacity counts as free.
func (s *Semaphore) Available(ctx context.Context) (int64, error) {
	for range 64 {
		r, err := s.call(ctx, "", 0, "")
		if err != nil {
			if errors.Is(err, ErrCapacityMismatch) {
				return 0, err
			}
			return 0, fmt.Errorf("semaphore: available %q: %w", s.name, inner(err))
		}
		if r.wait != 0 || r.used == 0 {
			return max(r.capacity-r.used, 0), nil
		}
		// More than one batch of expired permits: reclaim the next.
	}
	return 0, fmt.Errorf("semaphore: available %q: too many expired permits to reclaim", s.name)
}

// SetCapacity changes the semaphore's capacity in Redis, for every process
// and whatever capacity their Semaphores were made with, while permits are
// held and for CapacityRetention after the last use (see "Capacity" in the
// package doc). Shrinking never revokes held permits: nothing is granted
// until the weight held is below the new capacity. Growing grants the new
// permits at once to fair waiters and wakes waiting Acquires. n must be in
// [1, MaxCapacity] (ErrInvalidCapacity).
func (s *Semaphore) SetCapacity(ctx context.Context, n int64) error {
	if n < 1 || n > MaxCapacity {
		return fmt.Errorf("%w: %d outside [1, %d]", ErrInvalidCapacity, n, int64(MaxCapacity))
	}
	vs, err := s.m.queue.Exec(ctx, s.keys, []string{"c", strconv.FormatInt(n, 10), "0", "", retentionMs, s.m.pubMode}).ToArray()
	if err != nil {
		return fmt.Errorf("semaphore: set capacity %q: %w", s.name, inner(err))
	}
	if vs.Len() != 2 {
		return fmt.Errorf("semaphore: set capacity %q: unexpected reply of %d values", s.name, vs.Len())
	}
	return nil
}

// Holder is one live permit, as listed by Holders.
type Holder struct {
	// ID is the permit's id (Permit.ID).
	ID string
	// Weight is how many permits it holds.
	Weight int64
	// Remaining is how long its lease has left on the server's clock.
	Remaining time.Duration
	// Owner is the label of the Semaphore that granted it (WithOwner), or
	// "" if it had none.
	Owner string
}

// Holders lists the live permits of the semaphore, earliest expiry first,
// for operators. Expired permits not yet reclaimed are not listed.
func (s *Semaphore) Holders(ctx context.Context) ([]Holder, error) {
	vs, err := s.m.holders.Exec(ctx, s.keys[:2], nil).ToArray()
	if err != nil {
		return nil, fmt.Errorf("semaphore: holders %q: %w", s.name, inner(err))
	}
	if vs.Len()%3 != 0 {
		return nil, fmt.Errorf("semaphore: holders %q: unexpected reply of %d values", s.name, vs.Len())
	}
	out := make([]Holder, 0, vs.Len()/3)
	for i := 0; i < vs.Len(); i += 3 {
		id, err1 := vs.At(i).ToString()
		ws, err2 := vs.At(i + 1).ToString()
		ms, err3 := vs.At(i + 2).AsInt64()
		w, err4 := strconv.ParseInt(ws, 10, 64)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return nil, fmt.Errorf("semaphore: holders %q: unexpected reply: %w", s.name, err)
		}
		out = append(out, Holder{ID: id, Weight: w, Remaining: time.Duration(ms) * time.Millisecond, Owner: ownerOf(id)})
	}
	return out, nil
}

// Info is what Redis says about a semaphore, as Info reads it.
type Info struct {
	// Capacity is the capacity in force: the one SetCapacity set, else the
	// one the live permits were granted under, else (none is held) this
	// Semaphore's.
	Capacity int64
	// CapacitySet reports whether SetCapacity set it (see "Capacity" in
	// the package doc).
	CapacitySet bool
	// Used is the weight of the live permits. Expired permits not
	// reclaimed yet are left out, the 16 oldest of them exactly; if more
	// than 16 remain (Expired > 16), the weight of the rest still counts.
	Used int64
	// Available is Capacity - Used, or 0 while a lowered capacity is
	// still exceeded.
	Available int64
	// Holders is how many live permits there are (one per Acquire).
	Holders int64
	// Expired is how many permits have expired and not been reclaimed yet
	// (the next acquire in their way, or Available, reclaims them).
	Expired int64
	// Queued is how many fair waiters are in the queue, live or not yet
	// found dead; always 0 on a semaphore nobody waits on fairly.
	Queued int64
}

// Info reads the state of the semaphore from Redis, whoever holds its
// permits, in one read-only call of bounded cost: nothing is reclaimed,
// unlike Available. Unlike Holders it does not list the permits.
func (s *Semaphore) Info(ctx context.Context) (Info, error) {
	vs, err := s.m.info.Exec(ctx, []string{s.keys[0], s.keys[1], s.keys[3]}, nil).ToArray()
	if err == nil && vs.Len() != 6 {
		err = fmt.Errorf("unexpected reply of %d values", vs.Len())
	}
	if err != nil {
		return Info{}, fmt.Errorf("semaphore: info %q: %w", s.name, err)
	}
	var v [6]int64
	for i := range v {
		if v[i], err = vs.At(i).AsInt64(); err != nil {
			return Info{}, fmt.Errorf("semaphore: info %q: unexpected reply: %w", s.name, err)
		}
	}
	in := Info{Capacity: v[0], CapacitySet: v[1] == 1, Used: v[2], Holders: v[3], Expired: v[4], Queued: v[5]}
	if in.Holders == 0 {
		in.Used = 0 // only expired permits are left
		if !in.CapacitySet {
			in.Capacity = 0 // the next Acquire brings its own
		}
	}
	if in.Capacity == 0 {
		in.Capacity = s.capacity
	}
	in.Available = max(in.Capacity-in.Used, 0)
	return in, nil
}

// Permit is a number of permits taken by one Acquire. Its methods are safe
// for concurrent use.
type Permit struct {
	s       *Semaphore
	id      string
	weight  int64
	lost    chan struct{} // closed on loss
	since   time.Time     // when the request that granted it was sent
	handoff bool          // a fair release granted it; set before Acquire returns

	op sync.Mutex // serializes Release

	mu        sync.Mutex // guards the fields below; never held across a call
	lse       *lease.Lease
	err       error // why the permit was lost
	released  bool  // Release got an answer
	releasing bool  // a Release is in flight: a loss waits in deferred
	deferred  error // a loss reported while Release was in flight
	// stopped: a Release has begun, so the permit is not renewed any
	// more and is not to be counted on (HeldUntil, Context).
	stopped bool
	// scoped cancels the contexts Context made, when the permit is lost
	// or a Release returns.
	scoped lease.Scopes
}

// ID returns the permit's id, as listed by Holders.
func (p *Permit) ID() string { return p.id }

// Weight returns how many permits this Permit holds.
func (p *Permit) Weight() int64 { return p.weight }

// Lost returns a channel that is closed when the permit is lost before it
// is released. Release does not close it, and once Release has returned nil
// it is never closed: a loss the watchdog reports while a Release is in
// flight counts only if that Release fails.
func (p *Permit) Lost() <-chan struct{} { return p.lost }

// Err returns why the permit was lost (wrapping ErrLost), or nil.
func (p *Permit) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Release gives the permits back and wakes waiters. It returns an error
// wrapping ErrNotHeld if they were not held any more (released before,
// expired, deleted); nothing else is freed then. If Release fails with any
// other error (the reply was lost), calling it again is safe: it never frees
// anything but this permit, and answers ErrNotHeld if the first call did
// release it. Either way the permit is no longer renewed, so at worst it
// expires within one lease.
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
	// Stop renewing first: if the release fails, the permit must not be
	// kept alive by the watchdog forever.
	lse.Stop()
	vs, err := p.s.releaseCall(ctx, p.id).ToArray()
	held := int64(-1)
	if err == nil && vs.Len() == 2 {
		held, _ = vs.At(0).AsInt64()
	}
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

// renewPermits is the watchdog's renewal of items (*Permit, all with the
// watchdog lease, in one group) in one call. Each semaphore's keys are
// sent once, with the permits of it in the call pointing at them.
func (m *Manager) renewPermits(ctx context.Context, items []any, errs []error) error {
	keys := batchKeys{which: permitKeys, keys: make([]string, 0, 8)}
	args := make([]string, 1+2*len(items))
	args[0] = m.leaseMs
	for i, it := range items {
		p := it.(*Permit)
		args[1+2*i], args[2+2*i] = keys.number(p.s), p.id
	}
	vals, err := m.renewBatch.Exec(ctx, keys.keys, args).ToArray()
	if err != nil {
		return err
	}
	if vals.Len() != len(items) {
		return fmt.Errorf("semaphore: renewal of %d permits answered %d", len(items), vals.Len())
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

// batchKeys builds the KEYS of one batched call over semaphores of one
// slot (semaphore_renew_batch, semaphore_queue_refresh): each semaphore's
// keys are sent once, and its items in ARGV name it by its number.
type batchKeys struct {
	which []int             // the positions in Semaphore.keys sent for each semaphore
	keys  []string          // as sent
	index map[string]string // permits hash -> its number
	prev  *Semaphore        // the last one numbered, and its number
	j     string
}

// The keys semaphore_renew_batch and semaphore_queue_refresh take for each
// semaphore: permits hash and expiry set, and those with the queue and its
// entries.
var (
	permitKeys = []int{0, 1}
	queueKeys  = []int{0, 1, 3, 4}
)

// number returns s's number in the call (1-based), adding its keys when s
// first comes.
func (b *batchKeys) number(s *Semaphore) string {
	if s == b.prev {
		return b.j // items of one semaphore often come together: no lookup
	}
	j, ok := b.index[s.keys[0]]
	if !ok {
		for _, w := range b.which {
			b.keys = append(b.keys, s.keys[w])
		}
		j = strconv.Itoa(len(b.keys) / len(b.which))
		if b.index == nil {
			b.index = make(map[string]string)
		}
		b.index[s.keys[0]] = j
	}
	b.prev, b.j = s, j
	return j
}

// errRenewGone is the loss reason when the watchdog finds a permit gone.
var errRenewGone = fmt.Errorf("%w: expired or deleted", lease.ErrGone)

// lose records the loss of the permit; called by the lease keeper.
func (p *Permit) lose(cause error) {
	if errors.Is(cause, lease.ErrClosed) {
		cause = fmt.Errorf("%w: %w", ErrClosed, inner(cause))
	}
	err := fmt.Errorf("%w: %q: %w", ErrLost, p.s.name, inner(cause))
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.releasing {
		if p.deferred == nil {
			p.deferred = err
		}
		return
	}
	p.loseLocked(err)
}

// loseLocked records the loss err (wrapping ErrLost) unless the permit was
// released or already lost. Called with p.mu held.
func (p *Permit) loseLocked(err error) {
	if p.released || p.err != nil {
		return
	}
	p.err = err
	if o := p.s.m.obs; o != nil { // before the holder is told
		o.Observe(scriptcache.Event{Kind: scriptcache.EventLost, Primitive: scriptcache.PrimitiveSemaphore, Name: p.s.event, Hold: time.Since(p.since), Weight: p.weight,
			Reason: obs.LossReason(err), Err: err})
	}
	close(p.lost)
	p.scoped.End(err)
}
