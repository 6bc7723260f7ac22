// Package chaos is sluice's randomized fault harness: from a seed it runs a
// mixed workload over the public API of every primitive, on several
// clients of one real redis-server or of a 3-master Redis Cluster, on
// rueidis or on another client (Config.Client), while it injects faults
// (network, server, operator mistakes, a slot migrating under load), and
// checks what the API reported against
// an oracle written from the README's guarantees, not from the
// implementation:
//
//   - exclusion: two conflicting holds of one name at once only if one of
//     them was told of its loss (loss signal, Err, a release or Do error
//     wrapping ErrLost); a hold an operator removed must be told by the
//     time it ends; a nested Lock of a hold already known lost returns
//     the loss (ErrLost) and never joins it;
//   - fencing tokens grow in the order holds were granted;
//   - a semaphore's permits held by holders not told of a loss never weigh
//     more than its capacity;
//   - rate limits: allowed cost in any span of one period within each
//     algorithm's documented bound; on keys one goroutine alone uses, an
//     exact model of each algorithm says what must be allowed and what
//     must be refused, and the figures and header fields of each answer,
//     through the Limiters, the middlewares with each Fallback, the
//     Checker and the gRPC interceptors (exact.go, fallback.go,
//     headers.go, grpc.go; README.md in this directory lists the checks);
//   - every error is one of the documented sentinels or a context error,
//     unless a fault was in force around the call; nothing panics;
//   - after the workload, no lock or permit is left held (renewed for
//     nobody), Close returns within its bound, and once the leases have
//     run out no key is left; goleak (redistest.Main) checks goroutines;
//   - probes stage once, after the workload, the combinations it meets
//     only now and then (probes.go), each with its README guarantee;
//   - lanes (lanes.go) give every lock and semaphore a resource of its own
//     with short holds, so that each primitive makes hundreds of holds a
//     run, and every promise of their API happens under the run's faults
//     (fixed leases, Extend, takeovers, crashed clients, ReplicaAcks, an
//     ACL user without channels); a poller reads what Redis holds for
//     them, and their oracles check each promise both ways: liveness at
//     any time, give-backs, FIFO, writer preference, leases, Valid and
//     HeldUntil, Info and Holders (README.md in this directory has the
//     table of guarantees, checks and the mutants they kill).
//
// A failure prints the seed, the fault schedule and the last events of the
// holders involved; SLUICE_CHAOS_SEED reruns one seed. The schedule is
// drawn from the seed; what the machine's timing makes of it is not, so a
// rerun replays the same workload and faults, not the same interleaving.
package chaos

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/faultproxy"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// Config sets one run.
type Config struct {
	Seed     uint64
	Duration time.Duration // how long the workload runs
	Nodes    int           // clients, each behind its own fault proxy
	Workers  int           // goroutines per node
	// Lease is the watchdog lease of every Locker and Manager. The loss
	// margin is a tenth of it (lease.Margin), and the oracle reads loss
	// signals the moment a conflicting hold starts, so the margin must
	// cover the worst timer lateness of a loaded machine: 2 s gives 200 ms.
	Lease time.Duration
	// Faults lists the fault kinds to draw from; nil means all of the
	// menu (AllFaults, or ClusterFaults on a cluster).
	Faults []string
	// Cluster runs the workload on a 3-master Redis Cluster of the run's
	// own instead of one server. No fault proxy can sit in front of a
	// cluster (its redirections name the nodes' real addresses), so its
	// menu has no network faults; it has slot migrations instead.
	Cluster bool
	// Client builds the script cache of one node on a client of addrs
	// (a single server's fault proxy, or every node of a cluster) and
	// returns a function that closes that client. nil means rueidis.
	Client func(ctx context.Context, addrs []string, cluster bool) (*scriptcache.Cache, func(), error)
	// RouteClient, if set, builds the client of a node's rate-limit
	// routes, gRPC server and Checker (fallback.go), as Client does: a
	// client of its own, such as a go-redis client with a small pool that
	// a slowed network exhausts. nil: they share the node's client.
	RouteClient func(ctx context.Context, addrs []string, cluster bool) (*scriptcache.Cache, func(), error)
	// Logf reports progress and the schedule (t.Logf).
	Logf func(format string, args ...any)
}

// Report is what a run did and found.
type Report struct {
	Seed       uint64
	Ops        map[string]int // operations by kind
	Holds      map[string]int // finished holds by kind
	Faults     map[string]int // faults injected by kind
	Schedule   []string       // the faults in order, with times
	CloseTook  time.Duration  // the longest Close of a node
	Violations []string

	// Prims counts the finished holds by primitive (lanes.go): mutex.plain,
	// mutex.fair, read, write, multi, permit.plain, permit.fair.
	Prims map[string]int
}

// Summary is a one-line account of the run.
func (r Report) Summary() string {
	ops := 0
	for _, n := range r.Ops {
		ops += n
	}
	return fmt.Sprintf("seed %d: %d operations %v, holds %v, holds by primitive %v, faults %v, longest Close %v, %d violations",
		r.Seed, ops, r.Ops, r.Holds, r.Prims, r.Faults, r.CloseTook.Round(time.Millisecond), len(r.Violations))
}

const (
	lockNames = 3 // m0..m2, shared by Mutexes of every node and by MultiMutexes
	rwNames   = 2 // rw0, rw1
	semNames  = 2 // s0, s1
	semCap    = 3 // the heaviest request asks for all of it (hotSemaphore)
	limitKeys = 2
)

// world is what one run works on.
type world struct {
	cfg  Config
	srv  *redistest.Server  // the single server, nil on a cluster
	cl   *redistest.Cluster // the cluster, nil on a single server
	hist *history
	lim  *limitLog
	// policies is the Policies set the workload passes to AllowPolicies
	// and WaitPolicies; each of its policies keeps its own log in lim.
	policies *ratelimit.Policies
	nodes    []*node
	admin    *node // no proxy: the operator's ForceUnlock

	inflight inflight
	ln       *laneState    // the lanes' records (lanes.go)
	concOut  concOutages   // outages the concurrency routes were told of
	metrics  *metricsCheck // the limits workload's observer (metrics.go)

	capacitySet atomic.Bool   // a SetCapacity was sent (faults.go)
	scriptErrs  *scriptErrLog // the lock and semaphore scripts' program errors (scripterr.go)
	races       int           // expiry races staged (race.go), by the partition stream only

	migrating sync.Map // res -> true while its slot migrates (faults.go)
	opsMu     sync.Mutex
	ops       map[string]int
	closeTook time.Duration // the longest Close
}

// node is one client of the server with its own primitives, as one process
// of a fleet would have.
type node struct {
	i           int
	proxy       *faultproxy.Proxy
	closeClient func()
	sc          *scriptcache.Cache
	locks       *mutex.Locker
	fair        *mutex.Locker
	sems        *semaphore.Manager
	fairSems    *semaphore.Manager
	limiters    []*ratelimit.Limiter
	counters    *ratelimit.Limiter // AllowCounters of the exact worker: no deny cache, every answer Redis's
	routes      httpRoutes
	closed      atomic.Bool
	once        sync.Once
	cuts        atomic.Int32 // blackholes in force on proxy (faults.go)
	longHolds   atomic.Int32 // long holds in progress (longHolder)
	x           laneNode     // the lanes' own Managers (lanes.go)
	limits      *limitNode   // the limits workload's routes (fallback.go)
}

// Run runs one seed and returns its report. The caller fails the test on
// Report.Violations.
func Run(t testing.TB, cfg Config) Report {
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.Workers == 0 {
		cfg.Workers = 4
	}
	if cfg.Lease == 0 {
		cfg.Lease = 2 * time.Second
	}
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	// A run takes its Duration and about as long again to heal, wait
	// out its leases and check (25 s for 16 s with -race on two loaded
	// cores): four times that and a minute and a half more is stuck.
	wd := watchRun(cfg.Seed, 4*cfg.Duration+90*time.Second)
	defer wd.done()
	w := &world{cfg: cfg, hist: newHistory(cfg.Lease), lim: newLimitLog(), ops: map[string]int{}, ln: newLaneState(), scriptErrs: newScriptErrLog()}
	if cfg.Client == nil {
		// The default client's script replies are checked (scripterr.go).
		w.cfg.Client = func(ctx context.Context, addrs []string, cluster bool) (*scriptcache.Cache, func(), error) {
			return rueidisClient(ctx, addrs, cluster, w.scriptErrs)
		}
	}
	if cfg.Cluster {
		redistest.Skip(t)
		cl, err := redistest.StartCluster(3)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Stop)
		w.cl = cl
	} else {
		// A replica (replicas.go) syncs at once, also after a restart.
		w.srv = redistest.NewServer(t, "--enable-debug-command", "local", "--repl-diskless-sync-delay", "0")
		w.startReplica(t)
	}
	for i := range semNames {
		w.hist.capacity["s"+strconv.Itoa(i)] = semCap
	}
	w.policies = w.newPolicies(t)
	var err error
	if w.metrics, err = newMetricsCheck(); err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Nodes {
		w.nodes = append(w.nodes, w.newNode(t, i, true))
	}
	w.admin = w.newNode(t, -1, false)
	w.hist.nodeClosed = func(i int) bool { return i >= 0 && w.nodes[i].closed.Load() }
	defer w.admin.close()

	w.hist.epoch = time.Now() // the schedule's times count from here
	ctx, stop := context.WithTimeout(context.Background(), cfg.Duration)
	defer stop()
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	sched := w.schedule(rng)
	opSched := w.operatorStream(rng)
	partSched := w.partitionStream(rng)

	var wg sync.WaitGroup
	mctx, stopMonitor := context.WithCancel(context.Background())
	var monitor sync.WaitGroup
	monitor.Go(func() { w.hist.monitorStalls(mctx) })
	defer monitor.Wait()
	defer stopMonitor()
	for _, n := range w.nodes {
		for j := range cfg.Workers {
			seed := rng.Uint64()
			wg.Go(func() { w.worker(ctx, n, j, rand.New(rand.NewPCG(seed, uint64(n.i)))) })
		}
		// One seed each, drawn here in order: the goroutines' streams
		// depend on the run's seed only.
		hammer, long, hot, client := rng.Uint64(), rng.Uint64(), rng.Uint64(), rng.Uint64()
		wg.Go(func() { w.hammer(ctx, n, rand.New(rand.NewPCG(hammer, 0xbeef))) })
		wg.Go(func() { w.longHolder(ctx, n, rand.New(rand.NewPCG(long, 0x1009))) })
		wg.Go(func() { w.hotSemaphore(ctx, n, rand.New(rand.NewPCG(hot, 0x5e3))) })
		wg.Go(func() { w.httpClient(ctx, n, rand.New(rand.NewPCG(client, 0x4177))) })
		w.startLimits(ctx, &wg, n)
	}
	pollCtx, stopPoll := context.WithCancel(context.Background())
	var pollWG sync.WaitGroup
	if err := w.startLanes(ctx, pollCtx, &wg, &pollWG, rng); err != nil {
		stopPoll()
		t.Fatal(err)
	}
	wd.at("workload and faults")
	var opFaults, partFaults map[string]int
	var ow sync.WaitGroup
	ow.Go(func() { opFaults = w.inject(ctx, opSched, true) })
	ow.Go(func() { partFaults = w.inject(ctx, partSched, false) })
	faults := w.inject(ctx, sched, false)
	ow.Wait()
	for _, m := range []map[string]int{opFaults, partFaults} {
		for k, n := range m {
			faults[k] += n
		}
	}
	wd.at("waiting for the workload's goroutines")
	wg.Wait()
	// The faults are healed before the poller is waited for: its calls
	// have no deadline (poll.go), and one sent to a server still stopped
	// would wait for ever.
	wd.at("stopping the poller")
	stopPoll()
	w.heal()
	if !waitGroupWithin(&pollWG, 30*time.Second) {
		// A view whose call never returns would hold the run for ever:
		// closing the client ends it (rueidis fails calls in flight and
		// retries none after Close).
		w.hist.violation("the poller's calls had not returned 30 s after the faults were healed")
		w.ln.poll.client.Close()
		pollWG.Wait()
	}
	wd.at("probes")
	if probesOn() {
		var probes sync.WaitGroup
		probes.Go(w.probeSeams)
		w.probeWakeUps(w.cfg.Lease / 4)
		w.probeLateTries()
		probes.Wait()
	}

	wd.at("checkQuiet")
	w.checkQuiet(t)
	wd.at("closing the nodes")
	for _, n := range w.nodes {
		w.closeNode(n, "end")
	}
	wd.at("checks")
	w.dropEnvoyKeys()
	if w.capacitySet.Load() {
		// A capacity set by SetCapacity is kept for CapacityRetention
		// (a day), as documented: the operator removes it.
		if err := w.delKeys("s1"); err != nil {
			w.hist.violation("removing s1's set capacity: %v", err)
		}
	}
	// The capacity lanes' set capacity, kept a day, as s1's.
	for _, res := range []string{laneCapSem, laneCapFair} {
		if err := w.delKeys(res); err != nil {
			w.hist.violation("removing %s's set capacity: %v", res, err)
		}
	}
	w.checkKeysExpire()
	w.hist.settle()
	for _, e := range w.hist.excused {
		w.cfg.Logf("excused: %s", e)
	}
	w.hist.checkTokens()
	w.hist.checkLiveness(w.cfg.Lease / 4)
	if probesOn() {
		w.probePolicies()
	}
	w.lim.check(w.hist)
	w.lim.checkWindows(w.hist)
	prims := w.checkLanes()
	w.checkMetrics()
	w.scriptErrs.check(w.hist)

	r := Report{Seed: cfg.Seed, Ops: w.ops, Holds: w.hist.holdsBy(), Faults: faults,
		Schedule: slices.Concat(sched.lines(w.cl != nil), opSched.lines(w.cl != nil), partSched.lines(w.cl != nil)), CloseTook: w.closeTook}
	r.Prims = prims
	w.hist.mu.Lock()
	r.Violations = append(r.Violations, w.hist.viol...)
	w.hist.mu.Unlock()
	return r
}

// waitGroupWithin waits for wg for up to d and reports whether it ended.
// If not, a goroutine stays waiting for it.
func waitGroupWithin(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// newNode starts node i: behind a fault proxy of its own if proxied (on
// a single server only).
func (w *world) newNode(t testing.TB, i int, proxied bool) *node {
	n := &node{i: i}
	var addrs []string
	if w.cl != nil {
		addrs = w.cl.Addrs()
	} else {
		addrs = []string{w.srv.Addr()}
		if proxied {
			p, err := faultproxy.New(addrs[0])
			if err != nil {
				t.Fatal(err)
			}
			n.proxy = p
			addrs[0] = p.Addr()
		}
	}
	var err error
	if n.sc, n.closeClient, err = w.cfg.Client(context.Background(), addrs, w.cl != nil); err != nil {
		if n.proxy != nil {
			n.proxy.Close()
		}
		t.Fatal(err)
	}
	lease := w.cfg.Lease
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	n.locks, err = mutex.NewLocker(n.sc, mutex.Options{WatchdogLease: lease})
	must(err)
	n.fair, err = mutex.NewLocker(n.sc, mutex.Options{WatchdogLease: lease, Fair: true})
	must(err)
	n.sems, err = semaphore.NewManager(n.sc, semaphore.Options{WatchdogLease: lease})
	must(err)
	n.fairSems, err = semaphore.NewManager(n.sc, semaphore.Options{WatchdogLease: lease, Fair: true})
	must(err)
	for _, spec := range limiterSpecs(lease) {
		l, err := ratelimit.New(n.sc, ratelimit.Options{Algorithm: spec.algo, Limit: spec.limit, Prefix: "sluice:rl:" + algoName(spec.algo) + ":"})
		must(err)
		n.limiters = append(n.limiters, l)
		w.lim.limits[algoName(spec.algo)] = spec
	}
	n.counters, err = ratelimit.New(n.sc, ratelimit.Options{Prefix: "sluice:rl:ctr:", DisableDenyCache: true})
	must(err)
	w.newRoutes(t, n)
	w.newLaneNode(t, n)
	if i >= 0 {
		w.newLimitNode(t, n)
	}
	return n
}

// rueidisClient is Config.Client's default: a rueidis client of addrs,
// without client-side caching (the scripts make no use of it).
//
// Its close function cuts the client's connections before it closes the
// client, so that a mortal's crash (mortal.go) is one: nothing it sends
// afterwards reaches Redis. rueidis's cluster client closes its
// connections in goroutines of their own and sends what it is given
// meanwhile: a crashed mortal's fair Locker, closed just after, could
// still send its waiting Lock's give-back and take the entry out of the
// queue, which the fair-order check took for hand-offs passing a live
// entry (two cluster soak seeds, 2026-11-30, both passes within 50 ms of
// the crash).
func rueidisClient(ctx context.Context, addrs []string, _ bool, log *scriptErrLog) (*scriptcache.Cache, func(), error) {
	conns := &connSet{}
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  addrs,
		DisableCache: true,
		Dialer:       dialer(),
		DialCtxFn:    conns.dial,
	})
	if err != nil {
		return nil, nil, err
	}
	sc, err := scriptcache.New(ctx, checkedClient{Client: c, log: log})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return sc, func() { conns.cut(); c.Close() }, nil
}

// connSet keeps the connections a client dialed, so that cut can close
// them all at once and refuse new ones.
type connSet struct {
	mu    sync.Mutex
	conns []net.Conn
	done  bool
}

var errCut = errors.New("chaos: the client's connections were cut")

func (s *connSet) dial(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done {
		return nil, errCut
	}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		c.Close()
		return nil, errCut
	}
	s.conns = append(s.conns, c) // (a run dials a few hundred at most)
	return c, nil
}

// cut closes every connection and refuses the next dials.
func (s *connSet) cut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = true
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = nil
}

func limiterSpecs(lease time.Duration) []limiterSpec {
	period := lease / 2
	return []limiterSpec{
		{ratelimit.FixedWindow, ratelimit.Limit{Rate: 10, Period: period}},
		{ratelimit.SlidingWindow, ratelimit.Limit{Rate: 10, Period: period}},
		{ratelimit.GCRA, ratelimit.Limit{Rate: 10, Period: period, Burst: 4}},
	}
}

// close closes what the node holds: its Lockers and Managers, which end
// their goroutines, then the client.
func (n *node) close() (took time.Duration) {
	n.once.Do(func() { took = n.closeOnce() })
	return took
}

func (n *node) closeOnce() (took time.Duration) {
	start := time.Now()
	n.closed.Store(true)
	var wg sync.WaitGroup
	wg.Go(n.locks.Close)
	wg.Go(n.fair.Close)
	wg.Go(n.sems.Close)
	wg.Go(n.fairSems.Close)
	n.x.close(&wg)
	wg.Go(n.limits.close)
	wg.Wait()
	took = time.Since(start)
	n.closeClient()
	if n.proxy != nil {
		n.proxy.Close()
	}
	return took
}

// closeBound is how long Close may take whatever the server does: the
// give-backs' second, the client's dial timeout (a second here), and as
// much again for a loaded machine. Callers wait up to three leases (6 s),
// so a Close that waits for them is caught.
const closeBound = 4 * time.Second

func (w *world) closeNode(n *node, why string) {
	took := n.close()
	if took > closeBound {
		w.hist.violation("Close of node %d (%s) took %v, bound %v", n.i, why, took, closeBound)
	}
	w.opsMu.Lock()
	w.closeTook = max(w.closeTook, took)
	w.opsMu.Unlock()
}

func (w *world) count(op string) {
	w.opsMu.Lock()
	w.ops[op]++
	w.opsMu.Unlock()
}

// checkQuiet runs after every worker has released everything and the
// faults are healed: within a lease and a half, nothing may still be held
// in Redis, since the watchdogs renew only what a holder holds.
func (w *world) checkQuiet(t testing.TB) {
	deadline := 3 * w.cfg.Lease
	ok := redistest.WaitFor(context.Background(), deadline, func() bool {
		return w.heldKeys(false) == ""
	})
	if !ok {
		left := w.heldKeys(true)
		w.hist.violation("held after every holder released and %v passed: %s", deadline, left)
		w.hist.noteLastHolds(left)
	}
}

// heldKeys lists the lock hashes and permit sets left in Redis, with their
// TTLs and contents if detail is set.
func (w *world) heldKeys(detail bool) string {
	var left []string
	for _, srv := range w.servers() {
		for _, pattern := range []string{"sluice:mutex:{*}", "sluice:sem:{*}"} {
			out, err := srv.Do("KEYS", pattern)
			if err != nil {
				return "KEYS failed: " + err.Error()
			}
			for k := range strings.FieldsSeq(out) {
				typ, _ := srv.Do("TYPE", k)
				if typ == "string" {
					continue // an operator's wrong-typed key, with a TTL
				}
				if typ == "hash" {
					// A capacity set by SetCapacity outlives the permits
					// (CapacityRetention): the hash holds nothing once no
					// permit in its expiry set (":e") is live. Expired
					// ones stay counted until an Acquire reclaims them,
					// which only matters to an Acquire.
					if set, _ := srv.Do("HEXISTS", k, ":set"); strings.TrimSpace(set) == "1" {
						if w.noLivePermit(srv, k+":e") {
							continue
						}
					}
				}
				if !detail {
					left = append(left, k)
					continue
				}
				ttl, _ := srv.Do("PTTL", k)
				var body string
				switch typ {
				case "hash":
					body, _ = srv.Do("HGETALL", k)
				case "zset":
					body, _ = srv.Do("ZRANGE", k, "0", "-1", "WITHSCORES")
				}
				left = append(left, fmt.Sprintf("%s (%s, PTTL %s on %s: %s)", k, typ, ttl, srv.Addr(), strings.ReplaceAll(body, "\n", " ")))
			}
		}
	}
	return strings.Join(left, ", ")
}

// checkKeysExpire runs after Close: every key must go within the longest
// lease of anything (a queue entry's, a tombstone's) and a margin.
func (w *world) checkKeysExpire() {
	ok := redistest.WaitFor(context.Background(), 4*w.cfg.Lease, func() bool {
		for _, srv := range w.servers() {
			out, err := srv.Do("DBSIZE")
			if err != nil || strings.TrimSpace(out) != "0" {
				return false
			}
		}
		return true
	})
	if !ok {
		var keys []string
		for _, srv := range w.servers() {
			out, _ := srv.Do("KEYS", "*")
			keys = append(keys, strings.Fields(out)...)
		}
		w.hist.violation("keys left %v after every Close: %s", 4*w.cfg.Lease, strings.Join(keys, " "))
	}
}

// noLivePermit reports whether the expiry set z lists no permit whose
// expiry (server milliseconds) is still to come.
func (w *world) noLivePermit(srv *redistest.Server, z string) bool {
	t, err := srv.Do("TIME")
	if err != nil {
		return false
	}
	f := strings.Fields(t)
	if len(f) < 2 {
		return false
	}
	sec, err1 := strconv.ParseInt(f[0], 10, 64)
	usec, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return false
	}
	now := sec*1000 + usec/1000
	live, err := srv.Do("ZCOUNT", z, "("+strconv.FormatInt(now, 10), "+inf")
	return err == nil && strings.TrimSpace(live) == "0"
}

// servers are the redis-servers of the run: the single server, or the
// cluster's masters.
func (w *world) servers() []*redistest.Server {
	if w.cl != nil {
		return w.cl.Nodes
	}
	return []*redistest.Server{w.srv}
}

// owner returns the server that holds key: on a cluster, the master that
// owns its slot now.
func (w *world) owner(key string) (*redistest.Server, error) {
	if w.cl == nil {
		return w.srv, nil
	}
	return w.cl.Owner(int(keyspace.Slot(key)))
}

// doAll sends one command to every server.
func (w *world) doAll(args ...string) error {
	var errs []error
	for _, srv := range w.servers() {
		if _, err := srv.Do(args...); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", srv.Addr(), err))
		}
	}
	return errors.Join(errs...)
}
