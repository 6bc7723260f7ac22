// Package lease keeps the leases of held locks and permits alive and tells
// their holders when one is lost.
//
// A Keeper runs one scheduler goroutine however many leases it tracks; each
// renewal request runs in a short-lived goroutine of its own only while it
// is in flight, so a process holding ten thousand locks does not keep ten
// thousand goroutines. Stopping a lease removes it at once: no renewal
// outlives the hold it belongs to.
//
// Leases added to a Group are renewed together: when one of them is due,
// the keeper also takes the group's leases due within the next TTL/12 (a
// renewal a little early costs nothing) and renews up to MaxBatch of them
// with one request. A hundred thousand locks on a 3 s lease then need a few
// hundred requests a second instead of a hundred thousand, which one
// connection could not carry. Each lease in a batch still gets its own
// answer, and its deadline counts from the send of the request that
// renewed it.
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
	"fmt"
	"sync"
	"time"
)

// Errors passed to a lease's loss callback.
var (
	// ErrGone is returned by a Renew function when the resource is no
	// longer held by this owner (deleted, expired, taken over).
	ErrGone = errors.New("not held any more")
	// ErrWrongType wraps ErrGone: a renewal found a key of the resource
	// holding another type of value (an operator's SET, another program
	// sharing the key prefix), so it is not held. A batch answers it for
	// that lease alone.
	ErrWrongType = fmt.Errorf("%w: a key holds another type of value", ErrGone)
	// ErrExpired means renewals failed until the lease must have run out,
	// or a lease without renewal reached its end.
	ErrExpired = errors.New("lease expired")
	// ErrClosed means the keeper was closed while the lease was held; it
	// will not be renewed again.
	ErrClosed = errors.New("lease keeper closed")
	// ErrLate means the answer granting a lease came when, counted from
	// its request's send, the lease was already over (see Live): it is no
	// hold, and the caller gave it back.
	ErrLate = errors.New("granted, but the answer came after the lease ended")
)

// Renew extends the lease on the server by its TTL. It returns nil on
// success, an error wrapping ErrGone if the resource is not held any more,
// and any other error for a failure worth retrying.
type Renew func(ctx context.Context) error

// RenewBatch renews the leases of items (at most MaxBatch, all of one
// Group) in one request. It sets errs[i], for items[i], to nil if that
// lease was renewed, to an error wrapping ErrGone if it is not held any
// more, or to another error to retry it. A returned error means the
// request failed as a whole: every item is retried.
type RenewBatch func(ctx context.Context, items []any, errs []error) error

// MaxBatch is the most leases one RenewBatch call renews.
const MaxBatch = 512

// groupCalls is the most requests of one group in flight at once; batches
// due meanwhile wait their turn (their deadlines are still watched). A
// bound per group rather than per keeper keeps a server that stopped
// answering from holding up the groups of the other servers.
const groupCalls = 4

// Keeper renews leases in the background. The zero value is not usable; use
// NewKeeper.
type Keeper struct {
	wake   chan struct{}
	cancel context.CancelFunc
	ctx    context.Context
	wg     sync.WaitGroup // scheduler and in-flight renewals

	mu     sync.Mutex
	queue  queue      // leases without a group, by due time; guarded by mu
	groups groupQueue // groups with leases, by their first due time; guarded by mu
	closed bool
	parked []*Lease // scratch for the scheduler; guarded by mu
	// until is when the scheduler will next look at the queues by itself,
	// once looked (it has looked once). A lease due no earlier needs no
	// wake-up: a stream of short-lived leases (a lock taken and released
	// at once) then costs the scheduler goroutine nothing. Guarded by mu.
	until  mono
	looked bool
}

// Group is a set of leases one request can renew together, such as the
// locks of one Redis Cluster slot. It belongs to the Keeper that made it.
type Group struct {
	renew RenewBatch

	// guarded by k.mu
	queue   queue    // the group's leases by due time
	index   int32    // in k.groups; -1 when not queued
	calls   int      // requests in flight, at most groupCalls
	waiting []*batch // batches formed while calls was at its bound
}

// NewGroup returns a group whose leases renew calls.
func (k *Keeper) NewGroup(renew RenewBatch) *Group {
	return &Group{renew: renew, index: -1}
}

// batch is one renewal request of a group, formed or in flight.
type batch struct {
	leases []*Lease
	live   int                // leases in it not stopped; guarded by k.mu
	last   mono               // the latest deadline in it when sent
	cancel context.CancelFunc // ends the request; set while in flight, guarded by k.mu
}

// NewKeeper starts a keeper. Close stops it.
func NewKeeper() *Keeper {
	ctx, cancel := context.WithCancel(context.Background())
	k := &Keeper{wake: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
	k.wg.Add(1)
	go k.run()
	return k
}

// Lease is one tracked lease. A process may hold a million of them, so
// its times are kept as offsets on the monotonic clock (see mono) rather
// than as time.Time values, which are three times the size.
type Lease struct {
	k      *Keeper
	ttl    time.Duration
	renew  Renew
	onLost func(error) // nil: item is a Holder, told with tag

	g    *Group // nil: renewed alone by renew
	item any    // what g.renew renews for this lease; the Holder of AddHeld
	tag  uint64 // passed to the Holder with the loss

	// guarded by k.mu
	sent     mono  // when the request that set deadline was sent
	deadline mono  // the lease surely lasts until here
	next     mono  // next renewal
	index    int32 // in k.queue, or g.queue if g is set; -1 when not queued
	done     bool
	inflight context.CancelFunc
	batch    *batch // the batch renewing it, formed or in flight
}

// Holder is told of the loss of a lease added with AddHeld, with the tag
// it was added with (which hold of the holder it was). It saves a closure
// per lease over Add's onLost, which a process holding a million locks
// pays a million times.
type Holder interface {
	LeaseLost(tag uint64, err error)
}

// mono is a reading of the monotonic clock: nanoseconds since epoch.
type mono int64

// epoch is the origin of mono; it carries a monotonic clock reading, so
// times made from it (at) compare correctly with time.Now.
var epoch = time.Now()

func monoOf(t time.Time) mono { return mono(t.Sub(epoch)) }
func monoNow() mono           { return mono(time.Since(epoch)) }
func (m mono) at() time.Time  { return epoch.Add(time.Duration(m)) }

// lost tells the holder of l's loss. Called without k.mu held.
func (l *Lease) lost(err error) {
	if l.onLost != nil {
		l.onLost(err)
		return
	}
	l.item.(Holder).LeaseLost(l.tag, err)
}

// Add tracks a lease granted by a request sent at sent (client clock, read
// before sending) with the given ttl. renew is called every ttl/3 while the
// lease is held; a nil renew means the lease is not renewed and simply ends.
// onLost is called once, from a keeper goroutine, if the lease is lost; it
// must not block. Add on a closed keeper calls onLost(ErrClosed) at once.
func (k *Keeper) Add(sent time.Time, ttl time.Duration, renew Renew, onLost func(error)) *Lease {
	return k.add(&Lease{k: k, ttl: ttl, renew: renew, onLost: onLost}, sent)
}

// AddBatched is Add for a lease renewed with the others of g: g's
// RenewBatch gets item among the items of each request that renews this
// lease.
func (k *Keeper) AddBatched(sent time.Time, ttl time.Duration, g *Group, item any, onLost func(error)) *Lease {
	return k.add(&Lease{k: k, ttl: ttl, g: g, item: item, onLost: onLost}, sent)
}

// AddHeld is AddBatched (with a nil g: Add without renewal) for a holder
// h, which is told of the loss with tag instead of through a closure; h is
// also the item g's RenewBatch gets. On a closed keeper it calls
// h.LeaseLost(tag, ErrClosed) at once.
func (k *Keeper) AddHeld(sent time.Time, ttl time.Duration, g *Group, h Holder, tag uint64) *Lease {
	return k.add(&Lease{k: k, ttl: ttl, g: g, item: h, tag: tag}, sent)
}

// add queues l, granted by a request sent at sent.
func (k *Keeper) add(l *Lease, sent time.Time) *Lease {
	l.index = -1
	l.sent = monoOf(sent)
	l.deadline = monoOf(End(sent, l.ttl))
	l.next = l.sent + mono(l.ttl/3)
	k.mu.Lock()
	if k.closed {
		l.done = true
		k.mu.Unlock()
		l.lost(ErrClosed)
		return l
	}
	if g := l.g; g != nil {
		heap.Push(&g.queue, l)
		k.fixGroup(g)
	} else {
		heap.Push(&k.queue, l)
	}
	poke := k.sooner(l)
	k.mu.Unlock()
	if poke {
		k.poke()
	}
	return l
}

// sooner reports whether l is due before the scheduler's next look at the
// queues, so that it must be woken. Called with k.mu held.
func (k *Keeper) sooner(l *Lease) bool {
	return !k.looked || l.due() < k.until
}

// fixGroup puts g where its first lease's due time places it in k.groups,
// or takes it out if it has no lease. Called with k.mu held.
func (k *Keeper) fixGroup(g *Group) {
	switch {
	case g.queue.Len() == 0 && g.index >= 0:
		heap.Remove(&k.groups, int(g.index))
	case g.queue.Len() == 0:
	case g.index < 0:
		heap.Push(&k.groups, g)
	default:
		heap.Fix(&k.groups, int(g.index))
	}
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

// End is when a lease of the given TTL, granted or renewed by a request
// sent at sent (client clock, read before sending), is given up on the
// client: Margin(ttl) before sent+ttl. It is the one rule for how long a
// lease is known to hold: the keeper declares a lease lost there, and an
// acquisition whose answer arrives there or later is no hold (see Live).
func End(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - Margin(ttl))
}

// Live reports whether a lease of the given TTL granted by a request sent
// at sent still holds at now, by the rule of End. An answer granting a
// lease that is no longer live when it arrives is not a hold: the server
// may have ended the lease and let someone else in while the answer was on
// its way. The caller must give such a grant back (release exactly that
// acquisition) and report ErrLate or try again.
func Live(sent time.Time, ttl time.Duration, now time.Time) bool {
	return now.Before(End(sent, ttl))
}

// Live reports whether the lease still holds at now: it has not been
// stopped or declared lost, and now is before its deadline. A nested
// acquisition, which leaves the lease alone on the server, joins the hold
// only if its answer comes while the hold is live.
func (l *Lease) Live(now time.Time) bool {
	l.k.mu.Lock()
	defer l.k.mu.Unlock()
	return !l.done && monoOf(now) < l.deadline
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
		if l.g != nil {
			heap.Remove(&l.g.queue, int(l.index))
			l.k.fixGroup(l.g)
		} else {
			heap.Remove(&l.k.queue, int(l.index))
		}
	}
	if l.inflight != nil {
		l.inflight()
		l.inflight = nil
	}
	if b := l.batch; b != nil {
		// The request goes on for the others; its answer for l is
		// ignored. Once nobody in it is left, it is not worth waiting for.
		l.batch = nil
		if b.live--; b.live == 0 && b.cancel != nil {
			b.cancel()
		}
	}
}

// Sent returns when the request that last set the lease (the one that
// granted it, or its latest successful renewal) was sent.
func (l *Lease) Sent() time.Time {
	l.k.mu.Lock()
	defer l.k.mu.Unlock()
	return l.sent.at()
}

// Deadline returns the time until which the lease is known to hold.
func (l *Lease) Deadline() time.Time {
	l.k.mu.Lock()
	defer l.k.mu.Unlock()
	return l.deadline.at()
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
	for k.groups.Len() > 0 {
		g := heap.Pop(&k.groups).(*Group)
		for g.queue.Len() > 0 {
			lost = append(lost, heap.Pop(&g.queue).(*Lease))
		}
	}
	for _, l := range lost {
		l.stopLocked()
	}
	k.mu.Unlock()
	k.cancel()
	k.wg.Wait()
	for _, l := range lost {
		l.lost(ErrClosed)
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
		now := monoNow()
		var lost []*Lease
		for k.queue.Len() > 0 {
			l := k.queue[0]
			if l.due() > now {
				break
			}
			if now >= l.deadline {
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
		for k.groups.Len() > 0 && k.groups[0].queue[0].due() <= now {
			lost = k.collect(k.groups[0], now, lost)
		}
		until := now + mono(time.Hour)
		if k.queue.Len() > 0 && k.queue[0].due() < until {
			until = k.queue[0].due()
		}
		if k.groups.Len() > 0 && k.groups[0].queue[0].due() < until {
			until = k.groups[0].queue[0].due()
		}
		k.until, k.looked = until, true
		k.mu.Unlock()
		for _, l := range lost {
			l.lost(ErrExpired)
		}
		// Measured after the callbacks: time they took must not be
		// waited again, or a loss due meanwhile is reported that late.
		timer.Reset(time.Duration(until - monoNow()))
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
	ctx, cancel := k.callUntil(l.deadline)
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
			l.renewed(sent)
		case errors.Is(err, ErrGone):
			heap.Remove(&k.queue, int(l.index))
			l.done = true
			k.mu.Unlock()
			l.lost(err)
			return
		default:
			l.retry(monoNow())
		}
		heap.Fix(&k.queue, int(l.index))
		k.mu.Unlock()
		k.poke()
	}()
}

// callUntil returns the context of a renewal request that may run until
// t: it ends then, or when the keeper closes. It has no deadline on
// purpose: a call with one may run in its caller's goroutine and notice a
// cancellation only when its reply comes or its deadline passes (rueidis's
// lone call, see scriptcache.New; go-redis with ContextTimeoutEnabled),
// so Close, which waits for the renewals, would wait for a server that
// stopped answering.
func (k *Keeper) callUntil(t mono) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(k.ctx)
	timer := time.AfterFunc(time.Duration(t-monoNow()), cancel)
	return ctx, func() {
		timer.Stop()
		cancel()
	}
}

// collect handles g's leases that are due at now: it declares lost those
// past their deadline (appending them to lost, which it returns) and puts
// the others, with the group's leases due within their TTL/12 after now,
// into batches of at most MaxBatch and sends them. Leases in a batch stay
// queued by their deadline, like a lease renewed alone. Called with k.mu
// held and g's first lease due.
func (k *Keeper) collect(g *Group, now mono, lost []*Lease) []*Lease {
	var b *batch
	parked := k.parked[:0] // taken off the queue, to go back on it
	for g.queue.Len() > 0 {
		l := g.queue[0]
		if due := l.due(); due > now {
			// Not due yet: renewed early if a batch is going anyway and
			// its turn is near.
			if b == nil || l.batch != nil || due > now+mono(l.ttl/12) {
				break
			}
		}
		heap.Pop(&g.queue)
		if now >= l.deadline {
			l.stopLocked()
			lost = append(lost, l)
			continue
		}
		parked = append(parked, l)
		if l.batch != nil {
			continue // in flight, queued by its deadline, which is near
		}
		if b == nil {
			b = &batch{leases: make([]*Lease, 0, min(g.queue.Len()+1, MaxBatch))}
		}
		l.next = l.deadline
		l.batch = b
		b.leases = append(b.leases, l)
		b.live++
		if len(b.leases) == MaxBatch {
			k.send(g, b)
			b = &batch{leases: make([]*Lease, 0, min(g.queue.Len()+1, MaxBatch))}
		}
	}
	if b != nil && len(b.leases) > 0 {
		k.send(g, b)
	}
	for i, l := range parked {
		heap.Push(&g.queue, l)
		parked[i] = nil
	}
	k.parked = parked[:0]
	k.fixGroup(g)
	return lost
}

// send starts a request for b, or queues b behind the group's requests in
// flight. Called with k.mu held.
func (k *Keeper) send(g *Group, b *batch) {
	if g.calls == groupCalls {
		g.waiting = append(g.waiting, b)
		return
	}
	g.calls++
	k.wg.Add(1)
	go k.renewBatches(g, b)
}

// renewBatches sends b, then the group's batches that wait, one at a time,
// until none is left.
func (k *Keeper) renewBatches(g *Group, b *batch) {
	defer k.wg.Done()
	var items []any
	var errs []error
	for b != nil {
		k.mu.Lock()
		items, errs = b.prepare(items[:0], errs[:0])
		if len(items) > 0 {
			// Past the last deadline in b every lease in it is lost
			// whatever the answer.
			ctx, cancel := k.callUntil(b.last)
			b.cancel = cancel
			k.mu.Unlock()
			k.renewBatch(ctx, g, b, items, errs)
			cancel()
		} else {
			k.mu.Unlock()
		}
		clear(items)
		k.mu.Lock()
		b = nil
		if len(g.waiting) > 0 {
			b = g.waiting[0]
			g.waiting[0] = nil
			g.waiting = g.waiting[1:]
		} else {
			g.calls--
		}
		k.mu.Unlock()
	}
}

// prepare drops from b the leases stopped or lost since it was formed,
// appends the items of the others, and a nil error each, to items and errs,
// and sets b.last. Called with k.mu held.
func (b *batch) prepare(items []any, errs []error) ([]any, []error) {
	live := b.leases[:0]
	b.last = 0
	for _, l := range b.leases {
		if l.done || l.batch != b {
			continue
		}
		live = append(live, l)
		items = append(items, l.item)
		errs = append(errs, nil)
		if l.deadline > b.last {
			b.last = l.deadline
		}
	}
	clear(b.leases[len(live):])
	b.leases = live
	return items, errs
}

// renewBatch sends one request for the leases of b and applies each one's
// answer. Each deadline counts from before the request was sent.
func (k *Keeper) renewBatch(ctx context.Context, g *Group, b *batch, items []any, errs []error) {
	sent := time.Now()
	if err := g.renew(ctx, items, errs); err != nil {
		for i := range errs {
			errs[i] = err
		}
	}
	var gone []int
	k.mu.Lock()
	now := monoNow()
	for i, l := range b.leases {
		if l.done || l.batch != b {
			continue // stopped or lost meanwhile: its answer does not count
		}
		l.batch = nil
		switch err := errs[i]; {
		case err == nil:
			l.renewed(sent)
		case errors.Is(err, ErrGone):
			l.stopLocked()
			gone = append(gone, i)
			continue
		default:
			l.retry(now)
		}
		heap.Fix(&g.queue, int(l.index))
	}
	k.fixGroup(g)
	k.mu.Unlock()
	for _, i := range gone {
		b.leases[i].lost(errs[i])
	}
	k.poke()
}

// renewed records a renewal of l by a request sent at sent. Called with
// k.mu held.
func (l *Lease) renewed(sent time.Time) {
	l.sent = monoOf(sent)
	l.deadline = monoOf(End(sent, l.ttl))
	l.next = l.sent + mono(l.ttl/3)
}

// retry schedules l's next renewal soon after a failed one (at now), well
// before the deadline. Called with k.mu held.
func (l *Lease) retry(now mono) {
	l.next = now + mono(max(l.ttl/12, 10*time.Millisecond))
}

// due is when the scheduler must look at l next. Called with k.mu held.
func (l *Lease) due() mono {
	if l.renew == nil && l.g == nil || l.next > l.deadline {
		return l.deadline
	}
	return l.next
}

// queue is a min-heap of leases by due time.
type queue []*Lease

func (q queue) Len() int           { return len(q) }
func (q queue) Less(i, j int) bool { return q[i].due() < q[j].due() }
func (q queue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index = int32(i)
	q[j].index = int32(j)
}
func (q *queue) Push(x any) {
	l := x.(*Lease)
	l.index = int32(len(*q))
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

// groupQueue is a min-heap of groups by their first lease's due time.
type groupQueue []*Group

func (q groupQueue) Len() int           { return len(q) }
func (q groupQueue) Less(i, j int) bool { return q[i].queue[0].due() < q[j].queue[0].due() }
func (q groupQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index = int32(i)
	q[j].index = int32(j)
}
func (q *groupQueue) Push(x any) {
	g := x.(*Group)
	g.index = int32(len(*q))
	*q = append(*q, g)
}
func (q *groupQueue) Pop() any {
	old := *q
	g := old[len(old)-1]
	old[len(old)-1] = nil
	g.index = -1
	*q = old[:len(old)-1]
	return g
}
