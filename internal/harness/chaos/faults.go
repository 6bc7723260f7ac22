package chaos

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// Every fault kind the harness can inject.
var AllFaults = []string{
	"latency", "blackhole", "dropreplies", "reset", // one node's network (fault proxy)
	"scriptflush", "clientpause", "sigstop", "restart", // the server
	"del", "wrongtype", "forceunlock", "flushall", "capacity", "limitkey", // operator mistakes, and SetCapacity
	"close",                    // Close of a node's Lockers and Managers with calls in flight
	"partition", "lag", "race", // a node cut off or slowed for longer than a lease (partitionStream)
}

// ClusterFaults is the menu on a cluster: no fault proxy can sit in front
// of one, so there are no network faults; server faults stop or pause one
// node, SCRIPT FLUSH and FLUSHALL go to every node, the other operator
// mistakes to the node that owns the resource's slot, and "migrate" moves
// that slot, keys and all, to another master under load. A kill -9 of a
// node is left out: it loses data and the cluster's configuration.
var ClusterFaults = []string{
	"scriptflush", "clientpause", "sigstop",
	"del", "wrongtype", "forceunlock", "flushall", "capacity", "limitkey",
	"close", "migrate",
}

// fault is one entry of a schedule: at its offset from the start, kind
// hits node (network faults, close), server (server faults on a cluster:
// an index of its masters) or res (operator faults, migrate) for length.
type fault struct {
	at     time.Duration
	kind   string
	node   int
	server int
	res    string
	length time.Duration
	base   time.Duration // latency
	cap    int64         // capacity: the new capacity of semaphore res
	seed   uint64        // race: its choices
}

type schedule []fault

// stormEnd is the share of the run that has faults; the rest is calm, so
// that waiters can be checked for liveness and the end state settles.
const stormEnd = 0.6

// schedule draws the run's faults from rng: in the storm (the first
// stormEnd of the run) one every lease/4 to lease, lengths measured
// against the lease, and on top of them a careless operator who deletes,
// overwrites or force-unlocks a resource every lease/8 to lease/2; once,
// a node is closed while the server is stopped, with calls in flight.
func (w *world) schedule(rng *rand.Rand) schedule {
	menu := AllFaults
	if w.cl != nil {
		menu = ClusterFaults
	}
	kinds := w.cfg.Faults
	if kinds == nil {
		kinds = menu
	}
	kinds = slices.DeleteFunc(slices.Clone(kinds), func(k string) bool {
		// Streams of their own: partitionStream, operatorStream.
		return !slices.Contains(menu, k) || k == "partition" || k == "lag" || k == "race" || k == "capacity" || k == "limitkey"
	})
	if len(kinds) == 0 {
		return nil
	}
	lease := w.cfg.Lease
	span := func(lo, hi float64) time.Duration {
		return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(lease))
	}
	storm := time.Duration(stormEnd * float64(w.cfg.Duration))
	var s schedule
	for at := span(0.1, 0.5); at < storm; at += span(0.25, 1) {
		f := fault{at: at, kind: kinds[rng.IntN(len(kinds))], node: rng.IntN(w.cfg.Nodes)}
		if w.cl != nil {
			// Drawn only on a cluster, so that a single server's
			// schedules stay those its seeds always drew.
			f.server = rng.IntN(len(w.cl.Nodes))
		}
		switch f.kind {
		case "latency":
			f.base, f.length = span(0.05, 1.6), span(0.5, 2)
		case "blackhole":
			f.length = span(0.25, 2)
		case "dropreplies":
			f.length = span(0.1, 1)
		case "clientpause":
			f.length = span(0.1, 1)
		case "sigstop":
			f.length = span(0.25, 1.5)
		case "del", "wrongtype", "forceunlock":
			f.res = resources[rng.IntN(len(resources))]
		case "migrate":
			// To f.server unless it owns the slot already (then the
			// next master); each key waits length before it moves.
			f.res = resources[rng.IntN(len(resources))]
			f.length = span(0.02, 0.2)
		case "close":
			continue // placed below
		}
		s = append(s, f)
	}
	if slices.Contains(kinds, "close") && w.cfg.Nodes > 1 {
		at := time.Duration((0.3 + rng.Float64()*0.15) * float64(w.cfg.Duration))
		i, _ := slices.BinarySearchFunc(s, at, func(f fault, at time.Duration) int { return cmp.Compare(f.at, at) })
		s = slices.Insert(s, i, fault{at: at, kind: "close", node: rng.IntN(w.cfg.Nodes), length: 1})
	}
	return s
}

// partitionStream draws faults longer than a lease: every one and a half
// to three leases of the storm, either an expiry race (half of them; see
// expiryRace), or one node's fault proxy drops everything for 1.2 to 1.8
// leases (a partition; the node cut off is one in the middle of a long
// hold, if one is: see apply) or delays every reply by 1.05 to 1.4 leases
// for one to two leases (lag, so that grants and renewals come back after
// their lease). Either way the node's leases run out on the server while
// it still holds, and the other nodes take what it held. The main
// schedule's faults are mostly shorter than a lease; these are the ones
// after which a holder's loss signal, its watchdog, a nested Lock, a late
// grant and a competitor's grant meet. Only on a single server (a cluster
// has no fault proxies).
func (w *world) partitionStream(rng *rand.Rand) schedule {
	if w.cl != nil {
		return nil
	}
	var kinds []string
	for _, k := range []string{"partition", "lag", "race"} {
		if w.cfg.Faults == nil || slices.Contains(w.cfg.Faults, k) {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) == 0 {
		return nil
	}
	lease := w.cfg.Lease
	span := func(lo, hi float64) time.Duration {
		return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(lease))
	}
	storm := time.Duration(stormEnd * float64(w.cfg.Duration))
	var s schedule
	for at := lease / 2; at < storm; at += span(1.5, 3) {
		// Half of them expiry races (if the menu has them), where a lease
		// running out meets a waiter by design.
		kind := kinds[rng.IntN(len(kinds))]
		if slices.Contains(kinds, "race") && rng.IntN(2) == 0 {
			kind = "race"
		}
		f := fault{at: at, kind: kind, node: rng.IntN(w.cfg.Nodes), seed: rng.Uint64()}
		switch f.kind {
		case "partition":
			f.length = span(1.2, 1.8)
		case "lag":
			f.base, f.length = span(1.05, 1.4), span(1, 2)
		}
		s = append(s, f)
	}
	return s
}

// operatorStream draws the careless operator's actions (see schedule),
// and now and then a SetCapacity of s1 (2 to 4; the workload's weights
// are at most 2 there) that shrinks or grows it under load, or a string
// written over the HTTP rate limiter's counter (limitkey: a semantic
// error, which must never reach the middleware's fallback).
func (w *world) operatorStream(rng *rand.Rand) schedule {
	var kinds []string
	for _, k := range []string{"del", "wrongtype", "forceunlock", "capacity", "limitkey"} {
		if w.cfg.Faults == nil || slices.Contains(w.cfg.Faults, k) {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) == 0 {
		return nil
	}
	storm := time.Duration(stormEnd * float64(w.cfg.Duration))
	var s schedule
	for at := w.cfg.Lease / 4; at < storm; at += time.Duration((0.125 + rng.Float64()*0.375) * float64(w.cfg.Lease)) {
		f := fault{at: at, kind: kinds[rng.IntN(len(kinds))], res: resources[rng.IntN(len(resources))]}
		switch f.kind {
		case "capacity":
			f.res, f.cap = "s1", 2+rng.Int64N(3)
		case "limitkey":
			f.res = "limit:http"
		}
		s = append(s, f)
	}
	return s
}

// resources are the names operator faults aim at.
var resources = func() []string {
	var r []string
	for i := range lockNames {
		r = append(r, "m"+strconv.Itoa(i))
	}
	for i := range rwNames {
		r = append(r, "rw"+strconv.Itoa(i))
	}
	for i := range semNames {
		r = append(r, "s"+strconv.Itoa(i))
	}
	return r
}()

func (s schedule) lines(cluster bool) []string {
	var out []string
	for _, f := range s {
		l := fmt.Sprintf("%.3fs %s", f.at.Seconds(), f.kind)
		switch {
		case f.kind == "migrate":
			l += fmt.Sprintf(" %s to master %d (or the next), %v between keys", f.res, f.server, f.length.Round(time.Millisecond))
		case cluster && (f.kind == "sigstop" || f.kind == "clientpause"):
			l += fmt.Sprintf(" master %d for %v", f.server, f.length.Round(time.Millisecond))
		case cluster && f.kind == "close" && f.length > 0:
			l += fmt.Sprintf(" node %d while master %d is stopped", f.node, f.server)
		case f.kind == "close" && f.length > 0:
			l += fmt.Sprintf(" node %d while the server is stopped", f.node)
		case f.kind == "capacity":
			l += fmt.Sprintf(" %s to %d", f.res, f.cap)
		case f.res != "":
			l += " " + f.res
		case f.kind == "latency" || f.kind == "lag":
			l += fmt.Sprintf(" node %d base %v for %v", f.node, f.base.Round(time.Millisecond), f.length.Round(time.Millisecond))
		case f.kind == "sigstop" || f.kind == "clientpause":
			l += fmt.Sprintf(" for %v", f.length.Round(time.Millisecond))
		case f.length > 0:
			l += fmt.Sprintf(" node %d for %v", f.node, f.length.Round(time.Millisecond))
		case f.kind == "reset" || f.kind == "close":
			l += fmt.Sprintf(" node %d", f.node)
		}
		out = append(out, l)
	}
	return out
}

// inject runs the schedule until ctx ends, one fault at a time, and
// returns how many of each kind it injected.
//
// tolerant: a fault that could not be applied is skipped, not reported
// (the careless operator's actions, which may meet a stopped server).
func (w *world) inject(ctx context.Context, s schedule, tolerant bool) map[string]int {
	n := map[string]int{}
	start := w.hist.epoch
	for _, f := range s {
		select {
		case <-ctx.Done():
			return n
		case <-time.After(time.Until(start.Add(f.at))):
		}
		if ctx.Err() != nil {
			// Both were ready (the previous fault ran past the end):
			// select chose at random.
			return n
		}
		at := time.Now()
		if err := w.apply(ctx, f); err != nil {
			if (tolerant || f.res != "") && f.kind != "migrate" {
				// The operator's command met a fault (a stopped server,
				// a connection a restart broke): it did not happen. A
				// migration that failed is no such action: it may leave
				// its slot half moved, answering TRYAGAIN for ever
				// (redistest retries its steps for 30 s first).
				continue
			}
			w.hist.violation("fault %s could not be injected: %v", f.kind, err)
			return n
		}
		w.cfg.Logf("fault %s applied at %s, done at %s", f.kind, w.hist.since(at), w.hist.since(time.Now()))
		n[f.kind]++
	}
	return n
}

// apply injects f and, for a fault with a length, waits it out and heals.
func (w *world) apply(ctx context.Context, f fault) error {
	// A fault is in force from just before it is applied until a lease
	// after it ends: calls sent meanwhile may still be answered late or
	// find its effects.
	from := time.Now()
	nd := w.nodes[f.node]
	if f.kind == "partition" {
		// Cut off a node in the middle of a long hold, so that what it
		// holds expires while it holds it, the first such node from
		// f.node on; f.node if none holds.
		for k := range w.cfg.Nodes {
			if c := w.nodes[(f.node+k)%w.cfg.Nodes]; c.longHolds.Load() > 0 && !c.closed.Load() {
				nd = c
				w.cfg.Logf("partition: node %d, in a long hold", c.i)
				break
			}
		}
	}
	// Faults of one node's network (and its Close) hit that node only.
	hit := -1
	switch f.kind {
	case "latency", "lag", "blackhole", "partition", "dropreplies", "reset", "race":
		hit = nd.i
	case "close":
		if f.length == 0 { // with the server running
			hit = nd.i
		}
	}
	w.hist.fault(from, from.Add(f.length+w.cfg.Lease), f.kind, f.res, hit)
	srv := w.servers()[f.server] // the one stopped or paused
	hold := func() {
		select {
		case <-ctx.Done():
		case <-time.After(f.length):
		}
	}
	var err error
	switch f.kind {
	case "latency", "lag":
		jitter := f.base / 4
		nd.proxy.SetLatency(f.base, jitter)
		hold()
		nd.proxy.SetLatency(0, 0)
		// The proxy delays each chunk by what was in force when it read
		// it, and writes a connection's chunks in order: those read just
		// before now are written up to base+jitter later, and what is
		// sent meanwhile waits behind them (seed 1795919402220820657's lag
		// of 2.7 s on node 1: a call sent 0.6 s after the lag ended took
		// 2.7 s). The fault ends when they are through.
		w.hist.fault(from, time.Now().Add(f.base+jitter+w.cfg.Lease), f.kind, f.res, hit)
	case "race":
		x := nd
		var y *node
		for k := 1; k < w.cfg.Nodes; k++ {
			if c := w.nodes[(f.node+k)%w.cfg.Nodes]; !c.closed.Load() {
				y = c
				break
			}
		}
		if x.closed.Load() || y == nil {
			break
		}
		w.races++
		err = w.expiryRace(ctx, x, y, rand.New(rand.NewPCG(f.seed, 0x7ace)), w.races)
	case "blackhole", "partition":
		// The two streams may cut one node at once: the node stays cut
		// until both have ended.
		if nd.cuts.Add(1) == 1 {
			nd.proxy.Blackhole(true)
		}
		hold()
		if nd.cuts.Add(-1) == 0 {
			nd.proxy.Blackhole(false)
		}
	case "dropreplies":
		nd.proxy.DropReplies(true)
		hold()
		nd.proxy.DropReplies(false)
	case "reset":
		nd.proxy.ResetAll()
	case "scriptflush":
		err = w.doAll("SCRIPT", "FLUSH")
	case "clientpause":
		_, err = srv.Do("CLIENT", "PAUSE", strconv.FormatInt(f.length.Milliseconds(), 10), "ALL")
		hold()
	case "sigstop":
		if err = srv.Pause(); err == nil {
			hold()
			err = w.resume(srv)
		}
	case "restart":
		done := w.hist.operator("", "restart")
		err = w.srv.Restart()
		if err == nil {
			done() // an action that failed removed nothing
		}
	case "flushall":
		done := w.hist.operator("", "FLUSHALL")
		err = w.doAll("FLUSHALL")
		if err == nil {
			done() // an action that failed removed nothing
		}
	case "del":
		done := w.hist.operator(f.res, "DEL of its keys")
		err = w.delKeys(f.res)
		if err == nil {
			done() // an action that failed removed nothing
		}
	case "wrongtype":
		done := w.hist.operator(f.res, "SET of its key to a string")
		w.scriptErrs.foreignData(f.res)
		for _, k := range holderKeys(f.res) {
			var owner *redistest.Server
			if owner, err = w.owner(k); err != nil {
				break
			}
			if _, err = owner.Do("SET", k, "operator", "PX", strconv.FormatInt(w.cfg.Lease.Milliseconds(), 10)); err != nil {
				break
			}
		}
		if err == nil {
			done() // an action that failed removed nothing
		}
	case "limitkey":
		done := w.hist.operator(f.res, "SET of the HTTP limiter's key to a string")
		at := time.Now()
		var owner *redistest.Server
		key := w.nodes[0].limiters[0].RedisKey(httpClientKey) // every node's fixed-window Limiter has the same
		if owner, err = w.owner(key); err == nil {
			_, err = owner.Do("SET", key, "operator", "PX", strconv.FormatInt(w.cfg.Lease.Milliseconds(), 10))
		}
		if err == nil {
			done()
			w.hist.wrongLimit(at, time.Now(), at.Add(w.cfg.Lease))
		}
	case "capacity":
		var sem *semaphore.Semaphore
		if sem, err = w.admin.sems.NewSemaphore(f.res, semCap); err != nil {
			break
		}
		at := time.Now()
		err = sem.SetCapacity(ctx, f.cap)
		w.hist.setCapacity(f.res, -1, at, time.Now(), f.cap, err != nil)
		w.capacitySet.Store(true)
	case "forceunlock":
		done := w.hist.operator(f.res, "ForceUnlock")
		err = w.forceUnlock(ctx, f.res)
		if err == nil {
			done() // an action that failed removed nothing
		}
	case "close":
		if f.length > 0 {
			// Close while the server has stopped answering: Close must
			// not wait for calls in flight to a server that never
			// answers.
			var name string
			if name, err = w.closeProbeName(f.server); err != nil {
				break
			}
			if err = srv.Pause(); err != nil {
				break
			}
			check := w.closeInFlight(nd, name)
			closeAt := time.Now()
			w.closeNode(nd, "with calls in flight to a stopped server")
			err = w.resume(srv)
			check(closeAt)
		} else {
			w.closeNode(nd, "with calls in flight")
		}
	case "migrate":
		err = w.migrate(f)
	}
	// A fault can last longer than planned (a stalled Close, a slow
	// restart): it is in force until a lease after it really ended.
	w.hist.fault(from, time.Now().Add(w.cfg.Lease), f.kind, f.res, hit)
	return err
}

// resume continues a stopped server. On a cluster it waits until every
// node says the cluster is ok again: a node stopped past the node timeout
// is marked failed, and the cluster refuses commands until that clears;
// the fault is in force until then.
func (w *world) resume(srv *redistest.Server) error {
	if err := srv.Resume(); err != nil || w.cl == nil {
		return err
	}
	return w.cl.WaitOK(30 * time.Second)
}

// heal undoes every fault at the end of the workload.
func (w *world) heal() {
	for _, srv := range w.servers() {
		_ = srv.Resume() // fails only for a server that has exited
	}
	for _, n := range w.nodes {
		if n.proxy == nil {
			continue
		}
		n.proxy.SetLatency(0, 0)
		n.proxy.Blackhole(false)
		n.proxy.DropReplies(false)
	}
	_ = w.doAll("CLIENT", "UNPAUSE") // best effort: a node down is not paused
}

// migrate moves the slot of f.res's hash tag to master f.server (or the
// next one if that owns it), one key at a time with f.length before each,
// so that calls meet ASK (a key already moved), TRYAGAIN (a script whose
// keys are split between the two masters) and then MOVED. Keys move with
// MIGRATE, which keeps their TTLs and takes them off the old owner at
// once: no hold is removed, so this is no operator action, only a fault
// whose errors are excused.
func (w *world) migrate(f fault) error {
	slot := int(keyspace.Slot(holderKeys(f.res)[0]))
	from, err := w.cl.Owner(slot)
	if err != nil {
		return err
	}
	to := w.cl.Nodes[f.server]
	if to == from {
		to = w.cl.Nodes[(f.server+1)%len(w.cl.Nodes)]
	}
	w.migrating.Store(f.res, true)
	defer w.migrating.Delete(f.res)
	return w.cl.MigrateSlot(slot, to, 1, func() { time.Sleep(f.length) })
}

// holderKeys are the keys that record a resource's holders: overwriting
// them removes every hold.
func holderKeys(res string) []string {
	switch {
	case strings.HasPrefix(res, "rw"):
		return []string{"sluice:mutex:{" + res + "}:rw.h", "sluice:mutex:{" + res + "}:rw.z"}
	case strings.HasPrefix(res, "s"):
		return []string{"sluice:sem:{" + res + "}"}
	}
	return []string{"sluice:mutex:{" + res + "}"}
}

// delKeys deletes every key of res, on the server that owns its slot.
func (w *world) delKeys(res string) error {
	// While a slot migrates, its keys are on two masters, and a DEL on
	// the owner can succeed without touching the keys already moved (the
	// lock's hash among them): the holds would live on while the oracle
	// believed them removed. The action is not made then.
	if _, ok := w.migrating.Load(res); ok {
		return fmt.Errorf("keys of %q not deleted: its slot is migrating", res)
	}
	srv, err := w.owner("{" + res + "}")
	if err != nil {
		return err
	}
	out, err := srv.Do("KEYS", "sluice:*{"+res+"}*")
	if err != nil {
		return err
	}
	keys := strings.Fields(out)
	if len(keys) == 0 {
		return nil
	}
	_, err = srv.Do(append([]string{"DEL"}, keys...)...)
	return err
}

func (w *world) forceUnlock(ctx context.Context, res string) error {
	// The workload's end does not cut short an operator's call.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.Lease)
	defer cancel()
	switch {
	case strings.HasPrefix(res, "rw"):
		rw, err := w.admin.locks.NewRWMutex(res)
		if err != nil {
			return err
		}
		_, err = rw.ForceUnlock(fctx)
		return ignoreWrongType(err)
	case forceDeletes(res):
		return w.delKeys(res) // a semaphore has no ForceUnlock: an operator deletes it
	}
	m, err := w.admin.locks.NewMutex(res)
	if err != nil {
		return err
	}
	_, err = m.ForceUnlock(fctx)
	return ignoreWrongType(err)
}

// forceDeletes reports whether an operator's "ForceUnlock" of res is a
// DEL of its keys (res is a semaphore, which has no ForceUnlock): a DEL
// wakes nobody, where a lock's ForceUnlock wakes its waiters.
func forceDeletes(res string) bool { return strings.HasPrefix(res, "s") }

// ignoreWrongType: a ForceUnlock that meets an earlier operator's string
// fails, as it should, and is no harness failure.
func ignoreWrongType(err error) error {
	if err != nil && strings.Contains(err.Error(), "WRONGTYPE") {
		return nil
	}
	return err
}

func dialer() net.Dialer { return net.Dialer{Timeout: time.Second} }
