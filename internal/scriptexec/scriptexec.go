// Package scriptexec runs scripts of a scriptcache.Cache for the
// primitives, for work their callers do not wait for: a call whose caller
// left before the reply, whose reply then goes to a late func that undoes
// what it did (ExecOrLate, ExecWaitOrLate), and give-backs sent in the
// background. A Group owns the goroutines of that work, so that a
// primitive's Close ends them all.
//
// It is machinery of sluice's own packages, not part of the public API.
package scriptexec

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sluicekit/sluice/scriptcache"
)

// Group owns the goroutines a primitive starts for work its callers do not
// wait for: the calls of ExecOrLate and ExecWaitOrLate whose callers leave
// before the reply, and give-backs sent in the background. The primitive's
// Close calls Group.Close, so that none of them outlives it, and so that
// none of its callers still waiting for a reply is left waiting: they
// return the Group's closed error.
type Group struct {
	ctx       context.Context // ended by Close: calls in flight
	closedErr error           // what the callers of calls Close gives up get
	cancel    context.CancelFunc
	work      context.Context // ended closeGrace after Close: see Bounded
	endWork   context.CancelFunc
	mu        sync.Mutex
	closed    bool // guarded by mu
	wg        sync.WaitGroup
}

// closeGrace is how long Close lets work started under Bounded go on: a
// give-back on a server that answers takes far less, so it is sent, and
// one on a server that stopped answering holds Close up no longer.
const closeGrace = time.Second

// ErrClosed is the error a call of ExecOrLate or ExecWaitOrLate returns
// when its Group, made without an error of its own, was closed while the
// caller waited for the reply.
var ErrClosed = errors.New("batch group closed")

// NewGroup returns an open Group. closed is the error that callers of
// ExecOrLate and ExecWaitOrLate get when Close gives up their calls: the
// primitive's own (such as semaphore.ErrClosed), so that its callers see
// that error and nothing of this package; nil for ErrClosed.
func NewGroup(closed error) *Group {
	ctx, cancel := context.WithCancel(context.Background())
	work, endWork := context.WithCancel(context.Background())
	if closed == nil {
		closed = ErrClosed
	}
	return &Group{ctx: ctx, closedErr: closed, cancel: cancel, work: work, endWork: endWork}
}

// Go runs f in a goroutine that Close waits for, and reports true. Once
// Close has been called it runs nothing and reports false.
func (g *Group) Go(f func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f()
	}()
	return true
}

// Bounded returns a context for work of the group, such as a give-back: it
// ends after d, or a second (closeGrace) after Close is called. It has no
// deadline on purpose: a call with one may take the lone-call path (see
// scriptcache.New), which notices a cancellation only when its reply comes, so Close
// would wait up to d for a server that stopped answering.
func (g *Group) Bounded(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(g.work)
	t := time.AfterFunc(d, cancel)
	return ctx, func() {
		t.Stop()
		cancel()
	}
}

// AfterClose returns the context of a give-back that its caller sends
// itself because the group, closed, takes no more work (see Go): it ends
// after d or a second (closeGrace), whichever comes first, so it holds
// its caller up no longer than Close holds up the group's own. Like
// Bounded's, it has no deadline.
func AfterClose(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	t := time.AfterFunc(min(d, closeGrace), cancel)
	return ctx, func() {
		t.Stop()
		cancel()
	}
}

// Closed reports whether Close has been called.
func (g *Group) Closed() bool { return g.ctx.Err() != nil }

// Close starts nothing more; the callers still waiting for a reply return
// the Group's closed error at once, as if they had left. Calls their
// callers left, these included, get a second (closeGrace) more for their
// replies, which go to their late funcs (an error if none came: such a
// call may still run, and the primitive's lease ends what it did), as
// does work under Bounded. Close waits for every goroutine of the group:
// a server that stopped answering holds it up no longer than that second.
func (g *Group) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.cancel()
	t := time.AfterFunc(closeGrace, g.endWork)
	g.wg.Wait()
	t.Stop()
	g.endWork()
}

// closing returns a channel closed when Close is called; nil (never
// closed) for a nil Group.
func (g *Group) closing() <-chan struct{} {
	if g == nil {
		return nil
	}
	return g.ctx.Done()
}

// afterLeft makes cancel run closeGrace after g closes, from now on: a
// call its caller left is then given up. Until then it may still get its
// reply, so that its late func knows what the call did and whatever it
// sends to undo that goes after the call: a call given up is not taken
// back by the client (rueidis writes a queued command whose context ended),
// and an undo sent at once on another connection could reach the server
// first (a fair semaphore's leave, overtaken by the attempt that queued
// the waiter, left it queued). It returns the function that undoes that.
func (g *Group) afterLeft(cancel context.CancelFunc) (stop func() bool) {
	if g == nil {
		return func() bool { return false }
	}
	return context.AfterFunc(g.work, cancel)
}

// ExecOrLate is s.Exec, and when ctx ends before the reply arrives, it
// calls late with the reply once it does, from another goroutine. A
// primitive uses it to undo what a call it gave up on did after all, such
// as an acquisition nobody is waiting for: left alone, that would block
// everyone until its lease ran out. When ctx can be cancelled this costs a
// goroutine per call, which ends when Redis answers or the client's own
// timeouts (ConnWriteTimeout) or Close end the call; the client itself
// never sees ctx.
//
// The goroutine is g's: g.Close waits for it, and gives up the call,
// whether its caller has left (late then gets the error) or still waits:
// then ExecOrLate returns g's closed error (see NewGroup) at once, as if
// ctx had ended, and the call's reply or error goes to late. Once g is
// closed, ExecOrLate sends nothing and returns that error,
// and late is never called. With a ctx that cannot end, or no late, it is
// s.Exec: g plays no part. A nil g is a Group that is never closed.
func (g *Group) ExecOrLate(ctx context.Context, s *scriptcache.Script, keys, args []string, late func(scriptcache.Reply)) scriptcache.Reply {
	done := ctx.Done()
	if done == nil || late == nil {
		return s.Exec(ctx, keys, args)
	}
	if err := ctx.Err(); err != nil {
		return scriptcache.ErrorReply(err)
	}
	reply := make(chan scriptcache.Reply) // unbuffered: the reply goes to the caller or to late, never both
	abandoned := make(chan struct{})
	var left func() bool // undoes g.afterLeft; set before abandoned closes
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	run := func() {
		defer cancel()
		r := s.Exec(cctx, keys, args)
		select {
		case reply <- r:
		case <-abandoned:
			left()
			late(r)
		}
	}
	if g == nil {
		go run()
	} else if !g.Go(run) {
		cancel()
		return scriptcache.ErrorReply(g.closedErr)
	}
	var err error
	select {
	case r := <-reply:
		return r
	case <-done:
		err = ctx.Err()
	case <-g.closing():
		err = g.closedErr
	}
	left = g.afterLeft(cancel)
	close(abandoned)
	// The reply may have come at the same moment: take it if so.
	select {
	case r := <-reply:
		left()
		return r
	default:
	}
	return scriptcache.ErrorReply(err)
}

// ExecWaitOrLate is s.ExecWait, and when ctx ends before the reply
// arrives, it calls late with the reply once it comes, from another
// goroutine, so the caller can give back a grant nobody waits for. The
// call itself is bounded as ExecWait bounds it (WAIT's timeout plus a
// slack of 5 s), whatever ctx says: if no reply comes by then (a server
// that stopped answering), late gets an error that is not a Redis reply:
// the outcome is unknown, and nothing more is sent for the call (see
// scriptcache.Client.EvalWait).
//
// It costs a goroutine while in flight when ctx can be cancelled; that
// goroutine is g's, and g.Close gives up the call, as for ExecOrLate; once
// g is closed, ExecWaitOrLate with such a ctx sends nothing and returns
// g's closed error. A nil g is a Group that is never closed.
func (g *Group) ExecWaitOrLate(ctx context.Context, s *scriptcache.Script, keys, args []string, replicas int64, timeout time.Duration, late func(r scriptcache.Reply, acks int64, err error)) (scriptcache.Reply, int64, error) {
	done := ctx.Done()
	if done == nil {
		return s.ExecWait(ctx, keys, args, replicas, timeout)
	}
	if err := ctx.Err(); err != nil {
		return scriptcache.ErrorReply(err), 0, err
	}
	type reply struct {
		r    scriptcache.Reply
		acks int64
		err  error
	}
	replies := make(chan reply) // unbuffered: the reply goes to the caller or to late, never both
	abandoned := make(chan struct{})
	var left func() bool // undoes g.afterLeft; set before abandoned closes
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	run := func() {
		defer cancel()
		var rep reply
		rep.r, rep.acks, rep.err = s.ExecWait(cctx, keys, args, replicas, timeout)
		select {
		case replies <- rep:
		case <-abandoned:
			left()
			if late != nil {
				late(rep.r, rep.acks, rep.err)
			}
		}
	}
	if g == nil {
		go run()
	} else if !g.Go(run) {
		cancel()
		return scriptcache.ErrorReply(g.closedErr), 0, g.closedErr
	}
	var err error
	select {
	case rep := <-replies:
		return rep.r, rep.acks, rep.err
	case <-done:
		err = ctx.Err()
	case <-g.closing():
		err = g.closedErr
	}
	left = g.afterLeft(cancel)
	close(abandoned)
	select {
	case rep := <-replies: // it came at the same moment
		left()
		return rep.r, rep.acks, rep.err
	default:
	}
	return scriptcache.ErrorReply(err), 0, err
}
