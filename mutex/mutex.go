// Package mutex is a distributed, reentrant lease lock on Redis, in the style
// of Redisson's RLock, with fencing tokens and a loss signal.
//
// A Locker owns what the locks of a process share: one pub/sub subscription
// per lock name that anyone here waits on, and one watchdog that renews every
// held lease. Create one per process and Close it on shutdown. A Mutex is one
// owner of one named lock:
//
//	client, err := sluice.New(ctx, rdb) // or goredis.New for go-redis
//	locks, err := mutex.NewLocker(client, mutex.Options{})
//	defer locks.Close()
//	m, err := locks.Lock(ctx, "order:42") // NewMutex, then its Lock
//	if err != nil { ... }
//	defer m.Unlock(ctx)
//
// # Owners and reentrancy
//
// Every Mutex value has its own owner id (the Locker's random id and a
// number, or WithOwner). Lock on a value that already holds the lock
// nests, and each Unlock undoes one Lock; the lock is free after the last.
// Owner identity is the value, not the goroutine: goroutines that must
// exclude each other need a Mutex each. NewMutex is cheap (two
// allocations, nothing sent to Redis; all of a Locker's Mutexes share its
// subscriptions), so a request handler can make one per request: a Lock
// and Unlock pair on a fresh Mutex costs six allocations, on a reused one
// four (on rueidis, calls one at a time; its pipelining adds about two
// under load). A held lock with its Mutex takes about 460 bytes of heap (with a
// name of a dozen bytes, measured by the package's tests).
//
// # Leases
//
// With Options.Lease zero, a lock is held with a WatchdogLease (30 s) that the
// Locker renews every third of it while the lock is held, so a crashed
// process frees it within one lease. With a Lease set, there is no renewal:
// the lock expires by itself that long after the outermost Lock.
//
// # Loss
//
// A holder can lose the lock: the key was deleted or expired, Redis restarted
// without persistence, renewals failed for a whole lease (a partition, a
// paused process), or the Locker was closed. The holder is told: Lost's
// channel closes and Err returns an error wrapping ErrLost and the reason.
// Loss is judged on the client clock, counting each lease from before the
// request that set it was sent and giving it up a margin early (a tenth of
// the lease, at least 5 ms and at most 1 s), so the signal comes before
// Redis could have let anyone else in, provided the process is scheduled
// within that margin: a process stopped for longer (a VM pause, SIGSTOP,
// swapping) hears of the loss too late. HeldUntil and Valid read the client
// clock instead of waiting for the watchdog, so a check right before a
// write catches a process resumed past its lease at once. Work that must
// not run without the lock should watch Lost or check Valid and, better,
// use the fencing token.
//
// # Fencing tokens
//
// Token returns a number issued to each outermost acquisition; it is strictly
// greater than the tokens of every earlier acquisition of the same lock name,
// so a storage layer that remembers the highest token it has seen can refuse
// a write from a holder that lost the lock without knowing (a GC pause, a
// partition). Tokens are the Redis server's clock in microseconds, or one more
// than the previous token when that is larger; the previous token is kept
// for a second after a release. No key is left behind for them. Monotonicity
// breaks only if the Redis clock steps back by more than that second while
// the lock is free, or on failover to a replica whose clock is behind the old
// primary's, or that did not receive the last acquisitions (replication is
// asynchronous). Redis locks are leases, not consensus: the fencing check in
// the storage is what makes a stale holder harmless.
//
// # Waiting
//
// A Lock that finds the lock held subscribes to the lock's channel, waits for
// the subscription to be confirmed (so no release is missed between attempt
// and subscription), and then tries again whenever a release is published, or
// when the holder's lease runs out, whichever comes first; an Extend that
// shortens the holder's lease wakes the waiters, so that they wait for the
// new end. A release wakes one waiter per process, which passes its turn
// on: once it took the lock its release publishes, and if it gives up
// instead, the next waiter of its process tries in its place. An Unlock
// publishes only if a Lock was refused since the lock's hash was made (it
// lives until the lock has stayed free for a second, or a lease ran out), a
// Lock that waited took the lock, or fair waiters queued: an uncontended
// Lock and Unlock publish nothing. On a Redis 7 cluster the channel is
// sharded (SPUBLISH), so a release does not travel to every node. Lost
// messages or a dropped pub/sub connection can delay a waiter until the
// holder's lease ends, never longer.
//
// # Fair locks
//
// With Options.Fair (or WithFair), waiting Locks queue in Redis in arrival
// order, and a release hands the lock straight to the first live waiter,
// with a new fencing token and a message naming it, so the waiter holds the
// lock when the message arrives, without another round trip and without
// anyone barging in between. A holder that unlocks and locks again queues
// behind those already waiting, and a fair TryLock fails while others wait.
//
// The Locker refreshes the entries of its waiting Locks every min(lease/3,
// 1 s), many in one call (one call per cluster slot and round, up to 512
// entries), so a thousand waiters do not make a thousand calls a second; an
// entry not refreshed for a lease is dead and skipped. A waiter whose entry
// a refresh finds gone (a release handed it the lock and the message was
// lost, or it was dropped as dead) is woken and looks at once; otherwise a
// waiter calls Redis itself only when woken or when the holder's lease
// would run out. A hand-off gives the lock a
// lease that ends when the waiter's entry would have, so a waiter that died
// at the head of the queue blocks the lock for at most its entry's lease;
// one whose Lock gives up (ctx ended) leaves the queue at once and gives
// back a grant that reached it meanwhile. Releases skip at most 16 dead
// entries each. Leases and loss work as for any hold: the hand-off's lease
// is counted from before the waiter's last refresh was sent.
//
// Unfair Locks ignore the queue, so all processes using a name should use
// the same mode; an unfair release still hands the lock to a queued fair
// waiter.
//
// # Abandoned attempts
//
// When a Lock's context ends while its request is in flight, or the
// connection fails, Redis may still grant the lock to an owner that has
// stopped waiting. The Locker then sends, at once and in the background, a
// script that gives back exactly what that attempt took (each outermost
// attempt is recorded in the lock by its own id) and nothing a later
// attempt took, so a lock nobody knows it holds does not block everyone for
// a lease. The give-back may reach Redis before the attempt (rueidis spreads
// calls over several connections): it then leaves a tombstone, kept for a
// lease, that makes the attempt refuse itself when it arrives. No goroutine
// waits for the reply of a Lock; an attempt delayed past its tombstone can
// still grant, and that grant ends with its lease.
//
// # Keys
//
// A lock named N is the hash PREFIX{N}, its channel PREFIX{N}:w, the
// tombstones of abandoned attempts PREFIX{N}:x and, for fair waiters, the
// queue PREFIX{N}:q and its entries PREFIX{N}:e (PREFIX defaults to
// "sluice:mutex:"); the braces keep all in one cluster slot. Every key
// expires: a free lock leaves none, apart from the released hash for
// min(1 s, lease), and tombstones and queue keys for a lease after their
// last use.
//
// On miniredis (tests, the embedded demo) the rueidis client needs
// DisableCache and AlwaysRESP2 (pub/sub on its own connection).
package mutex

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
	// ErrNotObtained means Lock gave up (its context ended; the error also
	// wraps ctx.Err()) or TryLock found the lock held by another owner, or
	// was granted it by an answer that came after the lease had ended
	// (given back at once; Lock tries again instead).
	ErrNotObtained = errors.New("mutex: not obtained")
	// ErrNotHeld means Unlock was called by a Mutex that does not hold the
	// lock (never locked, already unlocked, or lost). Nothing was changed.
	ErrNotHeld = errors.New("mutex: not held")
	// ErrLost means a held lock was lost; Err wraps it with the reason.
	ErrLost = errors.New("mutex: lock lost")
	// ErrClosed means the Locker was closed.
	ErrClosed = errors.New("mutex: locker closed")
	// ErrInvalidName means the lock name is empty or too long.
	ErrInvalidName = errors.New("mutex: invalid name")
	// ErrInvalidOptions means Options or a LockOption is out of range.
	ErrInvalidOptions = errors.New("mutex: invalid options")
	// ErrNotReplicated means Options.ReplicaAcks replicas did not confirm
	// an acquisition in time; it was released again and is not held.
	ErrNotReplicated = errors.New("mutex: acquisition not acknowledged by replicas")
	// ErrSubscribe means Redis refused the subscription a waiting Lock
	// needs to hear of releases (NOPERM: a Redis 7 ACL user gets no
	// channels by default; grant it the lock channels, e.g. &sluice:mutex:*).
	// Lock returns it rather than silently polling at the pace of the
	// holder's lease. The releasing scripts PUBLISH too, so such a user
	// cannot Unlock either.
	ErrSubscribe = errors.New("mutex: subscription refused")
)

// Defaults for Options.
const (
	DefaultWatchdogLease  = 30 * time.Second
	DefaultPrefix         = "sluice:mutex:"
	DefaultReplicaTimeout = 100 * time.Millisecond
)

// Options configure a Locker. The zero value is the default.
type Options struct {
	// Lease is a fixed lease for every lock: it expires that long after the
	// outermost Lock unless unlocked before, and is never renewed. Zero
	// means a watchdog lease instead.
	Lease time.Duration
	// WatchdogLease is the lease of a lock without a fixed Lease; it is
	// renewed every WatchdogLease/3 while the lock is held. Zero means
	// DefaultWatchdogLease (30 s). At least 30 ms.
	WatchdogLease time.Duration
	// Prefix starts every key. Empty means DefaultPrefix. It must not
	// contain braces (they would move the cluster hash tag).
	Prefix string
	// ReplicaAcks, when above zero, makes every outermost acquisition wait
	// (Redis WAIT) until that many replicas have the lock; if they do not
	// within ReplicaTimeout, the lock is released again and Lock returns
	// ErrNotReplicated. It narrows, but cannot close, the window in which
	// a failover to a replica loses a granted lock: replication stays
	// asynchronous, and a replica that acknowledged may still not be the
	// one promoted. Zero (the default) does not wait.
	ReplicaAcks int
	// ReplicaTimeout bounds the wait for ReplicaAcks. Zero means
	// DefaultReplicaTimeout (100 ms).
	ReplicaTimeout time.Duration
	// Fair makes Mutexes wait in a first-come, first-served queue kept in
	// Redis, and makes a release hand the lock straight to the first
	// waiter (see "Fair locks" in the package doc). WithFair overrides it
	// per Mutex. Every process locking a name should agree: an unfair
	// Lock ignores the queue.
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

// Locker creates Mutexes and owns what they share. It is safe for
// concurrent use.
type Locker struct {
	opts    Options
	pubMode string // ARGV for the scripts: "s" (SPUBLISH) or "p"

	lock, release, renew *scriptcache.Script
	renewBatch, info     *scriptcache.Script
	queueRefresh         *scriptcache.Script
	sc                   *scriptcache.Cache

	// defaults are the settings of a Mutex made without options.
	defaults settings
	// id starts the generated owner ids and attempt ids of this Locker's
	// Mutexes: random, so that they differ from every other Locker's;
	// seq numbers the Mutexes.
	id  string
	seq atomic.Uint64

	hub    *notify.Hub
	keeper *lease.Keeper
	closed atomic.Bool
	obs    scriptcache.Observer // nil: nothing reported

	// groups renew the Mutexes' watchdog leases together, one group per
	// cluster slot (a script's keys must share one). rwGroups do the same
	// for the RWMutexes, apart: a batch is one script call, and the two
	// kinds of lock are renewed by different scripts (a Mutex's hold lasts
	// as long as its key's TTL; an RWMutex's write and read holds end at
	// times stored in keys shared with other holders), so a group of both
	// would still take a call per kind.
	groups, rwGroups *lease.Slots
	// queued refresh the queue entries of waiting fair Locks, many per
	// call, one group per cluster slot (see queueEntry).
	queued *lease.Slots

	// bg runs give-backs of abandoned attempts and the calls of
	// ExecWaitOrLate (ReplicaAcks) whose callers may leave; Close waits
	// for them.
	bg *scriptexec.Group
}

// NewLocker returns a Locker that runs its scripts through sc.
func NewLocker(sc *sluice.Client, opts Options) (*Locker, error) {
	if sc == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidOptions)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	l := &Locker{opts: opts, pubMode: "p", sc: sc, bg: scriptexec.NewGroup(ErrClosed), id: newLockerID()}
	l.defaults.setLease(opts, opts.Lease)
	l.defaults.fair, l.defaults.prim = opts.Fair, scriptcache.PrimitiveMutex
	if sc.ShardedPubSub() {
		l.pubMode = "s"
	}
	for name, dst := range map[string]**scriptcache.Script{
		"mutex_lock": &l.lock, "mutex_release": &l.release, "mutex_renew": &l.renew,
		"mutex_renew_batch": &l.renewBatch, "mutex_info": &l.info, "mutex_queue_refresh": &l.queueRefresh,
	} {
		if *dst, err = sc.Script(name); err != nil {
			return nil, fmt.Errorf("mutex: %w", err)
		}
	}
	l.obs = sc.Observer()
	l.hub = notify.NewObserved(sc.Client(), sc.ShardedPubSub(), l.obs, scriptcache.PrimitiveMutex, ErrSubscribe)
	l.keeper = lease.NewKeeper()
	l.groups = l.keeper.NewSlots(sc.Cluster(), l.renewLeases)
	l.rwGroups = l.keeper.NewSlots(sc.Cluster(), l.renewRW)
	l.queued = l.keeper.NewSlots(sc.Cluster(), l.refreshEntries)
	return l, nil
}

// newLockerID returns 120 random bits in 20 bytes of base64url, then a
// dot; what follows is a number in base 36. Owner ids made from it need
// not be UUIDs: they only must not repeat, and fewer bytes per id is less
// memory per held lock, here and in Redis.
func newLockerID() string {
	var b [15]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:]) + "."
}

// Close stops the watchdog and the subscriptions and waits for their
// goroutines. Locks still held are no longer renewed: their holders are told
// (Lost closes, Err wraps ErrClosed) and the locks expire by their lease
// unless unlocked. Waiting Locks return ErrClosed; a fair one leaves the
// queue before it returns.
func (l *Locker) Close() {
	if l.closed.Swap(true) {
		return
	}
	l.hub.Close()
	l.keeper.Close()
	l.bg.Close()
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
	l.release.Exec(ctx, keys[:], []string{"a", l.pubMode, m.set.keepMs, m.owner, attempt, m.set.leaseMs})
}

// LockOption configures one lock: a Mutex, an RWMutex or a MultiMutex
// (Options configures the Locker). WithOwner, WithLease and WithFair make
// them; the zero LockOption changes nothing.
type LockOption struct {
	apply func(*Mutex) error
}

// applyTo applies o to m: the options of an RWMutex or a MultiMutex are
// applied to a Mutex too, and read from it.
func (o LockOption) applyTo(m *Mutex) error {
	if o.apply == nil {
		return nil
	}
	return o.apply(m)
}

// WithOwner sets the owner id instead of a generated one, for example to
// take over a lock after a process restart. Two live Mutexes must never
// share an owner id: they would hold the lock together.
func WithOwner(id string) LockOption {
	return LockOption{func(m *Mutex) error {
		if id == "" || len(id) > keyspace.MaxNameLen {
			return fmt.Errorf("%w: owner id must be 1 to %d bytes", ErrInvalidOptions, keyspace.MaxNameLen)
		}
		m.owner = id
		return nil
	}}
}

// WithLease gives this Mutex a fixed lease (no renewal) instead of the
// Locker's setting; zero restores the watchdog.
func WithLease(d time.Duration) LockOption {
	return LockOption{func(m *Mutex) error {
		if err := lease.CheckFixed(d); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidOptions, err)
		}
		m.own().setLease(m.l.opts, d)
		return nil
	}}
}

// WithFair makes this Mutex wait in the lock's queue (true) or compete
// for it on every release (false), whatever Options.Fair says.
func WithFair(fair bool) LockOption {
	return LockOption{func(m *Mutex) error {
		if m.set.fair != fair {
			m.own().fair = fair
		}
		return nil
	}}
}

// NewMutex returns a Mutex for the lock called name, with its own owner id.
// It does not talk to Redis, and without options it makes two allocations.
func (l *Locker) NewMutex(name string, opts ...LockOption) (*Mutex, error) {
	if err := keyspace.CheckName(name); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidName, err)
	}
	m := &Mutex{l: l, set: &l.defaults}
	for _, opt := range opts {
		if err := opt.applyTo(m); err != nil {
			return nil, err
		}
	}
	m.makeIDs(name)
	if m.set.watchdog {
		m.group = l.groups.Group(m.key(keyLock))
	}
	return m, nil
}

// makeIDs builds, in one allocation, the lock's keys, and the prefix of
// this value's attempt ids (see nextAttemptID), which is also its owner id
// unless WithOwner set one: the Locker's random id and a number of this
// Mutex. Attempt ids must differ from those of every other Mutex value,
// even one with the same owner id in another process (WithOwner after a
// restart), so they never start with a given owner id.
func (m *Mutex) makeIDs(name string) {
	var buf [128]byte // on the stack for names up to about 100 bytes
	base := keyspace.AppendKey(buf[:0], m.l.opts.Prefix, name, "")
	var num [16]byte
	seq := strconv.AppendUint(num[:0], m.l.seq.Add(1), 36)
	var b strings.Builder
	b.Grow(4*(len(base)+2) + len(m.l.id) + len(seq))
	for _, suffix := range [...]string{":w", ":x", ":q", ":e"} {
		b.Write(base)
		b.WriteString(suffix)
	}
	b.WriteString(m.l.id)
	b.Write(seq)
	m.ids, m.keyLen = b.String(), int32(len(base))
	if m.owner == "" {
		m.owner = m.nonce()
	}
}

// The lock's keys, by their index for Mutex.key.
const (
	keyLock    = iota // the lock hash
	keyWake           // wake-up channel
	keyTomb           // tombstones of abandoned attempts
	keyQueue          // fair queue
	keyEntries        // the queue's entries
)

// key returns one of the lock's keys (keyLock, ...). They are substrings
// of m.ids, which holds "K:w", "K:x", "K:q", "K:e" (K the lock hash) and
// then the nonce.
func (m *Mutex) key(i int) string {
	n := int(m.keyLen)
	if i == keyLock {
		return m.ids[:n]
	}
	return m.ids[(i-1)*(n+2) : i*(n+2)]
}

// lockKeys returns the KEYS of mutex_lock; an array, so that a call made
// with them allocates nothing.
func (m *Mutex) lockKeys() [4]string {
	return [4]string{m.key(keyLock), m.key(keyTomb), m.key(keyQueue), m.key(keyEntries)}
}

// releaseKeys returns the KEYS of mutex_release.
func (m *Mutex) releaseKeys() [5]string {
	return [5]string{m.key(keyLock), m.key(keyWake), m.key(keyQueue), m.key(keyEntries), m.key(keyTomb)}
}

// nonce returns the prefix of this value's attempt ids.
func (m *Mutex) nonce() string { return m.ids[4*(int(m.keyLen)+2):] }

// Mutex is one owner of one named lock. Its methods are safe for concurrent
// use, but remember that every Lock on the same Mutex nests.
//
// A process may keep a million of them, so a Mutex is kept small: what
// Mutexes of one Locker share is in settings, and its keys and ids are
// one string.
type Mutex struct {
	l     *Locker
	set   *settings    // the Locker's defaults unless options changed them
	ids   string       // keys and nonce: see key
	owner string       // owner id: the nonce, or WithOwner's
	group *lease.Group // renews the watchdog's lease with others; nil for a fixed lease

	op       sync.Mutex // one script call at a time, so hold counts stay in step
	attempts uint64     // outermost attempts so far, names each; guarded by op

	mu       sync.Mutex // guards the fields below; never held across a call
	holds    int64
	token    int64
	tokenArg string        // token as sent to the scripts
	gen      uint64        // counts outermost acquisitions; tells stale loss reports apart
	since    time.Duration // when the request of the current hold was sent, on the epoch's clock
	lse      *lease.Lease
	lost     chan struct{} // made on demand by Lost; closedChan once lost
	err      error
	// pending is a loss reported while the final Unlock is in flight
	// (releasing): a release that succeeds proves the hold lasted until
	// it (the renewal that found the key gone may simply have run just
	// after it), so the loss waits for its reply.
	pending error
	// scoped cancels the contexts Context made for the current hold; nil
	// until Context is first called.
	scoped *lease.Scopes

	keyLen    int32 // length of the lock hash's key; not guarded (set once)
	releasing bool  // the current hold's final Unlock is in flight
	// orphaned: a hold declared lost (token tokenArg) that the server may
	// still keep under this owner; the next Unlock gives it back so that
	// it does not linger for the rest of its lease.
	orphaned bool
	// unacked: a hold the caller got was lost and no Unlock has been
	// called since. A Lock meanwhile would nest in a hold that is gone, so
	// it returns the loss (see lossUnacked); the first Unlock clears it.
	unacked bool
}

// settings are what Mutexes share unless their options differ.
type settings struct {
	lease    time.Duration
	watchdog bool
	fair     bool          // waits in the queue
	leaseMs  string        // lease in ms, as sent
	keepMs   string        // how long a released hash is kept, in ms
	recheck  time.Duration // how often a fair waiter's queue entry is refreshed
	prim     string        // Event.Primitive: mutex, or multimutex for a MultiMutex's
}

// own returns m's settings, copied first if they are the Locker's.
func (m *Mutex) own() *settings {
	if m.set == &m.l.defaults {
		c := *m.set
		m.set = &c
	}
	return m.set
}

// setLease gives s the lease d, fixed, or the watchdog's for zero.
func (s *settings) setLease(opts Options, d time.Duration) {
	c := opts.leaseConfig()
	c.Fixed = d
	s.lease, s.watchdog = c.Effective()
	s.leaseMs = strconv.FormatInt(s.lease.Milliseconds(), 10)
	s.keepMs = strconv.FormatInt(min(time.Second, s.lease).Milliseconds(), 10)
	s.recheck = min(s.lease/3, time.Second)
}

// epoch is the origin of Mutex.since, read with a monotonic clock.
var epoch = time.Now()

// closedChan is returned by Lost when nothing is held.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Name returns the lock's name.
func (m *Mutex) Name() string { return keyspace.NameOf(m.key(keyLock), m.l.opts.Prefix) }

// Owner returns this Mutex's owner id.
func (m *Mutex) Owner() string { return m.owner }

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
		if err := w.Ready(ctx, m.waitFor(res.wait)); err != nil {
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
	ctx, cancel := context.WithCancel(context.Background())
	// No deadline: see scriptexec.Group.Bounded.
	t := time.AfterFunc(min(m.set.lease, leaveAfterClose), cancel)
	defer t.Stop()
	defer cancel()
	m.l.sendGiveBack(ctx, m, id)
}

// leaveAfterClose bounds the give-back of a fair Lock that ends after its
// Locker closed (see leaveQueue): as long as Close gives the background
// give-backs it waits for.
const leaveAfterClose = time.Second

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
// attempt after a refusal: if it takes the lock, it marks the hash so that
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
	// On the stack: a rueidis call does not keep them (see
	// scriptcache.Cache.eval), and other clients get copies.
	argv := [6]string{m.owner, m.set.leaseMs, strconv.FormatInt(holds, 10), "", "", ""}
	if holds == 0 {
		if *id == "" {
			*id = m.nextAttemptID()
		}
		argv[3] = *id
		switch {
		case m.set.fair && try:
			argv[5] = "t"
		case m.set.fair:
			argv[5] = "f"
		case waited:
			argv[5] = "w"
		}
	} else {
		argv[4] = tokenArg
	}
	keys := m.lockKeys()
	var r scriptcache.Array
	var err error
	acks := int64(-1) // not asked
	if m.l.opts.ReplicaAcks > 0 && holds == 0 {
		var rr scriptcache.Reply
		attempt := argv[3]
		// Copies on the heap: the call may outlive this Lock (its caller
		// left), and its NOSCRIPT retry resends them.
		rr, acks, err = m.l.bg.ExecWaitOrLate(ctx, m.l.lock, slices.Clone(keys[:]), slices.Clone(argv[:]), int64(m.l.opts.ReplicaAcks), m.l.opts.ReplicaTimeout,
			func(late scriptcache.Reply, _ int64, _ error) {
				// Whatever the replicas said, nobody waits for this grant.
				if grantedOrUnknown(late) || m.set.fair {
					m.l.giveBack(m, attempt)
				}
			})
		if err == nil {
			r, err = rr.ToArray()
		}
	} else {
		rep := m.l.lock.Exec(ctx, keys[:], argv[:])
		if r, err = rep.ToArray(); err != nil && holds == 0 && !rep.ServerError() {
			// ctx ended before the reply, or the connection failed: the
			// attempt may run, or have run, and nobody would know of its
			// grant (or its queue entry). The give-back goes at once; its
			// tombstone makes it work in whichever order the two reach
			// Redis. A fair Lock's attempt may have queued: it leaves the
			// queue even after Close (see leaveQueue).
			if m.set.fair && !try {
				m.leaveQueue(true, argv[3])
			} else {
				m.l.giveBack(m, argv[3])
			}
		}
	}
	if err != nil {
		return res, fmt.Errorf("mutex: lock %q: %w", m.Name(), inner(err))
	}
	if r.Len() != 3 {
		return res, fmt.Errorf("mutex: lock %q: unexpected reply of %d values", m.Name(), r.Len())
	}
	got, _ := r.At(0).AsInt64()
	n, _ := r.At(1).AsInt64()
	if got < 0 {
		// A nested Lock whose outer hold is gone (expired, deleted, taken
		// over): the outer section no longer excludes anyone. Report the
		// loss; never start a new hold the caller would take for the old.
		return res, m.foundNotHeld(heldGen)
	}
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
	token, _ := r.At(2).AsInt64()
	if acks >= 0 && acks < int64(m.l.opts.ReplicaAcks) {
		// Too few replicas have it: a failover now could hand it to
		// someone else, so give it back.
		m.releaseGrant(ctx, token)
		return res, fmt.Errorf("%w: %q: %d of %d replicas", ErrNotReplicated, m.Name(), acks, m.l.opts.ReplicaAcks)
	}
	if holds > 0 {
		return res, m.nest(heldGen, n, &res)
	}
	if err := m.startHold(ctx, res.sent, token, n); err != nil {
		return res, err
	}
	res.ok, res.handed = true, got == 2
	return res, nil
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

// releaseGrant gives back, at once, a grant with the given token that this
// Mutex will not keep (too few replicas, a stale nested hold, a closed
// Locker). It runs even if ctx has ended. Called with m.op held.
func (m *Mutex) releaseGrant(ctx context.Context, token int64) {
	m.unlockCall(context.WithoutCancel(ctx), "1", strconv.FormatInt(token, 10))
}

// unlockCall runs mutex_release's Unlock mode for the acquisition named by
// token, with the given hold count (as sent). Called with m.op held.
func (m *Mutex) unlockCall(ctx context.Context, holds, token string) scriptcache.Reply {
	argv := [6]string{"u", m.l.pubMode, m.set.keepMs, m.owner, holds, token}
	keys := m.releaseKeys()
	return m.l.release.Exec(ctx, keys[:], argv[:])
}

// grantedOrUnknown reports whether the reply to a lock attempt shows that
// it took the lock, or cannot tell (the connection failed).
func grantedOrUnknown(r scriptcache.Reply) bool {
	vals, err := r.ToArray()
	if err != nil {
		return !r.ServerError()
	}
	if vals.Len() != 3 {
		return false
	}
	got, _ := vals.At(0).AsInt64()
	return got >= 1
}

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
	m.err = fmt.Errorf("%w: %q: %w", ErrLost, m.Name(), inner(cause))
	if o := m.l.obs; o != nil { // before the holder is told
		o.Observe(scriptcache.Event{Kind: scriptcache.EventLost, Primitive: m.set.prim, Name: m.Name(), Hold: time.Since(epoch) - m.since, Weight: 1,
			Reason: obs.LossReason(cause), Err: m.err})
	}
	m.closeLost()
	m.endScopedLocked(m.err)
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
			m.unlockCall(ctx, "1", tokenArg)
		}
		if lostErr != nil {
			return fmt.Errorf("%w: %w", ErrNotHeld, inner(lostErr))
		}
		return fmt.Errorf("%w: %q", ErrNotHeld, m.Name())
	}
	left, err := m.unlockCall(ctx, strconv.FormatInt(holds, 10), tokenArg).AsInt64()
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

// Token returns the fencing token of the current hold, or 0 if this Mutex
// holds nothing.
func (m *Mutex) Token() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.holds == 0 {
		return 0
	}
	return m.token
}

// Holds returns how many holds this Mutex has (0: not held).
func (m *Mutex) Holds() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.holds
}

// Lost returns a channel that is closed when the current hold is lost. If
// nothing is held it returns a closed channel. A normal Unlock does not close
// it.
func (m *Mutex) Lost() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.holds == 0 {
		return closedChan
	}
	if m.lost == nil {
		m.lost = make(chan struct{})
	}
	return m.lost
}

// Err returns why the last hold was lost (wrapping ErrLost), or nil.
func (m *Mutex) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Info is what Redis says about a lock.
type Info struct {
	Held   bool          // some owner holds it
	Owner  string        // that owner's id
	Holds  int64         // that owner's hold count
	Token  int64         // fencing token of the current (or last) acquisition
	Remain time.Duration // remaining lease; 0 if not held
	Queued int64         // fair waiters in the queue (live or not yet found dead)
}

// Info reads the lock's state from Redis: whoever holds it, not only this
// Mutex.
func (m *Mutex) Info(ctx context.Context) (Info, error) {
	vals, err := m.l.info.Exec(ctx, []string{m.key(keyLock), m.key(keyQueue)}, nil).ToArray()
	if err == nil && vals.Len() != 5 {
		err = fmt.Errorf("unexpected reply of %d values", vals.Len())
	}
	if err != nil {
		return Info{}, fmt.Errorf("mutex: info %q: %w", m.Name(), inner(err))
	}
	var in Info
	in.Owner, _ = vals.At(0).ToString()
	in.Held = in.Owner != ""
	in.Holds, _ = vals.At(1).AsInt64()
	in.Token, _ = vals.At(2).AsInt64()
	pttl, _ := vals.At(3).AsInt64()
	in.Queued, _ = vals.At(4).AsInt64()
	if in.Held && pttl > 0 {
		in.Remain = time.Duration(pttl) * time.Millisecond
	}
	return in, nil
}

// ForceUnlock releases the lock whoever holds it and wakes a waiter. It
// reports whether the lock was held. The holder learns of it at its next
// renewal (or Unlock) and is told through Lost.
func (m *Mutex) ForceUnlock(ctx context.Context) (bool, error) {
	keys := m.releaseKeys()
	n, err := m.l.release.Exec(ctx, keys[:], []string{"f", m.l.pubMode, m.set.keepMs, "", "", ""}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("mutex: force unlock %q: %w", m.Name(), inner(err))
	}
	return n == 1, nil
}
