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
// permits are now free if an Acquire may be waiting (one was refused, or
// took its permits after a wait, since the semaphore's keys were made; a
// release nobody waits for publishes nothing), and each process wakes only
// as many of its local waiters as that many permits could satisfy, in
// arrival order, not the whole herd. A waiter that needs more permits than
// were freed is skipped for lighter ones behind it that fit, and a woken
// waiter that finds too few permits free (another process took some first)
// offers the rest to the waiters behind it. On a Redis 7 cluster the
// channel is sharded (SPUBLISH).
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
// A semaphore named S is the sorted set PREFIX{S}:e (permit id to expiry,
// server milliseconds), the hash PREFIX{S} (the capacity, the weight in
// use beyond the number of permits, whether an Acquire may be waiting, a
// time before which both keys do not expire, and the weight of each permit
// of more than one) and the channel PREFIX{S}:w; a fair one also has its
// queue PREFIX{S}:q (waiter to arrival) and PREFIX{S}:qe (waiter to
// entry). PREFIX defaults to "sluice:sem:"; the braces keep everything in
// one cluster slot. A permit id is a UUID, followed by "/" and the label
// of WithOwner if its Semaphore has one (Holders reads it back). The
// permit keys expire with the latest permit (or up to a sixteenth of a
// lease after it) and are deleted with the last one, the queue keys a
// lease after the last refresh (or up to a sixteenth more) and when the
// queue empties, so an idle semaphore leaves nothing behind, except a
// capacity set by SetCapacity, kept in the hash for CapacityRetention.
// The sorted set lists only what the hash counts: an operator who deletes
// the hash alone ends every permit it counted (their holders are told at
// the next renewal), and the next grant drops what the set still lists.
//
// On miniredis (tests, examples) the rueidis client needs DisableCache and
// AlwaysRESP2.
package semaphore

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/google/uuid"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/notify"
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
	// acquireFlags is semaphore_acquire's ARGV[5] for each attemptMode:
	// pubMode, then the mode's letter.
	acquireFlags [len(modeLetters)]string

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
	for i, l := range modeLetters {
		m.acquireFlags[i] = m.pubMode + l
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
// first keeps every id clear of the hash's reserved fields (':cap').
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
