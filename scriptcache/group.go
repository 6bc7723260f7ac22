package scriptcache

import (
	"context"
	"sync"
)

// Group owns the goroutines a primitive starts for work its callers do not
// wait for: the calls of ExecOrLate and ExecWaitOrLate whose callers leave
// before the reply, and give-backs sent in the background. The primitive's
// Close calls Group.Close, so that none of them outlives it.
type Group struct {
	ctx    context.Context // ended by Close
	cancel context.CancelFunc
	mu     sync.Mutex
	closed bool // guarded by mu
	wg     sync.WaitGroup
}

// NewGroup returns an open Group.
func NewGroup() *Group {
	ctx, cancel := context.WithCancel(context.Background())
	return &Group{ctx: ctx, cancel: cancel}
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

// Closed reports whether Close has been called.
func (g *Group) Closed() bool { return g.ctx.Err() != nil }

// Close starts nothing more, ends the calls that their callers left and
// that still wait for a reply (their late funcs get the error, and should
// do nothing more once Closed reports true), and waits for every goroutine
// of the group.
func (g *Group) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.cancel()
	g.wg.Wait()
}

// afterLeft makes cancel run when g closes, from now on: a call its caller
// left is then given up. It returns the function that undoes that.
func (g *Group) afterLeft(cancel context.CancelFunc) (stop func() bool) {
	if g == nil {
		return func() bool { return false }
	}
	return context.AfterFunc(g.ctx, cancel)
}
