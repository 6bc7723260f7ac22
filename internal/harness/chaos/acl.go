package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// "Wake-ups need channel access": a client of an ACL user with no channel
// permission (resetchannels, the Redis 7 default for new users). Both
// ways:
//
//   - a Lock of a lock nobody holds, and its Unlock, work (an uncontended
//     pair publishes nothing);
//   - a Lock of a lock another client holds, and an Acquire of a full
//     semaphore, return an error wrapping ErrSubscribe (and NOPERM) well
//     before their context ends, "instead of silently waiting out a whole
//     lease", and hold nothing (the holder's release and a Try of the
//     admin's right after succeed).
//
// The user is created again before each step: a restart of the server
// (a fault of the run) forgets it. Its client has no fault proxy.
const aclUser = "sluice-nochannels"

func (w *world) aclLane(ctx context.Context, rng *rand.Rand) {
	if err := w.createACLUser(); err != nil {
		w.hist.violation("ACL SETUSER: %v", err)
		return
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: w.addrs(), DisableCache: true, Dialer: dialer(),
		Username: aclUser, Password: "pw"})
	if err != nil {
		w.hist.violation("the ACL user's client: %v", err)
		return
	}
	defer c.Close()
	sc, err := scriptcache.New(ctx, c)
	if err != nil {
		w.expected("the ACL user's script cache", time.Now(), err)
		return
	}
	locks, err := mutex.NewLocker(sc, mutex.Options{WatchdogLease: w.cfg.Lease})
	if err != nil {
		w.hist.violation("NewLocker: %v", err)
		return
	}
	defer locks.Close()
	sems, err := semaphore.NewManager(sc, semaphore.Options{WatchdogLease: w.cfg.Lease})
	if err != nil {
		w.hist.violation("NewManager: %v", err)
		return
	}
	defer sems.Close()
	seq := 0
	for ctx.Err() == nil {
		seq++
		sleep(ctx, time.Duration((0.05+0.1*rng.Float64())*float64(w.cfg.Lease)))
		if ctx.Err() != nil || w.createACLUser() != nil {
			continue
		}
		switch rng.IntN(3) {
		case 0:
			w.aclPair(ctx, locks, fmt.Sprintf("la.%d", seq))
		case 1:
			w.aclContended(ctx, "Lock", func(ctx context.Context) error {
				m, err := locks.NewMutex("lac")
				if err != nil {
					return err
				}
				err = m.Lock(ctx)
				if err == nil {
					rctx, cancel := w.releaseCtx()
					defer cancel()
					_ = m.Unlock(rctx) // the violation is recorded; give it back
				}
				return err
			}, func(ctx context.Context) (func(context.Context) error, error) {
				m, err := w.admin.locks.NewMutex("lac")
				if err != nil {
					return nil, err
				}
				return m.Unlock, m.Lock(ctx)
			})
		default:
			w.aclContended(ctx, "Acquire", func(ctx context.Context) error {
				s, err := sems.NewSemaphore("las", 1)
				if err != nil {
					return err
				}
				p, err := s.Acquire(ctx, 1)
				if err == nil {
					rctx, cancel := w.releaseCtx()
					defer cancel()
					_ = p.Release(rctx) // the violation is recorded; the lease ends it
				}
				return err
			}, func(ctx context.Context) (func(context.Context) error, error) {
				s, err := w.admin.sems.NewSemaphore("las", 1)
				if err != nil {
					return nil, err
				}
				p, err := s.Acquire(ctx, 1)
				if err != nil {
					return nil, err
				}
				return p.Release, nil
			})
		}
	}
}

// createACLUser makes (or makes again) the user without channel access.
func (w *world) createACLUser() error {
	return w.doAll("ACL", "SETUSER", aclUser, "on", ">pw", "~*", "+@all", "resetchannels")
}

// aclPair: a Lock and Unlock of a lock nobody else uses work.
func (w *world) aclPair(ctx context.Context, locks *mutex.Locker, name string) {
	w.count("lane.acl")
	m, err := locks.NewMutex(name)
	if err != nil {
		w.hist.violation("NewMutex: %v", err)
		return
	}
	lctx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
	defer cancel()
	call := time.Now()
	err = m.Lock(lctx)
	if err == nil {
		err = m.Unlock(lctx)
	}
	if err != nil && !runOver(ctx) {
		w.suspect(call, time.Now(), nil, "", "ACL user without channel access: an uncontended Lock and Unlock of %q (called %s) failed: %v", name, w.hist.since(call), err)
	}
}

// aclContended: the admin holds, the ACL user's blocking call must fail
// with ErrSubscribe at once, and the admin's release succeeds.
func (w *world) aclContended(ctx context.Context, what string, call func(context.Context) error, hold func(context.Context) (func(context.Context) error, error)) {
	w.count("lane.acl")
	hctx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
	defer cancel()
	release, err := hold(hctx)
	if err != nil {
		w.expected("the admin's hold for the ACL lane", time.Now(), err, append(mutexErrs, semErrs...)...)
		return
	}
	defer func() {
		rctx, rcancel := w.releaseCtx()
		defer rcancel()
		at := time.Now()
		if err := release(rctx); err != nil {
			w.suspect(at, time.Now(), nil, "", "ACL lane: the admin's release after the ACL user's refused %s failed: %v", what, err)
		}
	}()
	wait := w.cfg.Lease
	actx, acancel := context.WithTimeout(ctx, wait)
	defer acancel()
	start := time.Now()
	err = call(actx)
	took := time.Since(start)
	// Its client has no fault proxy: only a fault of the server excuses.
	if runOver(ctx) {
		return
	}
	end := time.Now()
	switch {
	case err == nil:
		w.suspect(start, end, nil, "", "ACL user without channel access: a %s of a held resource returned nil (called %s)", what, w.hist.since(start))
	case !errors.Is(err, mutex.ErrSubscribe) && !errors.Is(err, semaphore.ErrSubscribe):
		w.suspect(start, end, nil, "", "ACL user without channel access: a %s that had to wait returned %v after %v, not ErrSubscribe", what, err, took.Round(time.Millisecond))
	case took > wait/2:
		w.suspect(start, end, nil, "", "ACL user without channel access: a %s that had to wait returned ErrSubscribe only after %v", what, took.Round(time.Millisecond))
	}
}
