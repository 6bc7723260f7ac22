package lease

import (
	"sync/atomic"
	"time"
)

// Entry is a lease on something a waiter keeps on the server rather than a
// resource it holds, such as its entry in a fair queue. The keeper
// refreshes it with the other leases of its group; when a refresh finds it
// gone, or it cannot be refreshed in time, the keeper stops and calls
// wake, and the waiter must look for itself. A nil *Entry is valid and
// tracks nothing.
type Entry struct {
	l   *Lease
	out atomic.Bool // the keeper stopped refreshing it
}

// AddEntry tracks an entry written by a request sent at sent, to be
// refreshed within ttl by g's RenewBatch, which gets item among its items.
// wake is called once, from a keeper goroutine (or at once on a closed
// keeper), when the keeper stops refreshing the entry; it must not block.
func (k *Keeper) AddEntry(sent time.Time, ttl time.Duration, g *Group, item any, wake func()) *Entry {
	e := new(Entry)
	e.l = k.AddBatched(sent, ttl, g, item, func(error) {
		e.out.Store(true)
		wake()
	})
	return e
}

// Live reports whether the keeper still refreshes e: false for nil.
func (e *Entry) Live() bool { return e != nil && !e.out.Load() }

// Sent returns when the request that last wrote the entry was sent, at the
// latest: the later of attempt (the waiter's own last write of it) and the
// keeper's last refresh. For nil it is attempt.
func (e *Entry) Sent(attempt time.Time) time.Time {
	if e == nil {
		return attempt
	}
	if s := e.l.Sent(); s.After(attempt) {
		return s
	}
	return attempt
}

// Stop ends the refreshes without calling wake. It is safe on nil, more
// than once, and after the keeper stopped.
func (e *Entry) Stop() {
	if e != nil {
		e.l.Stop()
	}
}
