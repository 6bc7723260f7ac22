package semaphore

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/obs"
	"github.com/sluicekit/sluice/scriptcache"
)

// Permit is a number of permits taken by one Acquire. Its methods are safe
// for concurrent use.
type Permit struct {
	s       *Semaphore
	id      string
	weight  int64
	lost    chan struct{} // closed on loss
	since   time.Time     // when the request that granted it was sent
	handoff bool          // a fair release granted it; set before Acquire returns

	op sync.Mutex // serializes Release

	mu        sync.Mutex // guards the fields below; never held across a call
	lse       *lease.Lease
	err       error // why the permit was lost
	released  bool  // Release got an answer
	releasing bool  // a Release is in flight: a loss waits in deferred
	deferred  error // a loss reported while Release was in flight
	// stopped: a Release has begun, so the permit is not renewed any
	// more and is not to be counted on (HeldUntil, Context).
	stopped bool
	// scoped cancels the contexts Context made, when the permit is lost
	// or a Release returns.
	scoped lease.Scopes
}

// ID returns the permit's id, as listed by Holders.
func (p *Permit) ID() string { return p.id }

// Weight returns how many permits this Permit holds.
func (p *Permit) Weight() int64 { return p.weight }

// Lost returns a channel that is closed when the permit is lost before it
// is released. Release does not close it, and once Release has returned nil
// it is never closed: a loss the watchdog reports while a Release is in
// flight counts only if that Release fails.
func (p *Permit) Lost() <-chan struct{} { return p.lost }

// Err returns why the permit was lost (wrapping ErrLost), or nil.
func (p *Permit) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// lose records the loss of the permit; called by the lease keeper.
func (p *Permit) lose(cause error) {
	if errors.Is(cause, lease.ErrClosed) {
		cause = fmt.Errorf("%w: %w", ErrClosed, inner(cause))
	}
	err := fmt.Errorf("%w: %q: %w", ErrLost, p.s.name, inner(cause))
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.releasing {
		if p.deferred == nil {
			p.deferred = err
		}
		return
	}
	p.loseLocked(err)
}

// loseLocked records the loss err (wrapping ErrLost) unless the permit was
// released or already lost. Called with p.mu held.
func (p *Permit) loseLocked(err error) {
	if p.released || p.err != nil {
		return
	}
	p.err = err
	if o := p.s.m.obs; o != nil { // before the holder is told
		o.Observe(scriptcache.Event{Kind: scriptcache.EventLost, Primitive: scriptcache.PrimitiveSemaphore, Name: p.s.event, Hold: time.Since(p.since), Weight: p.weight,
			Reason: obs.LossReason(err), Err: err})
	}
	close(p.lost)
	p.scoped.End(err)
}
