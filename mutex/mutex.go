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
// and Unlock pair on a fresh Mutex costs five allocations, on a reused one
// three (on rueidis, calls one at a time; its pipelining adds about two
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
// on: once it took the lock its release publishes (or, if the hold is
// lost, its lease having run out, the next waiter of its process tries
// then), and if it gives up instead, the next waiter of its process tries
// in its place. An Unlock
// publishes only if a Lock was refused since the lock's record was made (it
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
// lost, or it was dropped as dead) is woken and looks at once (one whose
// subscription is not confirmed yet looks at its next refresh instead);
// otherwise a waiter calls Redis itself only when woken or when the
// holder's lease would run out. A hand-off gives the lock a
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
// A lock named N is the string PREFIX{N} (its record: owner, holds, token
// and the rest packed in one value, so that an uncontended Lock and Unlock
// are a read and a write each; see lua/mutex_lock.lua), its channel
// PREFIX{N}:w, the tombstones of abandoned attempts PREFIX{N}:x and, for
// fair waiters, the queue PREFIX{N}:q and its entries PREFIX{N}:e (PREFIX
// defaults to "sluice:mutex:"); the braces keep all in one cluster slot.
// Every key expires: a free lock leaves none, apart from the released
// record for min(1 s, lease), and tombstones and queue keys for a lease
// after their last use. A key that holds something else (another type, or
// a string that is not a lock record) fails every call on that lock with
// WRONGTYPE, and a renewal batch reports it lost alone.
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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/notify"
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
	// relModes are mutex_release's ARGV[1] for an Unlock, a give-back and
	// ForceUnlock: "u", "a", "f", in upper case where it must SPUBLISH.
	relModes [3]string

	lock, nest, release *scriptcache.Script
	renew               *scriptcache.Script
	renewBatch, info    *scriptcache.Script
	queueRefresh        *scriptcache.Script
	sc                  *scriptcache.Cache

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
	l.relModes = [3]string{"u", "a", "f"}
	if sc.ShardedPubSub() {
		l.pubMode = "s"
		l.relModes = [3]string{"U", "A", "F"}
	}
	for name, dst := range map[string]**scriptcache.Script{
		"mutex_lock": &l.lock, "mutex_nest": &l.nest, "mutex_release": &l.release, "mutex_renew": &l.renew,
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
	keyLock    = iota // the lock record (a string)
	keyWake           // wake-up channel
	keyTomb           // tombstones of abandoned attempts
	keyQueue          // fair queue
	keyEntries        // the queue's entries
)

// key returns one of the lock's keys (keyLock, ...). They are substrings
// of m.ids, which holds "K:w", "K:x", "K:q", "K:e" (K the lock record) and
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

	keyLen    int32 // length of the lock record's key; not guarded (set once)
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
	keepMs   string        // how long a released record is kept, in ms
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
