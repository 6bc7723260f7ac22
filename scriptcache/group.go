package scriptcache

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
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

// ErrClosed is wrapped by the error a call of ExecOrLate or ExecWaitOrLate
// returns when its Group was closed while the caller waited for the reply.
var ErrClosed = errors.New("scriptcache: group closed")

// NewGroup returns an open Group. closed is the error, wrapped with
// ErrClosed, that callers of ExecOrLate and ExecWaitOrLate get when Close
// gives up their calls: the primitive's own (such as semaphore.ErrClosed),
// so that its callers see that error; nil for ErrClosed alone.
func NewGroup(closed error) *Group {
	ctx, cancel := context.WithCancel(context.Background())
	work, endWork := context.WithCancel(context.Background())
	err := ErrClosed
	if closed != nil {
		err = fmt.Errorf("%w: %w", closed, ErrClosed)
	}
	return &Group{ctx: ctx, closedErr: err, cancel: cancel, work: work, endWork: endWork}
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
// New), which notices a cancellation only when its reply comes, so Close
// would wait up to d for a server that stopped answering.
func (g *Group) Bounded(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(g.work)
	t := time.AfterFunc(d, cancel)
	return ctx, func() {
		t.Stop()
		cancel()
	}
}

// Closed reports whether Close has been called.
func (g *Group) Closed() bool { return g.ctx.Err() != nil }

// Close starts nothing more, ends the calls that still wait for a reply,
// whether their callers left (their late funcs get the error, and should
// do nothing more once Closed reports true) or still wait (they return the
// Group's closed error at once, and late gets the error as if they had
// left: such a call may still run, and the primitive's lease ends what it
// did), gives work under Bounded a second to finish, and waits for every
// goroutine of the group. A server that stopped answering cannot hold it
// up.
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

// afterLeft makes cancel run when g closes, from now on: a call its caller
// left is then given up. It returns the function that undoes that.
func (g *Group) afterLeft(cancel context.CancelFunc) (stop func() bool) {
	if g == nil {
		return func() bool { return false }
	}
	return context.AfterFunc(g.ctx, cancel)
}
