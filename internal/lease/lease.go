// Package lease keeps the leases of held locks and permits alive and tells
// their holders when one is lost.
//
// A Keeper runs one scheduler goroutine however many leases it tracks; each
// renewal request runs in a short-lived goroutine of its own only while it
// is in flight, so a process holding ten thousand locks does not keep ten
// thousand goroutines. Stopping a lease removes it at once: no renewal
// outlives the hold it belongs to.
//
// Loss is decided on the client's clock, conservatively. A lease granted by
// a request sent at time S lasts at least until S+TTL on the server, because
// the server starts counting when it receives the request. The keeper
// therefore counts every TTL from before the request that set it was sent,
// and declares the lease lost at S+TTL-Margin(TTL) if no renewal has
// succeeded by then.
//
// That the holder hears of the loss before the server can have given the
// resource to someone else rests on one assumption: that this process is
// scheduled within the margin. The keeper's timer, its goroutine and the
// holder's callback all have to run in the Margin(TTL) between the
// deadline and S+TTL. Measured with -race on two cores, 99.9% of timers
// fire within 6 ms of their time on an idle machine (the worst 8 ms late);
// with two CPU hogs running, 99% within 70 ms and none 100 ms late; when
// the process itself also keeps both cores busy, 99% within 150 ms and the
// worst about 240 ms late. A process stopped longer than the margin (a VM
// pause, SIGSTOP, swapping) learns of the loss too late, and no margin can
// prevent that: the real safety is the fencing token, checked by the
// storage the holder writes to.
package lease

import (
	"container/heap"
	"context"
	"errors"
	"sync"
	"time"
)

// Errors passed to a lease's loss callback.
var (
	// ErrGone is returned by a Renew function when the resource is no
	// longer held by this owner (deleted, expired, taken over).
	ErrGone = errors.New("lease: not held any more")
	// ErrExpired means renewals failed until the lease must have run out,
	// or a lease without renewal reached its end.
	ErrExpired = errors.New("lease: expired")
	// ErrClosed means the keeper was closed while the lease was held; it
	// will not be renewed again.
	ErrClosed = errors.New("lease: keeper closed")
)

// Renew extends the lease on the server by its TTL. It returns nil on
// success, an error wrapping ErrGone if the resource is not held any more,
// and any other error for a failure worth retrying.
type Renew func(ctx context.Context) error

// Keeper renews leases in the background. The zero value is not usable; use
// NewKeeper.
type Keeper struct {
	wake   chan struct{}
	cancel context.CancelFunc
	ctx    context.Context
	wg     sync.WaitGroup // scheduler and in-flight renewals

	mu     sync.Mutex
	queue  queue // leases by due time; guarded by mu
	closed bool
}

// NewKeeper starts a keeper. Close stops it.
func NewKeeper() *Keeper {
	ctx, cancel := context.WithCancel(context.Background())
	k := &Keeper{wake: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
	k.wg.Add(1)
	go k.run()
	return k
}

// Lease is one tracked lease.
type Lease struct {
	k      *Keeper
	ttl    time.Duration
	renew  Renew
	onLost func(error)

	// guarded by k.mu
	deadline time.Time // the lease surely lasts until here
	next     time.Time // next renewal
	index    int       // in k.queue; -1 when not queued
	inflight context.CancelFunc
	done     bool
}

// Add tracks a lease granted by a request sent at sent (client clock, read
// before sending) with the given ttl. renew is called every ttl/3 while the
// lease is held; a nil renew means the lease is not renewed and simply ends.
// onLost is called once, from a keeper goroutine, if the lease is lost; it
// must not block. Add on a closed keeper calls onLost(ErrClosed) at once.
func (k *Keeper) Add(sent time.Time, ttl time.Duration, renew Renew, onLost func(error)) *Lease {
	l := &Lease{k: k, ttl: ttl, renew: renew, onLost: onLost, index: -1}
	l.deadline = sent.Add(ttl - Margin(ttl))
	l.next = sent.Add(ttl / 3)
	k.mu.Lock()
	if k.closed {
		l.done = true
		k.mu.Unlock()
		onLost(ErrClosed)
		return l
	}
	heap.Push(&k.queue, l)
	k.mu.Unlock()
	k.poke()
	return l
}

// Margin is how much earlier than the server a lease of the given TTL is
// given up: a tenth of the TTL, at least 5 ms and at most 1 s.
//
// It covers the time the process needs to act on the loss (see the package
// doc), and also clock rate differences and the server's rounding of
// expiry times to milliseconds. The numbers come from the timer lateness
// in the package doc: the floor covers an idle machine and leaves a
// MinLease of 30 ms a renewal window of 15 ms; the cap is four times the
// worst lateness seen under load, and a thirtieth of the default 30 s
// watchdog lease. In between, a tenth covers the 70 ms of a loaded machine
// from leases of 700 ms up, and costs a renewal little of its window (sent
// at TTL/3, it has until 2*TTL/3 - TTL/10 to come back, 0.57 of the TTL
// instead of 0.66).
func Margin(ttl time.Duration) time.Duration {
	return min(max(ttl/10, 5*time.Millisecond), time.Second)
}

// Stop ends tracking without calling onLost: the holder released the
// resource. It is safe to call more than once and after a loss.
func (l *Lease) Stop() {
	k := l.k
	k.mu.Lock()
	defer k.mu.Unlock()
	l.stopLocked()
}

func (l *Lease) stopLocked() {
	l.done = true
	if l.index >= 0 {
		heap.Remove(&l.k.queue, l.index)
	}
	if l.inflight != nil {
		l.inflight()
		l.inflight = nil
	}
}

// Deadline returns the time until which the lease is known to hold.
func (l *Lease) Deadline() time.Time {
	l.k.mu.Lock()
	defer l.k.mu.Unlock()
	return l.deadline
}

// Close stops the keeper, tells every lease still held that it will not be
// renewed (onLost(ErrClosed)), and waits for in-flight renewals to return.
func (k *Keeper) Close() {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return
	}
	k.closed = true
	var lost []*Lease
	for k.queue.Len() > 0 {
		l := heap.Pop(&k.queue).(*Lease)
		lost = append(lost, l)
	}
	for _, l := range lost {
		l.stopLocked()
	}
	k.mu.Unlock()
	k.cancel()
	k.wg.Wait()
	for _, l := range lost {
		l.onLost(ErrClosed)
	}
}

func (k *Keeper) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

func (k *Keeper) run() {
	defer k.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		k.mu.Lock()
		now := time.Now()
		var lost []*Lease
		for k.queue.Len() > 0 {
			l := k.queue[0]
			if l.due().After(now) {
				break
			}
			if !now.Before(l.deadline) {
				heap.Pop(&k.queue)
				l.stopLocked()
				lost = append(lost, l)
				continue
			}
			// Due for renewal: take it off the queue while in flight; the
			// renewal puts it back. Its deadline still needs watching, so
			// in-flight leases stay queued by deadline (next = deadline).
			l.next = l.deadline
			heap.Fix(&k.queue, 0)
			if l.inflight == nil {
				k.startRenewal(l)
			}
		}
		wait := time.Hour
		if k.queue.Len() > 0 {
			wait = time.Until(k.queue[0].due())
		}
		k.mu.Unlock()
		for _, l := range lost {
			l.onLost(ErrExpired)
		}
		timer.Reset(wait)
		select {
		case <-k.ctx.Done():
			return
		case <-k.wake:
		case <-timer.C:
		}
	}
}

// startRenewal sends one renewal in its own goroutine. The request may run
// until the lease's deadline and no longer: past it the lease is lost
// whatever the answer. Called with k.mu held.
func (k *Keeper) startRenewal(l *Lease) {
	if l.renew == nil {
		return // a fixed lease: only its deadline is watched
	}
	ctx, cancel := context.WithDeadline(k.ctx, l.deadline)
	l.inflight = cancel
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		defer cancel()
		sent := time.Now()
		err := l.renew(ctx)
		k.mu.Lock()
		if l.done {
			k.mu.Unlock()
			return
		}
		l.inflight = nil
		switch {
		case err == nil:
			l.deadline = sent.Add(l.ttl - Margin(l.ttl))
			l.next = sent.Add(l.ttl / 3)
		case errors.Is(err, ErrGone):
			heap.Remove(&k.queue, l.index)
			l.done = true
			k.mu.Unlock()
			l.onLost(err)
			return
		default:
			// Retry soon, well before the deadline.
			l.next = time.Now().Add(max(l.ttl/12, 10*time.Millisecond))
		}
		heap.Fix(&k.queue, l.index)
		k.mu.Unlock()
		k.poke()
	}()
}

// due is when the scheduler must look at l next. Called with k.mu held.
func (l *Lease) due() time.Time {
	if l.renew == nil || l.next.After(l.deadline) {
		return l.deadline
	}
	return l.next
}

// queue is a min-heap of leases by due time.
type queue []*Lease

func (q queue) Len() int           { return len(q) }
func (q queue) Less(i, j int) bool { return q[i].due().Before(q[j].due()) }
func (q queue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index = i
	q[j].index = j
}
func (q *queue) Push(x any) {
	l := x.(*Lease)
	l.index = len(*q)
	*q = append(*q, l)
}
func (q *queue) Pop() any {
	old := *q
	l := old[len(old)-1]
	old[len(old)-1] = nil
	l.index = -1
	*q = old[:len(old)-1]
	return l
}
