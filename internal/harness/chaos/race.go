package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluicekit/sluice/mutex"
)

// raceNames are the locks of the expiry race, used by nothing else.
var raceNames = []string{"race0", "race1"}

// expiryRace stages the race a lease exists for: node x holds a lock (a
// plain or fair Mutex, a writer of a RWMutex, or a MultiMutex of both race
// names), node y waits for it, and x is cut off from Redis for 1.5 leases.
// The server lets x's lease run out and y in, and the oracle requires x to
// have been told of its loss by then, within its margin; once x is back,
// it tries a nested Lock (which must not join a lost hold) and releases.
// The random workload meets this race only now and then.
func (w *world) expiryRace(ctx context.Context, x, y *node, rng *rand.Rand, seq int) error {
	lk, note := pickLock(x, rng)
	ylk := y.locks
	if note == "fair" {
		ylk = y.fair
	}
	type lockable interface {
		Lock(context.Context) error
		Unlock(context.Context) error
		Lost() <-chan struct{}
		Err() error
	}
	var xm, ym lockable
	var token, ytoken func() int64
	kind, res := "mutex", raceNames[0]
	id := fmt.Sprintf("n%drace.%d", x.i, seq)
	var set []string
	switch rng.IntN(3) {
	case 0:
		a, err := lk.NewMutex(res, mutex.WithOwner(id))
		if err != nil {
			return err
		}
		b, err := ylk.NewMutex(res, mutex.WithOwner(id+"y"))
		if err != nil {
			return err
		}
		xm, ym, token, ytoken = a, b, a.Token, b.Token
	case 1:
		kind = "write"
		a, err := lk.NewRWMutex(res, mutex.WithOwner(id))
		if err != nil {
			return err
		}
		b, err := ylk.NewRWMutex(res, mutex.WithOwner(id+"y"))
		if err != nil {
			return err
		}
		xm, ym, token, ytoken = a, b, a.Token, b.Token
	default:
		kind, set = "set", raceNames
		a, err := lk.NewMultiMutex(raceNames, mutex.WithOwner(id))
		if err != nil {
			return err
		}
		b, err := ylk.NewMultiMutex(raceNames, mutex.WithOwner(id+"y"))
		if err != nil {
			return err
		}
		xm, ym = a, b
		token = func() int64 { return a.Tokens()[0] }
		ytoken = func() int64 { return b.Tokens()[0] }
	}
	if kind == "write" {
		res = raceNames[1] // an RWMutex's keys are not a Mutex's
	}
	call := time.Now()
	lctx, cancel := context.WithTimeout(ctx, 2*w.cfg.Lease)
	err := xm.Lock(lctx)
	cancel()
	if err != nil {
		return nil // a fault of the main schedule: no race this time
	}
	h := &hold{kind: kind, res: res, set: set, owner: id, node: x.i, weight: 1, token: token(), note: note + " (expiry race)",
		call: call, start: time.Now(), lostCh: xm.Lost()}
	w.hist.begin(h)
	// y waits from before the cut; it gets the lock once x's lease has
	// run out on the server.
	got := make(chan struct{})
	go func() {
		defer close(got)
		ycall := time.Now()
		yctx, cancel := context.WithTimeout(ctx, 4*w.cfg.Lease)
		err := ym.Lock(yctx)
		cancel()
		if err != nil {
			w.expected("expiry race, the waiter's Lock", ycall, err, mutexErrs...)
			return
		}
		yh := &hold{kind: kind, res: res, set: set, owner: id + "y", node: y.i, weight: 1, token: ytoken(), note: note + " (expiry race, waiter)",
			call: ycall, start: time.Now(), lostCh: ym.Lost()}
		w.hist.begin(yh)
		sleep(ctx, w.cfg.Lease/8)
		w.release(yh, ym.Unlock, func() bool { return ym.Err() != nil }, mutexErrs)
	}()
	w.cut(ctx, x, w.cfg.Lease*3/2)
	w.nested(ctx, h, xm.Lost(), xm.Lock, xm.Unlock)
	w.release(h, xm.Unlock, func() bool { return xm.Err() != nil }, mutexErrs)
	<-got
	w.count("race." + kind)
	return nil
}

// cut blackholes node n's proxy for d (see apply's blackhole), recorded as
// a fault of n's network.
func (w *world) cut(ctx context.Context, n *node, d time.Duration) {
	from := time.Now()
	w.hist.fault(from, from.Add(d+w.cfg.Lease), "race cut", "", n.i)
	if n.cuts.Add(1) == 1 {
		n.proxy.Blackhole(true)
	}
	sleep(ctx, d)
	if n.cuts.Add(-1) == 0 {
		n.proxy.Blackhole(false)
	}
	w.hist.fault(from, time.Now().Add(w.cfg.Lease), "race cut", "", n.i)
}
