package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/semaphore"
)

// Lanes are the part of the random workload that makes every lock and
// semaphore promise happen often, and under the run's faults: each lane is
// one resource of its own, contended by two goroutines of every node with
// short holds (most under 25 ms), so that a 16 s run makes hundreds of
// holds of each primitive, not a handful behind the long holders of the
// shared names. Each acquisition is recorded (a laneWait) with when it was
// called, returned and would have given up, and every hold goes through
// the history's exclusion, token and loss rules like the rest of the
// workload. What the lanes add is reach and the other side of each
// promise:
//
//   - lm, plain Mutexes: fixed leases (WithLease) and the watchdog's;
//     Extend, lengthening and shortening; holds left to expire; Valid and
//     HeldUntil against the lease (extend.go); Info;
//   - lf, fair Mutexes: FIFO (fifo.go), holds left to expire under a queue;
//   - lrw, RWMutex readers and writers: writers' marks (starvation.go),
//     downgrades, holds left to expire;
//   - lx0..lx2, MultiMutex sets of two or three and Mutexes of one member;
//   - lt: one owner id on two nodes, a takeover (owner.go);
//   - lps, lfs: a plain and a fair semaphore of capacity 3, weights 1 to 3,
//     permits of fixed-lease Managers left to expire, Holders;
//   - lrl: RWMutex holds past two of the watchdog's renewals, Info after
//     them; rwf, mf: an RWMutex and a Mutex that an operator force-unlocks
//     among their holders (forcer);
//   - lcs, lcf: a plain and a fair semaphore whose capacity an operator
//     sets (capacity.go); lwt: lt's takeovers of RWMutex write holds;
//     lqr: an RWMutex whose writers give up under waiting readers;
//   - lls, llf: a plain and a fair semaphore whose permits outlast the
//     keys' first expiry (the renewals keep them), with waiters queued
//     for over a lease; lqn0..lqn2: a quiet semaphore per node whose
//     waiters are all in that process;
//   - mortals: a client of its own that crashes (its connections closed at
//     once, nothing it sends reaches Redis after) while it holds or waits in
//     a lane, leaving its lease, queue entry or writer's mark to run out;
//
// and the poller (poll.go) reads what Redis holds for each lane, so that
// the oracles can tell when a waiter was due (anytime.go).
const (
	laneMutex = "lm"
	laneFair  = "lf"
	laneRW    = "lrw"
	laneTake  = "lt"
	// lwt: lt's takeovers of RWMutex write holds (owner.go).
	laneRWTake = "lwt"
	// lqr: an RWMutex of few contenders (two goroutines a node): readers
	// holding a quarter to half a lease, writers that give up after a
	// fraction of one (quietRWOp).
	laneQuietRW = "lqr"
	// le: a plain Mutex of few contenders (one goroutine a node, resting
	// between holds), whose holders often leave a long fixed lease
	// shortened by Extend to expire: with nobody else awake, a waiter that
	// sleeps past a release or an expiry leaves the lock free for long.
	laneQuiet = "le"
	lanePSem  = "lps"
	laneFSem  = "lfs"
	laneCap   = 3
	// lfp: a fair semaphore of capacity 2 that light holders keep full
	// while a heavy waiter heads its queue (passLane).
	lanePass    = "lfp"
	lanePassCap = 2
	// lqs: a plain semaphore of capacity 1 and few contenders (one
	// goroutine a node, resting between holds), the semaphore's le.
	laneQuietSem = "lqs"
	// lrl: an RWMutex of few contenders (one goroutine a node) whose
	// holds, on the watchdog's lease, outlast two renewals: what Redis
	// keeps of a hold after its renewals (rwLongOp).
	laneRWLong = "lrl"
	// lls, llf: a plain and a fair semaphore of capacity 1 and few
	// contenders (one goroutine a node) whose permits, on the watchdog's
	// lease, outlast the keys' first expiry (longSemOp): what the
	// renewals keep, and fair waiters queued for longer than a lease.
	laneLongSem  = "lls"
	laneLongFair = "llf"
)

// laneCapacity is the capacity of a lane's semaphore.
func laneCapacity(res string) int64 {
	switch res {
	case lanePass:
		return lanePassCap
	case laneQuietSem, laneLongSem, laneLongFair:
		return 1
	}
	if slices.Contains(laneQuietNode, res) {
		return 1
	}
	return laneCap
}

var laneMulti = []string{"lx0", "lx1", "lx2"}

// laneQuietNode (lqn0..lqn2): a plain semaphore of capacity 1 for each of
// the first three nodes, taken only by three goroutines of that node
// (quietNodeSemOp). A release wakes as many of a process's waiters as it
// freed permits: the others sleep until a later release, which publishes
// only if the grant before it (a waiter's, after its wait) marked the
// semaphore as waited on (':w', semaphore_acquire). With all waiters in
// one process, no refusal of another process's waiter marks it for them:
// a grant that did not would leave them asleep while the permit is free
// (liveness).
var laneQuietNode = []string{"lqn0", "lqn1", "lqn2"}

// A laneWait is one acquisition of a lane: what it was, when it was called
// and returned, and the hold it got.
type laneWait struct {
	prim     string   // "mutex", "fair", "read", "write", "multi", "permit", "fairpermit"
	res      string   // the resource (a MultiMutex: its first name)
	names    []string // a MultiMutex's names
	owner    string   // owner id; a permit's label
	node     int      // -1 for a mortal
	weight   int64
	try      bool
	call     time.Time
	ret      time.Time
	deadline time.Time // when its context was to end
	// cut: the waiter's client crashed then (a mortal); nothing it sent
	// later reached Redis. Zero if it did not.
	cut   time.Time
	x     *hold // the hold it got (a MultiMutex: its first member), or nil
	err   error
	lease time.Duration // a fixed lease, or 0 for the watchdog's
}

// end is when the wait ended: the grant's return, or the give-up.
func (wt *laneWait) end() time.Time {
	if wt.x != nil {
		return wt.x.start
	}
	return wt.ret
}

// laneState is what the lanes record for the oracles.
type laneState struct {
	poll    *poller
	replica *redistest.Server // the single server's replica (replicas.go)
	mu      sync.Mutex
	// waits by owner (one acquisition per owner id, but for a takeover,
	// whose two acquisitions share one: the later is kept)
	waits    []*laneWait
	byOwner  map[string]*laneWait
	valids   []validity
	expiries []expiry
	suspects []suspect
	retried  []func() // releaseLane's checks of retried releases
	later    []func() // checks decided after the run, before the suspects (later)
	// markers: write acquisitions that are no lane waits (a takeover's
	// Lock that failed) but may have set a writer's mark (markSpans)
	markers []*laneWait
}

func (ls *laneState) add(wt *laneWait) {
	ls.mu.Lock()
	ls.waits = append(ls.waits, wt)
	ls.byOwner[wt.owner] = wt
	ls.mu.Unlock()
}

// laneNode is what a node has for the lanes besides what the rest of the
// workload uses: Managers with a fixed lease, whose permits a holder can
// leave to expire.
type laneNode struct {
	fixedSems     *semaphore.Manager
	fixedFairSems *semaphore.Manager
	// ReplicaAcks (replicas.go): 1, with a replica there to confirm
	// (nil on a cluster, which has none); and more than there are.
	replLocks  *mutex.Locker
	replSems   *semaphore.Manager
	unsatLocks [2]*mutex.Locker // a short ReplicaTimeout, one past Close's bound
	unsatSems  [2]*semaphore.Manager
	closedAt   atomic.Pointer[time.Time] // when the node's Close began
}

// laneResources lists the lanes' resources and how the poller reads them.
func laneResources() map[string]pollKind {
	r := map[string]pollKind{laneMutex: pollMutex, laneFair: pollMutex, laneRW: pollRW, laneTake: pollMutex, laneRWTake: pollRW, laneQuietRW: pollRW, laneQuiet: pollMutex,
		lanePSem: pollSem, laneFSem: pollSem, lanePass: pollSem, laneQuietSem: pollSem,
		laneLongSem: pollSem, laneLongFair: pollSem}
	for _, n := range laneMulti {
		r[n] = pollMutex
	}
	for _, n := range laneQuietNode {
		r[n] = pollSem
	}
	// The forced lanes too: a ForceUnlock "wakes the waiters", so their
	// waiters are due once it returns, like any release's (judgeRun).
	r["mf"], r["rwf"] = pollMutex, pollRW
	return r
}

// startLanes starts the poller and the lanes' goroutines of every node,
// each with a seed drawn from rng in order. The poller runs until pollCtx
// ends, the lanes until ctx does.
func (w *world) startLanes(ctx, pollCtx context.Context, wg, pollWG *sync.WaitGroup, rng *rand.Rand) error {
	pl, err := w.newPoller()
	if err != nil {
		return err
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range laneResources() {
			if !yield(n) {
				return
			}
		}
	})
	for _, n := range names {
		pl.add(n, laneResources()[n])
	}
	w.ln.poll = pl
	w.hist.mu.Lock()
	w.hist.capacity[lanePSem] = laneCap
	w.hist.capacity[laneFSem] = laneCap
	w.hist.capacity[lanePass] = lanePassCap
	w.hist.capacity[laneQuietSem] = 1
	w.hist.capacity[laneLongSem] = 1
	w.hist.capacity[laneLongFair] = 1
	for _, res := range laneQuietNode {
		w.hist.capacity[res] = 1
	}
	w.hist.capacity[laneReplSem] = 2
	w.hist.capacity[laneCapSem] = laneCapMade
	w.hist.capacity[laneCapFair] = laneCapMade
	w.hist.mu.Unlock()
	pollWG.Go(func() {
		defer pl.client.Close()
		pl.run(pollCtx)
	})
	type lane struct {
		tag  string
		per  int
		op   func(context.Context, *node, *rand.Rand, string)
		wait time.Duration // pause between operations, at most
	}
	lanes := []lane{
		{laneMutex, 2, w.mutexLaneOp, 20 * time.Millisecond},
		{laneFair, 3, w.fairLaneOp, 20 * time.Millisecond},
		{laneRW, 4, w.rwLaneOp, 20 * time.Millisecond},
		{"lx", 2, w.multiLaneOp, 20 * time.Millisecond},
		{lanePSem, 2, w.semLaneOp, 10 * time.Millisecond},
		{laneFSem, 4, w.fairSemLaneOp, 10 * time.Millisecond},
		{laneTake, 1, w.takeContender, 60 * time.Millisecond},
		{laneQuiet, 1, w.quietLaneOp, 300 * time.Millisecond},
		{lanePass, 2, w.passLight, 0},
		{laneQuietSem, 1, w.quietSemOp, 300 * time.Millisecond},
	}
	run := func(n *node, l lane, j int, seed uint64) {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(n.i)))
			// A ramp, not a herd: a few dozen goroutines
			// starting at once, each opening connections, would
			// slow the first calls of the whole workload.
			sleep(ctx, time.Duration(r.Float64()*float64(w.cfg.Lease)/4))
			seq := 0
			for ctx.Err() == nil && !n.closed.Load() {
				seq++
				l.op(ctx, n, r, fmt.Sprintf("n%d%s%d.%d", n.i, l.tag, j, seq))
				sleep(ctx, time.Duration(r.Float64()*float64(l.wait)))
			}
		})
	}
	for _, n := range w.nodes {
		for _, l := range lanes {
			for j := range l.per {
				run(n, l, j, rng.Uint64())
			}
		}
		seed := rng.Uint64()
		wg.Go(func() { w.mortals(ctx, n, rand.New(rand.NewPCG(seed, 0xdead))) })
		w.replicaLanes(ctx, n, rng.Uint64(), wg.Go)
		gseed := rng.Uint64()
		wg.Go(func() { w.giveBacks(ctx, n, rand.New(rand.NewPCG(gseed, 0x9b))) })
	}
	seed, aclSeed, faultSeed := rng.Uint64(), rng.Uint64(), rng.Uint64()
	wg.Go(func() { w.dropReplies(ctx, rand.New(rand.NewPCG(faultSeed, 0xd09))) })
	wg.Go(func() { w.takeovers(ctx, rand.New(rand.NewPCG(seed, 0x7a6e))) })
	wg.Go(func() { w.aclLane(ctx, rand.New(rand.NewPCG(aclSeed, 0xac1))) })
	passSeed := rng.Uint64()
	wg.Go(func() { w.passHeavy(ctx, rand.New(rand.NewPCG(passSeed, 0x16))) })
	forceSeed := rng.Uint64()
	wg.Go(func() { w.forcer(ctx, rand.New(rand.NewPCG(forceSeed, 0xf0))) })
	// Lanes added later draw their seeds last, so that the others'
	// streams stay those of a seed before them.
	later := []lane{
		{laneRWLong, 1, w.rwLongOp, 300 * time.Millisecond},
		{"lfo", 2, w.forcedLaneOp, 20 * time.Millisecond},
	}
	for _, n := range w.nodes {
		for _, l := range later {
			for j := range l.per {
				run(n, l, j, rng.Uint64())
			}
		}
	}
	// The capacity lanes (capacity.go), after all of them.
	for _, n := range w.nodes {
		for _, l := range []lane{{laneCapSem, 2, w.capLaneOp, 20 * time.Millisecond}, {laneCapFair, 2, w.capFairLaneOp, 20 * time.Millisecond}} {
			for j := range l.per {
				run(n, l, j, rng.Uint64())
			}
		}
	}
	for _, n := range w.nodes {
		run(n, lane{laneRWTake, 1, w.rwTakeContender, 60 * time.Millisecond}, 0, rng.Uint64())
	}
	for _, n := range w.nodes {
		for j := range 2 {
			run(n, lane{laneQuietRW, 2, w.quietRWOp, 100 * time.Millisecond}, j, rng.Uint64())
		}
	}
	for i := range 2 {
		rwTakeSeed := rng.Uint64()
		wg.Go(func() { w.rwTakeovers(ctx, rand.New(rand.NewPCG(rwTakeSeed, 0x7a6f)), strconv.Itoa(i)) })
	}
	capSeed := rng.Uint64()
	wg.Go(func() { w.capacitySetter(ctx, rand.New(rand.NewPCG(capSeed, 0xca9))) })
	// The private semaphores' exact model (privsem.go).
	for _, n := range w.nodes {
		psSeed := rng.Uint64()
		wg.Go(func() { w.privateSems(ctx, n, rand.New(rand.NewPCG(psSeed, 0x5e))) })
	}
	// The read-write give-backs with a waiter (rwgiveback.go), after them.
	for _, n := range w.nodes {
		gwSeed := rng.Uint64()
		wg.Go(func() { w.rwGiveBacks(ctx, n, rand.New(rand.NewPCG(gwSeed, 0x9c))) })
	}
	// Give-backs with a waiter of the other primitives, after them.
	for _, n := range w.nodes {
		gbSeed := rng.Uint64()
		wg.Go(func() { w.giveBacksWaited(ctx, n, rand.New(rand.NewPCG(gbSeed, 0x9d))) })
	}
	// The long-held semaphores and the node-local quiet ones, after them,
	// starting once the ramp above is over (a quarter to three eighths of
	// a lease in, on top of run's own ramp): the first calls of the run
	// are the busiest, and these lanes need not add to them.
	late := func(op func(context.Context, *node, *rand.Rand, string)) func(context.Context, *node, *rand.Rand, string) {
		return func(ctx context.Context, n *node, r *rand.Rand, id string) {
			if strings.HasSuffix(id, ".1") {
				sleep(ctx, time.Duration((0.25+0.125*r.Float64())*float64(w.cfg.Lease)))
			}
			op(ctx, n, r, id)
		}
	}
	for _, n := range w.nodes {
		for _, l := range []lane{{laneLongSem, 1, late(w.longSemOp), 300 * time.Millisecond}, {laneLongFair, 1, late(w.longSemOp), 300 * time.Millisecond}} {
			run(n, l, 0, rng.Uint64())
		}
	}
	for _, n := range w.nodes {
		if n.i >= len(laneQuietNode) {
			break
		}
		for j := range 3 {
			run(n, lane{"lqn", 3, late(w.quietNodeSemOp), 300 * time.Millisecond}, j, rng.Uint64())
		}
	}
	return nil
}

// quietNodeSemOp takes node n's own quiet semaphore (laneQuietNode), holds
// it a quarter to half a lease and rests half a lease to a lease: while
// one holds, the node's two others wait, and after a release often nobody
// but a sleeping waiter is left to take it.
func (w *world) quietNodeSemOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	w.semHoldLane(ctx, n, n.sems, laneQuietNode[n.i], "permit", id, 1, w.quietHold(rng))
	sleep(ctx, time.Duration((0.5+0.5*rng.Float64())*float64(w.cfg.Lease)))
}

// dropReplies drops one node's replies for a fifth to a half of a lease,
// every one to two leases of the storm (on a single server: a cluster has
// no fault proxies), so that releases whose first try reached Redis are
// retried (releaseLane's check) often, not once a run. The rest of the
// workload meets these faults as it meets the schedule's.
func (w *world) dropReplies(ctx context.Context, rng *rand.Rand) {
	if w.cl != nil {
		return
	}
	storm := w.hist.epoch.Add(time.Duration(stormEnd * float64(w.cfg.Duration)))
	for {
		sleep(ctx, time.Duration((1+rng.Float64())*float64(w.cfg.Lease)))
		n := w.nodes[rng.IntN(len(w.nodes))]
		d := time.Duration((0.2 + 0.3*rng.Float64()) * float64(w.cfg.Lease))
		if ctx.Err() != nil || time.Now().Add(d).After(storm) {
			return
		}
		if n.closed.Load() {
			continue
		}
		from := time.Now()
		w.hist.fault(from, from.Add(d+w.cfg.Lease), "dropreplies", "", n.i)
		n.proxy.DropReplies(true)
		sleep(ctx, d)
		n.proxy.DropReplies(false)
		w.hist.fault(from, time.Now().Add(w.cfg.Lease), "dropreplies", "", n.i)
		w.count("lane.dropreplies")
	}
}

// laneTimeout is how long a lane's acquisition may wait: mostly one to
// three leases (long enough to wait out an expiry), now and then a short
// one, which gives up in the queue, and now and then a few milliseconds,
// which ends while the first attempt is on its way: an abandoned attempt,
// given back whether or not Redis granted it.
func (w *world) laneTimeout(rng *rand.Rand) time.Duration {
	switch k := rng.IntN(20); {
	case k < 13:
		return time.Duration((1 + 2*rng.Float64()) * float64(w.cfg.Lease))
	case k < 18:
		return time.Duration((0.05 + 0.45*rng.Float64()) * float64(w.cfg.Lease))
	}
	return time.Duration((0.5 + 4.5*rng.Float64()) * float64(time.Millisecond))
}

// laneHold is how long a lane's holder keeps what it got: mostly under
// 25 ms, now and then up to a fifth of a lease, rarely past a renewal.
func (w *world) laneHold(rng *rand.Rand) time.Duration {
	switch k := rng.IntN(100); {
	case k < 88:
		return time.Duration(rng.Float64() * 25 * float64(time.Millisecond))
	case k < 99 || rng.IntN(2) == 0:
		return time.Duration((0.05 + 0.15*rng.Float64()) * float64(w.cfg.Lease))
	default:
		return time.Duration((0.4 + 0.4*rng.Float64()) * float64(w.cfg.Lease))
	}
}

// fixedLease draws a fixed lease for a lane's hold: half a lease to one
// and a half.
func (w *world) fixedLease(rng *rand.Rand) time.Duration {
	return time.Duration((0.5 + rng.Float64()) * float64(w.cfg.Lease))
}

// A lanePlan is how a lane's hold is leased and how it ends.
type lanePlan struct {
	fixed   time.Duration // a fixed lease (WithLease), or 0 for the watchdog's
	abandon bool          // left to expire instead of released
	shorten bool          // abandon after an Extend that shortens the lease
}

// lanePlan draws a hold's plan: left to expire with probability expire
// (per mille), with a short fixed lease or (if canShorten, half of those)
// a long one that Extend shortens first; else the watchdog's lease or a
// fixed one of one to three seconds, released as usual. An expiry keeps
// the lane's other waiters out until the lease ends (and on a fair lane
// until the next refresh of the queue's head), so those leases are short
// and the expiries few where they cost most.
func (w *world) lanePlan(rng *rand.Rand, expire int, canShorten bool) lanePlan {
	switch {
	case rng.IntN(1000) < expire:
		if canShorten && rng.IntN(2) == 0 {
			return lanePlan{fixed: w.fixedLease(rng), abandon: true, shorten: true}
		}
		return lanePlan{fixed: w.shortLease(rng), abandon: true}
	case rng.IntN(2) == 0:
		return lanePlan{}
	}
	return lanePlan{fixed: w.fixedLease(rng)}
}

// shortLease is a fixed lease for a hold left to expire: a twentieth to a
// fifth of the watchdog's.
func (w *world) shortLease(rng *rand.Rand) time.Duration {
	return time.Duration((0.05 + 0.15*rng.Float64()) * float64(w.cfg.Lease))
}

// opts are the LockOptions of a lane's plan for owner id.
func (p lanePlan) opts(id string) []mutex.LockOption {
	opts := []mutex.LockOption{mutex.WithOwner(id)}
	if p.fixed > 0 {
		opts = append(opts, mutex.WithLease(p.fixed))
	}
	return opts
}

// margin is the loss margin the README states: a tenth of the lease, at
// least 5 ms, at most 1 s.
func margin(lease time.Duration) time.Duration {
	return min(max(lease/10, 5*time.Millisecond), time.Second)
}

// acquireLane runs acquire with the lane's timeout and records the call.
func (w *world) acquireLane(ctx context.Context, wt *laneWait, timeout time.Duration, acquire func(context.Context) error) error {
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	wt.deadline, _ = actx.Deadline()
	wt.call = time.Now()
	wt.err = acquire(actx)
	wt.ret = time.Now()
	return wt.err
}

// A laneLock is what the lanes need of a lock: a Mutex, a MultiMutex, or
// one side of an RWMutex.
type laneLock struct {
	lock, try, unlock func(context.Context) error
	lost              func() <-chan struct{}
	err               func() error
	heldUntil         func() time.Time
	valid             func() bool
}

func mutexLock(m *mutex.Mutex) laneLock {
	return laneLock{m.Lock, m.TryLock, m.Unlock, m.Lost, m.Err, m.HeldUntil, m.Valid}
}

func multiLock(mm *mutex.MultiMutex) laneLock {
	return laneLock{mm.Lock, mm.TryLock, mm.Unlock, mm.Lost, mm.Err, mm.HeldUntil, mm.Valid}
}

func rwLock(rw *mutex.RWMutex, write bool) laneLock {
	if write {
		return laneLock{rw.Lock, rw.TryLock, rw.Unlock, rw.Lost, rw.Err, rw.HeldUntil, rw.Valid}
	}
	return laneLock{rw.RLock, rw.TryRLock, rw.RUnlock, rw.Lost, rw.Err, rw.HeldUntil, rw.Valid}
}

// lockLane acquires l for wt (TryLock if wt.try) and, if it got it,
// records its holds (one per name) and returns them.
func (w *world) lockLane(ctx context.Context, n *node, rng *rand.Rand, wt *laneWait, l laneLock, kind, note string, tokens func() []int64) []*hold {
	acquire := l.lock
	if wt.try {
		acquire = l.try
	}
	w.count("lane." + wt.prim)
	valid := false
	err := w.acquireLane(ctx, wt, w.laneTimeout(rng), func(actx context.Context) error {
		err := acquire(actx)
		valid = err == nil && l.valid() // see hold.valid
		return err
	})
	if err != nil {
		w.expected(wt.prim+" lane acquisition", wt.call, err, mutexErrs...)
		w.ln.add(wt)
		return nil
	}
	names := wt.names
	if names == nil {
		names = []string{wt.res}
	}
	var set []string
	if len(names) > 1 {
		set = names
	}
	var xs []*hold
	toks := tokens()
	for i, name := range names {
		x := &hold{kind: kind, res: name, set: set, owner: wt.owner, node: wt.node, weight: 1, token: toks[i], note: note,
			call: wt.call, start: wt.ret, valid: valid, lostCh: l.lost(), try: wt.try, lease: wt.lease}
		w.hist.begin(x)
		xs = append(xs, x)
	}
	wt.x = xs[0]
	w.ln.add(wt)
	return xs
}

// releaseLane releases the holds xs with unlock, as release does, and
// retries a release that failed otherwise than ErrNotHeld. A retried final
// Unlock whose first try released the lock must be told so (nil), however
// many hand-offs followed, while the lock's hash lives (a second after the
// last release): when the node's only fault was replies dropped (so the
// first try reached Redis), a hold not known lost that a retry calls not
// held is a violation.
func (w *world) releaseLane(n *node, xs []*hold, l laneLock, lockRetry bool) {
	knew := l.err() != nil
	at := time.Now()
	for _, x := range xs {
		w.hist.releasing(x, at)
	}
	rctx, cancel := w.releaseCtx()
	err := l.unlock(rctx)
	cancel()
	if err != nil && !knew {
		ret := time.Now()
		w.hist.mu.Lock()
		for _, x := range xs {
			if x.expect == "" && x.pastFixedLease(ret) {
				x.expect = "released after its fixed lease may have ended"
			}
		}
		w.hist.mu.Unlock()
	}
	if !n.closed.Load() {
		w.expected(xs[0].kind+" lane release", at, err, mutexErrs...)
	}
	how := "Unlock: " + fmt.Sprint(err)
	if knew {
		how = "Err set before Unlock"
	}
	for _, x := range xs {
		w.hist.end(x, knew || err != nil, how)
	}
	for range 8 {
		if err == nil || errors.Is(err, mutex.ErrNotHeld) || n.closed.Load() {
			return
		}
		time.Sleep(w.cfg.Lease / 8)
		w.count("release.retry")
		rctx, cancel := w.releaseCtx()
		call := time.Now()
		lostBefore := closed(l.lost())
		err = l.unlock(rctx)
		cancel()
		ret := time.Now()
		w.expected(xs[0].kind+" lane release (retried)", call, err, mutexErrs...)
		// The released record lives a second after the first try reached
		// Redis (no earlier than at), and the retry reached it no later
		// than it returned: only a retry back within that second must
		// find the record. Its call time says nothing of when it arrived
		// (a latency fault held one 2.7 s on the way: seed
		// 1796028020577722574).
		if lockRetry && !knew && !lostBefore && errors.Is(err, mutex.ErrNotHeld) && ret.Sub(at) < time.Second*9/10 {
			// Decided after the run, when every fault's span is known.
			w.ln.mu.Lock()
			w.ln.retried = append(w.ln.retried, func() {
				if w.hist.onlyRepliesDropped(n.i, at, ret) && w.onlyHandOffs(xs, at, ret) {
					w.hist.violation("retried release: the final release of %s hold #%d of %q (node %d) at %s failed (%s), its node's only fault dropping replies, so it reached Redis and released; its retry at %s, %v later, was told %v",
						xs[0].kind, xs[0].id, xs[0].res, n.i, w.hist.since(at), how, w.hist.since(call), call.Sub(at).Round(time.Millisecond), err)
				}
			})
			w.ln.mu.Unlock()
		}
	}
}

// onlyHandOffs reports whether every hold of xs's resources granted
// between from and to (after the first try of their release) ended by a
// release that returned nil, and no acquisition of them failed then (an
// abandoned attempt's grant, given back, ends otherwise). The README's
// promise to a retried Unlock holds "however many hand-offs followed"; a
// hold that ended otherwise (a give-back, a takeover, an expiry) starts a
// new run of the lock's tokens, and the retry may then be told the hold
// was lost.
func (w *world) onlyHandOffs(xs []*hold, from, to time.Time) bool {
	_, waits := w.laneWaits()
	h := w.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, x := range xs {
		for _, o := range h.done {
			if o.res == x.res && o != x && o.start.After(from) && o.call.Before(to) && (o.told || o.owed || o.expect != "") {
				return false
			}
		}
		for _, wt := range waits {
			if wt.x == nil && slices.Contains(wt.resources(), x.res) && wt.call.Before(to) && wt.ret.After(from) {
				return false
			}
		}
	}
	return true
}

// onlyRepliesDropped reports whether node's replies were being dropped at
// some time in [from, to], and no other fault that could touch node's
// calls (of its network but latency, or of the server) was in force in
// [from-lease/2, to], each counted without the lease a span carries after
// its end: the requests node sent then all reached Redis, in order.
func (h *history) onlyRepliesDropped(node int, from, to time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	some := false
	for _, f := range h.faults {
		if f.res != "" || f.node >= 0 && f.node != node {
			continue
		}
		end := f.to.Add(-h.lease)
		switch {
		case f.from.After(to) || end.Before(from.Add(-h.lease/2)):
		case f.what == "dropreplies" && f.node == node:
			some = some || !end.Before(from)
		case f.what == "latency" && f.node == node:
		default:
			return false
		}
	}
	return some
}

// holdLane keeps a lane's holds for d (for a fixed lease, at most half of
// what is left of it), observing Valid and HeldUntil now and then
// (extend.go), with during (if not nil) called at a random point now and
// then; during may change the lease (Extend).
func (w *world) holdLane(ctx context.Context, rng *rand.Rand, xs []*hold, l laneLock, lse *leaseOf, d time.Duration, during func()) {
	clip := func() {
		if lse.fixed > 0 {
			d = min(d, lse.left()/2)
		}
	}
	clip()
	w.observeValid(xs, l, *lse)
	if during != nil && rng.IntN(3) == 0 {
		first := time.Duration(rng.Float64() * float64(d))
		sleep(ctx, first)
		during()
		w.observeValid(xs, l, *lse)
		d -= first
		clip()
	}
	sleep(ctx, d)
	w.observeValid(xs, l, *lse)
	if lse.fixed > 0 && !lse.unknown {
		w.hist.mu.Lock()
		for _, x := range xs {
			x.leaseEarliestEnd = lse.from.Add(lse.fixed)
		}
		w.hist.mu.Unlock()
	}
	if lse.fixed > 0 && closed(l.lost()) && !lse.from.Add(lse.fixed-margin(lse.fixed)-stallSlack).After(time.Now()) {
		// Held past the fixed lease: the process stalled in the sleep.
		// The loss is the lease's own.
		w.hist.mu.Lock()
		for _, x := range xs {
			x.expect = "held past its fixed lease"
		}
		w.hist.mu.Unlock()
	}
}

// abandonLane leaves a fixed-lease hold to expire, as a holder that went
// away would: no release. Its holds last until the loss signal closes
// (the client's own timer at the lease's end, less the margin); the
// server lets the next waiter in once the lease ends, and must by then
// (checkLeaseEnds). The loss is the workload's own (expect).
func (w *world) abandonLane(xs []*hold, l laneLock, lse leaseOf) {
	w.count("lane.abandon")
	bound := lse.left() + w.cfg.Lease
	select {
	case <-l.lost():
	case <-time.After(bound):
		w.hist.violation("a %s hold #%d of %q left to expire: its loss signal had not closed %v later (HeldUntil %s)",
			xs[0].kind, xs[0].id, xs[0].res, bound, w.hist.since(l.heldUntil()))
	}
	at := time.Now()
	w.hist.mu.Lock()
	for _, x := range xs {
		x.expect = "left to expire"
	}
	w.hist.mu.Unlock()
	for _, x := range xs {
		w.hist.releasing(x, at)
		w.hist.end(x, true, "left to expire: "+fmt.Sprint(l.err()))
	}
	if xs[0].kind != "permit" && xs[0].kind != "read" {
		w.ln.mu.Lock()
		w.ln.expiries = append(w.ln.expiries, expiry{xs, lse.end()})
		w.ln.mu.Unlock()
	}
}

func (w *world) mutexLaneOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	w.mutexLane(ctx, n, rng, id, laneMutex, 120)
}

// quietLaneOp takes the quiet lane's lock, half of the time to leave it
// to expire (half of those after Extend shortened a lease of 3 to 6 s,
// held a quarter to half a lease first).
func (w *world) quietLaneOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	w.mutexLane(ctx, n, rng, id, laneQuiet, 500)
}

// takeContender contends for the takeover lane's lock (owner.go) with
// owner ids of its own.
func (w *world) takeContender(ctx context.Context, n *node, rng *rand.Rand, id string) {
	w.mutexLane(ctx, n, rng, id, laneTake, 120)
}

// mutexLane takes the plain Mutex res, with a fixed lease half of the
// time, and holds it: Extend, Valid, Info; then releases it or leaves it
// to expire.
func (w *world) mutexLane(ctx context.Context, n *node, rng *rand.Rand, id, res string, expire int) {
	plan := w.lanePlan(rng, expire, true)
	if plan.shorten && res == laneQuiet {
		// A long lease (3 to 6 s) for the waiters to sleep on: a
		// shorter one that wakes nobody then leaves them asleep for
		// seconds after the lock is free, not for a few hundred ms.
		plan.fixed = time.Duration((1.5 + 1.5*rng.Float64()) * float64(w.cfg.Lease))
	}
	fixed := plan.fixed
	m, err := n.locks.NewMutex(res, plan.opts(id)...)
	if err != nil {
		w.hist.violation("NewMutex: %v", err)
		return
	}
	wt := &laneWait{prim: "mutex", res: res, owner: id, node: n.i, weight: 1, try: rng.IntN(5) == 0, lease: fixed}
	l := mutexLock(m)
	xs := w.lockLane(ctx, n, rng, wt, l, "mutex", "plain lane", func() []int64 { return []int64{m.Token()} })
	if xs == nil {
		w.extendNotHeld(m)
		return
	}
	lse := leaseOf{fixed: fixed, from: wt.call, upto: wt.ret, watchdog: w.cfg.Lease}
	w.infoHeld(ctx, m, xs[0], lse)
	if plan.shorten {
		// Waiters saw the long lease; it now ends sooner, with no
		// release: they must be served when it does. On the quiet lane
		// the long lease is kept a quarter to half a lease first, so
		// that the other nodes' holders, back from their rest, are
		// refused under it and sleep on it (issue 31 item 2: with holds
		// of milliseconds, no waiter saw the long lease, and an Extend
		// that woke nobody went unseen: 0 of 3 seeds).
		d := w.laneHold(rng) / 2
		if res == laneQuiet {
			d = time.Duration((0.25 + 0.25*rng.Float64()) * float64(w.cfg.Lease))
		}
		w.holdLane(ctx, rng, xs, l, &lse, d, nil)
		lse = w.extendLane(ctx, w.shortLease(rng), m, xs[0], lse)
		w.abandonLane(xs, l, lse)
		if res == laneQuiet {
			// The others, refused under the long lease, all wait now:
			// this holder, back from a short rest, would take the
			// free lock and hide a waiter that sleeps on.
			sleep(ctx, w.cfg.Lease)
		}
		return
	}
	d := w.laneHold(rng)
	long := res == laneQuiet && rng.IntN(2) == 0
	if long {
		d = w.quietHold(rng)
	}
	if res == laneMutex && !plan.abandon && rng.IntN(3) == 0 {
		w.nestLock(ctx, m, xs[0], lse)
	}
	w.holdLane(ctx, rng, xs, l, &lse, d, func() {
		if fixed == 0 {
			w.extendWatchdog(m)
			return
		}
		lse = w.extendLane(ctx, time.Duration((0.1+1.4*rng.Float64())*float64(w.cfg.Lease)), m, xs[0], lse)
	})
	if plan.abandon {
		w.abandonLane(xs, l, lse)
		return
	}
	w.releaseLane(n, xs, l, true)
	w.infoReleased(ctx, m, xs[0])
	if long {
		sleep(ctx, w.cfg.Lease) // see quietHold
	}
}

// quietHold is a hold of a quiet lane (le, lqs) long enough, a quarter
// to half a lease, for the other nodes' holders, back from their rest, to
// be refused and wait; the holder then rests a lease after it releases.
// A release that wakes nobody (issue 31's class: a waiter sleeping past a
// release) then leaves the lock or permit free with every other holder
// asleep, which the liveness check sees; with holds of milliseconds and
// holders back within 300 ms, another holder took it first.
func (w *world) quietHold(rng *rand.Rand) time.Duration {
	return time.Duration((0.25 + 0.25*rng.Float64()) * float64(w.cfg.Lease))
}

func (w *world) fairLaneOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	plan := w.lanePlan(rng, 25, false)
	fixed := plan.fixed
	m, err := n.fair.NewMutex(laneFair, plan.opts(id)...)
	if err != nil {
		w.hist.violation("NewMutex: %v", err)
		return
	}
	wt := &laneWait{prim: "fair", res: laneFair, owner: id, node: n.i, weight: 1, try: rng.IntN(3) == 0, lease: fixed}
	l := mutexLock(m)
	xs := w.lockLane(ctx, n, rng, wt, l, "mutex", "fair lane", func() []int64 { return []int64{m.Token()} })
	if xs == nil {
		return
	}
	lse := leaseOf{fixed: fixed, from: wt.call, upto: wt.ret, watchdog: w.cfg.Lease}
	w.infoHeld(ctx, m, xs[0], lse)
	w.holdLane(ctx, rng, xs, l, &lse, w.laneHold(rng), nil)
	if plan.abandon {
		w.abandonLane(xs, l, lse)
		return
	}
	w.releaseLane(n, xs, l, true)
	w.infoReleased(ctx, m, xs[0])
}

func (w *world) rwLaneOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	plan := w.lanePlan(rng, 50, false)
	fixed := plan.fixed
	rw, err := n.locks.NewRWMutex(laneRW, plan.opts(id)...)
	if err != nil {
		w.hist.violation("NewRWMutex: %v", err)
		return
	}
	write := rng.IntN(20) < 7
	prim, kind := "read", "read"
	if write {
		prim, kind = "write", "write"
	}
	wt := &laneWait{prim: prim, res: laneRW, owner: id, node: n.i, weight: 1, try: rng.IntN(6) == 0, lease: fixed}
	l := rwLock(rw, write)
	xs := w.lockLane(ctx, n, rng, wt, l, kind, "lane", func() []int64 { return []int64{rw.Token()} })
	if xs == nil {
		return
	}
	lse := leaseOf{fixed: fixed, from: wt.call, upto: wt.ret, watchdog: w.cfg.Lease}
	w.rwInfoHeld(ctx, rw, xs[0], lse)
	d := w.laneHold(rng)
	if !write {
		// Readers stay a little longer, so that they overlap and a
		// writer finds them there and marks its wait.
		d += time.Duration(rng.Float64() * float64(w.cfg.Lease) / 20)
	}
	if write && rng.IntN(4) == 0 {
		// Downgrade: a read hold taken while writing goes through the
		// marks of waiting writers, and outlives the write hold.
		w.holdLane(ctx, rng, xs, l, &lse, d/2, nil)
		w.downgrade(ctx, n, rng, rw, xs[0], lse)
		return
	}
	if write && rng.IntN(4) == 0 {
		w.nestWrite(ctx, rw, xs[0], lse)
	}
	if !write && !plan.abandon && rng.IntN(2) == 0 {
		w.nestRead(ctx, rw, xs[0], lse)
	}
	w.holdLane(ctx, rng, xs, l, &lse, d, nil)
	if plan.abandon {
		w.abandonLane(xs, l, lse)
		return
	}
	w.releaseLane(n, xs, l, true)
}

// rwLongOp takes the lane lrl's RWMutex, for writing half of the time,
// on the watchdog's lease, holds it for 0.7 to 1.2 leases (past two of
// the watchdog's renewals, a third of a lease apart) and checks Info
// before releasing: the renewals keep the hold as it was granted (its
// owner, token and readers), with a lease left of at most a lease. The
// lane's few holders keep the other lanes' pace.
func (w *world) rwLongOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	rw, err := n.locks.NewRWMutex(laneRWLong, mutex.WithOwner(id))
	if err != nil {
		w.hist.violation("NewRWMutex: %v", err)
		return
	}
	write := rng.IntN(2) == 0
	prim, kind := "read", "read"
	if write {
		prim, kind = "write", "write"
	}
	wt := &laneWait{prim: prim, res: laneRWLong, owner: id, node: n.i, weight: 1}
	l := rwLock(rw, write)
	xs := w.lockLane(ctx, n, rng, wt, l, kind, "long lane", func() []int64 { return []int64{rw.Token()} })
	if xs == nil {
		return
	}
	lse := leaseOf{from: wt.call, upto: wt.ret, watchdog: w.cfg.Lease}
	w.holdLane(ctx, rng, xs, l, &lse, time.Duration((0.7+0.5*rng.Float64())*float64(w.cfg.Lease)), nil)
	w.rwInfo(ctx, rw, xs[0], lse)
	w.releaseLane(n, xs, l, true)
}

// The forced lanes: an RWMutex (rwf) and a Mutex (mf) whose holders an
// operator's ForceUnlock removes now and then (forcer), as the operator
// faults do to the shared names, which see few holds: "the holders learn
// of it at their next renewal (or release) and are told through Lost".
// The history owes every hold in progress at a ForceUnlock a loss by its
// end: an Unlock that returns nil for a hold the operator removed is a
// violation, and so is a hold not told within the watchdog's reach.
var forcedLanes = []string{"rwf", "mf"}

// forcedLaneOp takes one of the forced lanes (rwf for reading or writing,
// or mf) on the watchdog's lease (half of mf's holds on a fixed lease
// instead, Extended before the release: extendForced), holds it for 20 to
// 200 ms and releases it.
func (w *world) forcedLaneOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	res := forcedLanes[rng.IntN(len(forcedLanes))]
	var l laneLock
	var prim, kind string
	var token func() int64
	var m *mutex.Mutex
	var fixed time.Duration
	if res == "mf" {
		opts := []mutex.LockOption{mutex.WithOwner(id)}
		if rng.IntN(2) == 0 {
			fixed = w.fixedLease(rng)
			opts = append(opts, mutex.WithLease(fixed))
		}
		var err error
		if m, err = n.locks.NewMutex(res, opts...); err != nil {
			w.hist.violation("NewMutex: %v", err)
			return
		}
		l, prim, kind, token = mutexLock(m), "mutex", "mutex", m.Token
	} else {
		rw, err := n.locks.NewRWMutex(res, mutex.WithOwner(id))
		if err != nil {
			w.hist.violation("NewRWMutex: %v", err)
			return
		}
		write := rng.IntN(2) == 0
		prim, kind = "read", "read"
		if write {
			prim, kind = "write", "write"
		}
		l, token = rwLock(rw, write), rw.Token
	}
	wt := &laneWait{prim: prim, res: res, owner: id, node: n.i, weight: 1, lease: fixed}
	xs := w.lockLane(ctx, n, rng, wt, l, kind, "forced lane", func() []int64 { return []int64{token()} })
	if xs == nil {
		return
	}
	sleep(ctx, time.Duration((0.02+0.18*rng.Float64())*float64(time.Second)))
	if fixed > 0 {
		w.extendForced(ctx, m, xs[0], leaseOf{fixed: fixed, from: wt.call, upto: wt.ret, watchdog: w.cfg.Lease})
	}
	w.releaseLane(n, xs, l, false)
}

// extendForced extends a fixed-lease hold of a forced lane before its
// release: if an operator's ForceUnlock or DEL that the hold was in
// progress for had returned before the call, the lock record no longer
// holds it (the forcer's DEL leaves no record at all, and nobody may have
// taken the lock since: its waiters sleep on the lease they were refused
// under), and Extend must say so (ErrNotHeld), not renew a lease that
// nobody keeps.
func (w *world) extendForced(ctx context.Context, m *mutex.Mutex, x *hold, lse leaseOf) {
	before := time.Now()
	got := w.extendLane(ctx, lse.fixed, m, x, lse)
	if got.unknown || got.from.Before(before) {
		return // it failed
	}
	if what, at, ok := w.hist.removedBefore(x, before); ok {
		w.hist.violation("Extend of %q (hold #%d, owner %s) called at %s renewed the lease, but an operator's %s at %s had removed the hold",
			x.res, x.id, x.owner, w.hist.since(before), what, w.hist.since(at))
	}
}

// forcer force-unlocks a forced lane every tenth to third of a lease (or
// DELs mf's keys), as an operator would, through the admin node.
func (w *world) forcer(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		sleep(ctx, time.Duration((0.1+0.23*rng.Float64())*float64(w.cfg.Lease)))
		if ctx.Err() != nil {
			return
		}
		res := forcedLanes[rng.IntN(len(forcedLanes))]
		// The Mutex lane's keys are deleted instead half of the time, as
		// an operator's DEL would: that leaves no released record behind
		// (a ForceUnlock keeps one for a while), which the holder's
		// Extend (extendForced) must find gone just the same.
		del := res == "mf" && rng.IntN(2) == 0
		from := time.Now()
		// In force, for the holds it may hit, from before it is sent (as
		// the schedule's operator faults are, and the lines' lane's): a
		// holder may find its hold gone at a renewal and end it before
		// the call returns here, and the history judges a loss when the
		// hold ends. The call's bound is a lease, and the admin node has
		// no proxy to hold the request up past it.
		kind, what, action := "forceunlock", "ForceUnlock", func() error { return w.forceUnlock(ctx, res) }
		if del {
			kind, what, action = "del", "DEL of its keys", func() error { return w.delKeys(res) }
		}
		w.hist.fault(from, from.Add(w.cfg.Lease), kind, res, -1)
		done := w.hist.operator(res, what)
		err := action()
		// Until a lease after it ended, as the schedule's operator
		// faults are.
		w.hist.fault(from, time.Now().Add(w.cfg.Lease), kind, res, -1)
		if err != nil {
			w.expected(what+" of "+res, from, err, mutexErrs...)
			continue
		}
		done()
		w.count("lane.force")
	}
}

// nestOnce takes one more hold of a lock whose holder holds it with its
// lease running, and undoes it: "each Unlock (or RUnlock) undoes one". The
// nested call must not wait (its bound is a quarter lease) and must find
// the hold: one that reports it lost when no fault explains it is the
// history's "loss with no fault" (lane holds are short, so few faults
// overlap them, unlike the shared names'). It reports whether both calls
// succeeded.
func (w *world) nestOnce(ctx context.Context, count, lockOp, unlockOp string, lock, unlock func(context.Context) error) bool {
	w.count(count)
	nctx, cancel := context.WithTimeout(ctx, w.cfg.Lease/4)
	call := time.Now()
	err := lock(nctx)
	cancel()
	if err != nil {
		w.expected("nested "+lockOp, call, err, mutexErrs...)
		return false
	}
	rctx, rcancel := w.releaseCtx()
	err = unlock(rctx)
	rcancel()
	if err != nil {
		w.expected("nested "+unlockOp, call, err, mutexErrs...)
		return false
	}
	return true
}

// nestWrite nests a write hold in rw's (x); after its Unlock the lock is
// still rw's: Info says so (rwInfo), and the exclusion rule sees any
// writer or reader let in meanwhile.
func (w *world) nestWrite(ctx context.Context, rw *mutex.RWMutex, x *hold, lse leaseOf) {
	if w.nestOnce(ctx, "lane.nestwrite", "RWMutex.Lock", "RWMutex.Unlock", rw.Lock, rw.Unlock) {
		w.rwInfo(ctx, rw, x, lse)
	}
}

// nestLock nests a hold in m's (x): a Mutex is reentrant, "each Unlock
// undoes one Lock"; after its Unlock the lock is still m's (Info, and the
// exclusion rule against the lane's others).
func (w *world) nestLock(ctx context.Context, m *mutex.Mutex, x *hold, lse leaseOf) {
	if w.nestOnce(ctx, "lane.nestlock", "Mutex.Lock", "Mutex.Unlock", m.Lock, m.Unlock) {
		w.infoHeld(ctx, m, x, lse)
	}
}

// nestRead nests a read hold in rw's (x): "a nested RLock only checks
// that its acquisition is still there" (rwmutex_rlock).
func (w *world) nestRead(ctx context.Context, rw *mutex.RWMutex, x *hold, lse leaseOf) {
	if w.nestOnce(ctx, "lane.nestread", "RWMutex.RLock", "RWMutex.RUnlock", rw.RLock, rw.RUnlock) {
		w.rwInfo(ctx, rw, x, lse)
	}
}

// downgrade takes a read hold while rw holds the write lock, releases the
// write lock, keeps reading for a while and releases.
func (w *world) downgrade(ctx context.Context, n *node, rng *rand.Rand, rw *mutex.RWMutex, wx *hold, lse leaseOf) {
	w.count("lane.downgrade")
	call := time.Now()
	rctx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
	err := rw.RLock(rctx)
	cancel()
	if err != nil {
		w.expected("RLock while writing", call, err, mutexErrs...)
		w.releaseLane(n, []*hold{wx}, rwLock(rw, true), true)
		return
	}
	rx := &hold{kind: "read", res: laneRW, owner: wx.owner, node: n.i, weight: 1, note: "lane, downgraded", call: call, start: time.Now(), lostCh: rw.Lost(), lease: wx.lease}
	w.hist.begin(rx)
	w.releaseLane(n, []*hold{wx}, rwLock(rw, true), true)
	r := rwLock(rw, false)
	w.holdLane(ctx, rng, []*hold{rx}, r, &lse, w.laneHold(rng), nil)
	w.releaseLane(n, []*hold{rx}, r, true)
}

func (w *world) multiLaneOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	plan := w.lanePlan(rng, 60, false)
	fixed, opts := plan.fixed, plan.opts(id)
	try := rng.IntN(6) == 0
	if rng.IntN(4) == 0 {
		// A Mutex of one member: it excludes, and is excluded by, the
		// sets that include it.
		name := laneMulti[rng.IntN(len(laneMulti))]
		m, err := n.locks.NewMutex(name, opts...)
		if err != nil {
			w.hist.violation("NewMutex: %v", err)
			return
		}
		wt := &laneWait{prim: "mutex", res: name, owner: id, node: n.i, weight: 1, try: try, lease: fixed}
		l := mutexLock(m)
		xs := w.lockLane(ctx, n, rng, wt, l, "mutex", "lane member", func() []int64 { return []int64{m.Token()} })
		if xs == nil {
			return
		}
		lse := leaseOf{fixed: fixed, from: wt.call, upto: wt.ret, watchdog: w.cfg.Lease}
		w.holdLane(ctx, rng, xs, l, &lse, w.laneHold(rng), nil)
		w.releaseLane(n, xs, l, true)
		return
	}
	k := 2 + rng.IntN(2)
	var names []string
	for _, i := range rng.Perm(len(laneMulti))[:k] {
		names = append(names, laneMulti[i])
	}
	mm, err := n.locks.NewMultiMutex(names, opts...)
	if err != nil {
		w.hist.violation("NewMultiMutex: %v", err)
		return
	}
	ordered := mm.Names()
	wt := &laneWait{prim: "multi", res: ordered[0], names: ordered, owner: id, node: n.i, weight: 1, try: try, lease: fixed}
	l := multiLock(mm)
	xs := w.lockLane(ctx, n, rng, wt, l, "set", "lane", mm.Tokens)
	if xs == nil {
		return
	}
	lse := leaseOf{fixed: fixed, from: wt.call, upto: wt.ret, watchdog: w.cfg.Lease}
	w.holdLane(ctx, rng, xs, l, &lse, w.laneHold(rng), nil)
	if plan.abandon {
		w.abandonLane(xs, l, lse)
		return
	}
	w.releaseLane(n, xs, l, true)
}

func (w *world) semLaneOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	w.permitLane(ctx, n, rng, id, false)
}

func (w *world) fairSemLaneOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	w.permitLane(ctx, n, rng, id, true)
}

// permitLane acquires 1 to laneCap permits of lps (or lfs, fair) with the
// label id, holds them, and releases them or (a permit of a fixed-lease
// Manager) leaves them to expire.
func (w *world) permitLane(ctx context.Context, n *node, rng *rand.Rand, id string, fair bool) {
	mgr, name, prim := n.sems, lanePSem, "permit"
	fixed := rng.IntN(8) == 0
	switch {
	case fair && fixed:
		mgr, name, prim = n.x.fixedFairSems, laneFSem, "fairpermit"
	case fair:
		mgr, name, prim = n.fairSems, laneFSem, "fairpermit"
	case fixed:
		mgr = n.x.fixedSems
	}
	s, err := mgr.NewSemaphore(name, laneCap, semaphore.WithOwner(id))
	if err != nil {
		w.hist.violation("NewSemaphore: %v", err)
		return
	}
	// Mostly single permits; heavy ones now and then, which a fair queue
	// lets lighter ones pass 16 times at most.
	weight := int64(1)
	switch k := rng.IntN(20); {
	case k >= 17:
		weight = laneCap
	case k >= 15:
		weight = 2
	}
	wt := &laneWait{prim: prim, res: name, owner: id, node: n.i, weight: weight, try: rng.IntN(6) == 0}
	w.count("lane." + prim)
	var p *semaphore.Permit
	valid := false
	err = w.acquireLane(ctx, wt, w.laneTimeout(rng), func(actx context.Context) error {
		var err error
		if wt.try {
			p, err = s.TryAcquire(actx, weight)
		} else {
			p, err = s.Acquire(actx, weight)
		}
		valid = err == nil && p.Valid() // see hold.valid
		return err
	})
	if err != nil {
		w.expected(prim+" lane acquisition", wt.call, err, semErrs...)
		w.ln.add(wt)
		return
	}
	note := "plain lane"
	if fair {
		note = "fair lane"
	}
	x := &hold{kind: "permit", res: name, owner: p.ID(), node: n.i, weight: weight, note: note, call: wt.call, start: wt.ret, valid: valid, lostCh: p.Lost(), try: wt.try}
	if fixed {
		x.lease = w.fixedSemLease()
	}
	w.hist.begin(x)
	wt.x = x
	w.ln.add(wt)
	l := laneLock{unlock: p.Release, lost: p.Lost, err: p.Err, heldUntil: p.HeldUntil, valid: p.Valid}
	lse := leaseOf{from: wt.call, upto: wt.ret, watchdog: w.cfg.Lease}
	if fixed {
		lse.fixed = w.fixedSemLease()
	}
	w.holdersListed(ctx, s, p, x, id)
	w.semInfoHeld(ctx, mgr, s, x)
	d := w.laneHold(rng)
	if fair && weight == 1 {
		// Light holds that overlap, so that a heavy head waits behind
		// them and lighter waiters pass it (the 16-pass bound).
		d += time.Duration((0.02 + 0.03*rng.Float64()) * float64(w.cfg.Lease))
	}
	w.holdLane(ctx, rng, []*hold{x}, l, &lse, d, nil)
	if fixed && rng.IntN(2) == 0 {
		w.abandonLane([]*hold{x}, l, lse)
		return
	}
	w.releasePermit(n, x, p)
	w.holdersReleased(ctx, s, p, x)
}

// quietRWOp is the quiet lane of the RWMutex: a reader (three times in
// five) holds a quarter to half a lease, or a writer waits a twentieth to
// a quarter of a lease and mostly gives up, withdrawing its mark: readers
// that came under that mark must then be let in at once, not when it
// would have ended (checkAnytime, markSpans). Then it rests up to a
// quarter lease.
func (w *world) quietRWOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	rw, err := n.locks.NewRWMutex(laneQuietRW, mutex.WithOwner(id))
	if err != nil {
		w.hist.violation("NewRWMutex: %v", err)
		return
	}
	write := rng.IntN(5) >= 3
	kind, d := "read", w.quietHold(rng)
	timeout := 3 * w.cfg.Lease
	if write {
		kind, d = "write", w.laneHold(rng)
		timeout = time.Duration((0.05 + 0.2*rng.Float64()) * float64(w.cfg.Lease))
	}
	wt := &laneWait{prim: kind, res: laneQuietRW, owner: id, node: n.i, weight: 1}
	l := rwLock(rw, write)
	w.count("lane." + kind)
	valid := false
	err = w.acquireLane(ctx, wt, timeout, func(actx context.Context) error {
		err := l.lock(actx)
		valid = err == nil && l.valid() // see hold.valid
		return err
	})
	if err != nil {
		w.expected(kind+" lane acquisition", wt.call, err, mutexErrs...)
		w.ln.add(wt)
		sleep(ctx, time.Duration(rng.Float64()*float64(w.cfg.Lease)/4))
		return
	}
	x := &hold{kind: kind, res: laneQuietRW, owner: id, node: n.i, weight: 1, token: rw.Token(), note: "quiet lane",
		call: wt.call, start: wt.ret, valid: valid, lostCh: l.lost()}
	w.hist.begin(x)
	wt.x = x
	w.ln.add(wt)
	lse := leaseOf{from: wt.call, upto: wt.ret, watchdog: w.cfg.Lease}
	w.holdLane(ctx, rng, []*hold{x}, l, &lse, d, nil)
	w.releaseLane(n, []*hold{x}, l, true)
	sleep(ctx, time.Duration(rng.Float64()*float64(w.cfg.Lease)/4))
}

// quietSemOp takes the quiet semaphore's permit (watchdog lease), holds it
// as the lanes do, or half of the time as quietHold says, and releases it.
func (w *world) quietSemOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	if rng.IntN(2) == 0 {
		w.semHoldLane(ctx, n, n.sems, laneQuietSem, "permit", id, 1, w.quietHold(rng))
		sleep(ctx, w.cfg.Lease)
		return
	}
	w.semHoldLane(ctx, n, n.sems, laneQuietSem, "permit", id, 1, w.laneHold(rng))
}

// longSemOp takes the lane lls's or llf's permit (its id says which) on
// the watchdog's lease and holds it for 1.1 to 1.5 leases: past the keys'
// expiry its grant set (a lease and a sixteenth), so only the renewals
// keep them (semaphore_renew_batch moves the keys' expiry with the
// permit's), while the other nodes' Acquires wait for longer than a lease
// (a fair one's queue entry kept by the Manager's refreshes,
// semaphore_queue_refresh). With one permit and no other grant between,
// nothing else moves the keys' expiry: a renewal that did not would lose
// the permit, a loss no fault explains; a waiter left asleep after the
// release is late (liveness).
func (w *world) longSemOp(ctx context.Context, n *node, rng *rand.Rand, id string) {
	mgr, res, prim := n.sems, laneLongSem, "permit"
	if strings.Contains(id, laneLongFair) {
		mgr, res, prim = n.fairSems, laneLongFair, "fairpermit"
	}
	w.semHoldLane(ctx, n, mgr, res, prim, id, 1, time.Duration((1.1+0.4*rng.Float64())*float64(w.cfg.Lease)))
}

// passLight keeps the fair semaphore lfp full: a permit of weight 1 held
// for 2 to 6 hundredths of a lease, then again at once. A heavy waiter
// (passHeavy) that heads its queue is passed by them, at most 16 times:
// then the permits freed are kept for it (checkFairSemaphore counts).
func (w *world) passLight(ctx context.Context, n *node, rng *rand.Rand, id string) {
	w.semHoldLane(ctx, n, n.fairSems, lanePass, "fairpermit", id, 1, time.Duration((0.02+0.04*rng.Float64())*float64(w.cfg.Lease)))
}

// passHeavy asks, every half lease to a lease, from a node drawn at
// random, for all of lfp and gives it back at once.
func (w *world) passHeavy(ctx context.Context, rng *rand.Rand) {
	for seq := 1; ctx.Err() == nil; seq++ {
		sleep(ctx, time.Duration((0.5+0.5*rng.Float64())*float64(w.cfg.Lease)))
		open := w.openNodes()
		if len(open) == 0 || ctx.Err() != nil {
			return
		}
		n := open[rng.IntN(len(open))]
		w.semHoldLane(ctx, n, n.fairSems, lanePass, "fairpermit", fmt.Sprintf("n%dheavy.%d", n.i, seq), lanePassCap, 0)
	}
}

// semHoldLane takes weight permits of res through mgr (with the label id),
// holds them for d and releases them.
func (w *world) semHoldLane(ctx context.Context, n *node, mgr *semaphore.Manager, res, prim, id string, weight int64, d time.Duration) {
	s, err := mgr.NewSemaphore(res, laneCapacity(res), semaphore.WithOwner(id))
	if err != nil {
		w.hist.violation("NewSemaphore: %v", err)
		return
	}
	wt := &laneWait{prim: prim, res: res, owner: id, node: n.i, weight: weight}
	w.count("lane." + res)
	var p *semaphore.Permit
	valid := false
	err = w.acquireLane(ctx, wt, 3*w.cfg.Lease, func(actx context.Context) (err error) {
		p, err = s.Acquire(actx, weight)
		valid = err == nil && p.Valid() // see hold.valid
		return err
	})
	if err != nil {
		w.expected(prim+" lane acquisition", wt.call, err, semErrs...)
		w.ln.add(wt)
		return
	}
	note := "plain lane"
	if prim == "fairpermit" {
		note = "fair lane"
	}
	x := &hold{kind: "permit", res: res, owner: p.ID(), node: n.i, weight: weight, note: note, call: wt.call, start: wt.ret, valid: valid, lostCh: p.Lost()}
	w.hist.begin(x)
	wt.x = x
	w.ln.add(wt)
	sleep(ctx, d)
	w.releasePermit(n, x, p)
}

// releasePermit releases a lane's permit, retrying as release does.
func (w *world) releasePermit(n *node, x *hold, p *semaphore.Permit) {
	w.release(x, p.Release, func() bool { return p.Err() != nil }, semErrs)
}

// primitiveCounts counts the finished holds of the whole run (lanes and
// the rest of the workload) by primitive.
func (h *history) primitiveCounts() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := map[string]int{}
	for _, x := range h.done {
		n[primitiveOf(x)]++
	}
	return n
}

func primitiveOf(x *hold) string {
	switch x.kind {
	case "mutex", "permit":
		if strings.HasPrefix(x.note, "fair") {
			return x.kind + ".fair"
		}
		return x.kind + ".plain"
	case "set":
		return "multi"
	}
	return x.kind
}

// minHoldsPerSecond is the fewest holds of each primitive a run must make
// per second that the server was up. With no fault the lanes make 10 to 30
// a second of each, and a run's faults (a partition in the middle of a
// hand-off, a lease a crashed client left) cost some of them; the scarcest
// are writes (readers overlap, and a writer waits for all of them): under
// -race on the shared 2-core machine, with other harness runs beside it,
// the lowest seen were 30 writes in 9.7 s (3.1 a second) and 24 in under
// 8 s without -race, two other runs beside it. Two a second leaves a third
// of that as margin, and still about twenty holds of each for the oracles.
const minHoldsPerSecond = 2

// checkCounts reports a primitive whose holds fell short of the minimum:
// the oracles saw too little of it for the run to count. The time the
// server was stopped or paused (SIGSTOP, CLIENT PAUSE, a restart, a Close
// while stopped) is the reason a run may make fewer; it is left out.
func (w *world) checkCounts(counts map[string]int) {
	up := w.cfg.Duration - w.hist.serverDown(w.cfg.Duration)
	w.cfg.Logf("holds by primitive %v, in %v with the server up", counts, up.Round(time.Millisecond))
	if up < 5*time.Second {
		w.cfg.Logf("hold minimums not checked: the server was up %v of the run", up.Round(time.Millisecond))
		return
	}
	want := int(minHoldsPerSecond * up.Seconds())
	var short []string
	for _, p := range []string{"mutex.plain", "mutex.fair", "read", "write", "multi", "permit.plain", "permit.fair"} {
		if counts[p] < want {
			short = append(short, fmt.Sprintf("%s %d", p, counts[p]))
		}
	}
	if len(short) > 0 {
		sort.Strings(short)
		w.hist.violation("too few holds for the oracles to judge (want %d of each in %v with the server up): %s", want, up.Round(time.Millisecond), strings.Join(short, ", "))
	}
}

// serverDown is how long, within the first d of the run, a fault of the
// server (every node's calls) was in force, without the lease the fault
// spans carry after their end.
func (h *history) serverDown(d time.Duration) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	type span struct{ from, to time.Time }
	var ss []span
	end := h.epoch.Add(d)
	for _, f := range h.faults {
		if f.res == "" && f.node < 0 {
			to := minTime(f.to.Add(-h.lease), end)
			if to.After(f.from) {
				ss = append(ss, span{maxTime(f.from, h.epoch), to})
			}
		}
	}
	slices.SortFunc(ss, func(a, b span) int { return a.from.Compare(b.from) })
	var down time.Duration
	var cur time.Time
	for _, s := range ss {
		from := maxTime(s.from, cur)
		if s.to.After(from) {
			down += s.to.Sub(from)
			cur = s.to
		}
	}
	return down
}

func newLaneState() *laneState { return &laneState{byOwner: map[string]*laneWait{}} }

// fixedSemLease is the lease of the lanes' fixed-lease Managers: short,
// since a permit left to expire keeps its weight from the others until
// it ends.
func (w *world) fixedSemLease() time.Duration { return w.cfg.Lease / 4 }

// newLaneNode makes node n's fixed-lease Managers: a permit of theirs
// expires a lease after its grant however long its holder keeps it.
func (w *world) newLaneNode(t testing.TB, n *node) {
	var err error
	if n.x.fixedSems, err = semaphore.NewManager(n.sc, semaphore.Options{Lease: w.fixedSemLease()}); err != nil {
		t.Fatal(err)
	}
	if n.x.fixedFairSems, err = semaphore.NewManager(n.sc, semaphore.Options{Lease: w.fixedSemLease(), Fair: true}); err != nil {
		t.Fatal(err)
	}
	w.newReplicaNode(t, n)
}

// close closes what newLaneNode made, in wg.
func (x *laneNode) close(wg *sync.WaitGroup) {
	now := time.Now()
	x.closedAt.Store(&now)
	cs := []func(){x.fixedSems.Close, x.fixedFairSems.Close}
	for i := range x.unsatLocks {
		cs = append(cs, x.unsatLocks[i].Close, x.unsatSems[i].Close)
	}
	if x.replLocks != nil {
		cs = append(cs, x.replLocks.Close, x.replSems.Close)
	}
	for _, c := range cs {
		wg.Go(c)
	}
}

// checkLanes runs the lanes' oracles once every hold has ended, and
// returns the run's holds by primitive.
func (w *world) checkLanes() map[string]int {
	w.checkAnytime()
	w.checkGiveBacks()
	w.checkFIFO()
	w.checkWriterPreference()
	w.checkValidity()
	w.checkLeaseEnds()
	w.ln.mu.Lock()
	later := slices.Clone(w.ln.later)
	w.ln.mu.Unlock()
	for _, check := range later {
		check()
	}
	w.checkSuspects()
	w.ln.mu.Lock()
	retried := slices.Clone(w.ln.retried)
	w.ln.mu.Unlock()
	for _, check := range retried {
		check()
	}
	counts := w.hist.primitiveCounts()
	w.checkCounts(counts)
	return counts
}
