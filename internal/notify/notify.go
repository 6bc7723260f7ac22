// Package notify wakes local waiters when a Redis script publishes that a
// lock or permits were released.
//
// A Hub keeps one Redis subscription per channel for the whole process,
// shared by every local waiter of that channel, with one goroutine per
// subscribed channel that ends when the last waiter has gone (after a short
// linger, so a busy hand-off does not subscribe and unsubscribe on every
// acquisition) or when the Hub is closed.
//
// Messages carry a budget: how many units are free (1 for a mutex, the
// permits now free for a semaphore). The hub wakes, in arrival order, the
// waiters whose weights fit in what is left of the budget, skipping heavier
// ones, so a release does not stampede every local waiter into Redis and a
// small release is not spent on a waiter too heavy to use it. Only when no
// waiter fits is the first one woken anyway (the budget is a hint). A woken
// waiter that cannot use its wake-up passes it on: one that leaves
// (Leave, Close), and one whose attempt failed while some units were free
// (PassOn). This is not a fair queue: a heavy waiter can be overtaken by
// lighter ones that fit first.
//
// A message "g ID PAYLOAD" is a grant: the releasing script handed the
// resource to the queued waiter ID directly (a fair lock). It goes to the
// local waiter registered with that id (SubscribeID), if any, with PAYLOAD,
// and to nobody else.
//
// Wake-ups are hints, never the only way forward: messages can be lost when
// the pub/sub connection drops, so waiters also wait no longer than the
// resource's remaining lease. After a subscription is re-established every
// waiter of the channel is woken to try again, since a release published
// while it was down was missed.
//
// Connection failures are retried with backoff and never reported to
// waiters, which keep relying on their timeouts meanwhile; a hub made with
// NewObserved tells its observer about drops, resubscriptions and refusals. An error reply to the SUBSCRIBE
// itself (an ACL user without access to the channel gets NOPERM; Redis 7
// users default to resetchannels) is not retried: Ready and Wait of every
// waiter of that channel return an error wrapping ErrSubscribe and the
// Redis error, since otherwise each wait would silently last a whole lease.
// The refused channel is forgotten, so a later Subscribe tries again.
package notify

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicekit/sluice/scriptcache"
)

// Errors of this package; check them with errors.Is.
var (
	// ErrClosed is returned by Subscribe, Ready and Wait once the hub is
	// closed.
	ErrClosed = errors.New("pub/sub hub closed")
	// ErrSubscribe is wrapped, with the Redis error, by the error Ready and
	// Wait return when Redis refused the subscription (NOPERM and the like).
	ErrSubscribe = errors.New("pub/sub subscription refused")
)

// DefaultLinger is how long a subscription is kept after its last waiter
// leaves.
const DefaultLinger = 2 * time.Second

// Hub shares subscriptions between local waiters.
type Hub struct {
	client  scriptcache.Client
	sharded bool
	linger  time.Duration
	obs     scriptcache.Observer // nil: nothing reported
	prim    string               // Event.Primitive of what obs is told
	refusal error                // wrapped by a refusal's error, if not nil
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup // subscription goroutines

	mu     sync.Mutex
	chans  map[string]*channel // guarded by mu
	closed bool
}

// channel is one subscription. Its fields are guarded by Hub.mu, except
// err, which is written once before failed is closed and read after.
type channel struct {
	name    string
	waiters list.List // of *Waiter, arrival order
	cancel  context.CancelFunc
	ready   chan struct{} // closed when first confirmed
	ok      bool          // confirmed at least once
	failed  chan struct{} // closed when Redis refused the subscription
	err     error         // why, wrapping ErrSubscribe
	linger  *time.Timer
	byID    map[string]*Waiter // waiters registered with an id
}

// New returns a hub that subscribes through client; sharded selects
// SSUBSCRIBE (Redis 7 cluster) over SUBSCRIBE.
func New(client scriptcache.Client, sharded bool) *Hub {
	return NewObserved(client, sharded, nil, "", nil)
}

// NewObserved is New with an observer told about refused, dropped and
// re-established subscriptions (EventSubscription), with primitive as
// their Event.Primitive; obs may be nil. A refusal's error wraps refusal
// too when it is not nil: the sentinel the primitive's package documents
// (mutex.ErrSubscribe), so that its users need no internal name.
func NewObserved(client scriptcache.Client, sharded bool, obs scriptcache.Observer, primitive string, refusal error) *Hub {
	ctx, cancel := context.WithCancel(context.Background())
	return &Hub{client: client, sharded: sharded, linger: DefaultLinger, obs: obs, prim: primitive, refusal: refusal, ctx: ctx, cancel: cancel, chans: make(map[string]*channel)}
}

// refusedError is why a subscription failed: the package's sentinel (or
// ErrSubscribe), the channel, and Redis's error; errors.Is finds all three
// and ErrSubscribe.
type refusedError struct {
	sentinel error
	channel  string
	err      error
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("%v: %s: %v", e.sentinel, e.channel, e.err)
}

func (e *refusedError) Unwrap() []error { return []error{e.sentinel, ErrSubscribe, e.err} }

// report tells the observer, if any, about the subscription of channel.
func (h *Hub) report(channel, reason string, err error) {
	if h.obs != nil {
		h.obs.Observe(scriptcache.Event{Kind: scriptcache.EventSubscription, Primitive: h.prim, Name: channel, Reason: reason, Err: err})
	}
}

// Waiter is one local waiter on a channel.
type Waiter struct {
	h      *Hub
	ch     *channel
	elem   *list.Element
	weight int64
	c      chan struct{} // holds at most one wake-up
	woken  atomic.Bool   // the last Wait returned because of a wake-up
	id     string        // grants addressed to it; "" for none
	grant  string        // payload of a grant received; guarded by Hub.mu
	got    bool          // a grant was received; guarded by Hub.mu
	early  bool          // Ready gave up before the subscription was confirmed; guarded by Hub.mu
}

// Subscribe registers a waiter of the given weight on channel, subscribing
// the process to it if no other local waiter has. It does not wait for the
// subscription: see Ready. The waiter must be closed.
func (h *Hub) Subscribe(channelName string, weight int64) (*Waiter, error) {
	return h.SubscribeID(channelName, weight, "")
}

// SubscribeID is Subscribe for a waiter that can also receive grants
// addressed to id (see Granted). Ids must be unique per channel.
func (h *Hub) SubscribeID(channelName string, weight int64, id string) (*Waiter, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	ch := h.chans[channelName]
	if ch == nil {
		ch = &channel{name: channelName, ready: make(chan struct{}), failed: make(chan struct{})}
		ctx, cancel := context.WithCancel(h.ctx)
		ch.cancel = cancel
		h.chans[channelName] = ch
		h.wg.Add(1)
		go h.run(ctx, ch)
	}
	if ch.linger != nil {
		ch.linger.Stop()
		ch.linger = nil
	}
	w := &Waiter{h: h, ch: ch, weight: max(weight, 1), c: make(chan struct{}, 1)}
	w.elem = ch.waiters.PushBack(w)
	ch.setID(w, id)
	return w, nil
}

// setID registers w for grants addressed to id ("": none), in place of
// the id it had. Called with Hub.mu held.
func (ch *channel) setID(w *Waiter, id string) {
	ch.dropID(w)
	w.id = id
	if id == "" {
		return
	}
	if ch.byID == nil {
		ch.byID = make(map[string]*Waiter)
	}
	ch.byID[id] = w
}

// dropID ends w's registration for grants. Called with Hub.mu held.
func (ch *channel) dropID(w *Waiter) {
	if w.id != "" && ch.byID[w.id] == w {
		delete(ch.byID, w.id)
	}
}

// Subscribed reports whether the hub has a subscription of channel that
// Redis has confirmed (it is kept while local waiters use it, and for a
// short linger after). A caller can use it to register a waiter before its
// first attempt only when that costs no new subscription.
func (h *Hub) Subscribed(channelName string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.chans[channelName]
	return ch != nil && ch.ok
}

// Confirmed reports whether the waiter's subscription has been confirmed
// by Redis. A waiter confirmed before an attempt is sent misses nothing
// published after that attempt ran: a message reaches it, or, if the
// connection dropped in between, the wake-up that follows the
// resubscription does. So it needs no second attempt after Ready.
func (w *Waiter) Confirmed() bool {
	select {
	case <-w.ch.ready:
		return true
	default:
		return false
	}
}

// Granted returns the payload of a grant addressed to the waiter, if one
// arrived.
func (w *Waiter) Granted() (string, bool) {
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	return w.grant, w.got
}

// TakeGrant is Granted, and forgets the grant it returns: a caller that
// acts on a grant once (starts a hold with its token, or gives it back)
// must not find it again at its next wake-up, when the grant may long
// have been superseded.
func (w *Waiter) TakeGrant() (string, bool) {
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	grant, got := w.grant, w.got
	w.grant, w.got = "", false
	return grant, got
}

// SetID makes the waiter receive grants addressed to id instead of the id
// it had. Ids must be unique per channel.
func (w *Waiter) SetID(id string) {
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	if w.elem == nil { // closed: registered no more
		w.id = id
		return
	}
	w.ch.setID(w, id)
}

// Wake wakes the waiter as a message would, for a reason learnt outside
// the channel (its queue entry is gone, say). Like a message, it is kept
// until the waiter's next Wait if the waiter is not waiting now.
func (w *Waiter) Wake() {
	select {
	case w.c <- struct{}{}:
	default:
	}
}

// WakeOne wakes the waiters of channelName as a release's message of
// budget 1 would, if the process has any: for a hold of this process that
// ended without a release, which publishes nothing (its lease ran out). A
// waiter's timer covers the lease it saw at its last attempt, which may be
// an earlier holder's.
func (h *Hub) WakeOne(channelName string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ch := h.chans[channelName]; ch != nil && !h.closed {
		h.wakeLocked(ch, 1)
	}
}

// Ready waits until the channel's subscription is confirmed by Redis, so no
// message published after Ready returns nil can be missed, or until timeout
// passes (nil too). It returns ctx.Err() if ctx ends first, ErrClosed at
// once if the hub is closed, and an error wrapping ErrSubscribe if Redis
// refused the subscription.
//
// A waiter whose timeout passed first is woken when the confirmation comes:
// its caller has tried again meanwhile and waits for a message, but what
// was published between that attempt and the confirmation never reaches
// the process, and the caller's next timeout (a lease, say) may be long.
func (w *Waiter) Ready(ctx context.Context, timeout time.Duration) error {
	if err := w.stopped(); err != nil {
		return err
	}
	select {
	case <-w.ch.ready:
		return nil
	default:
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.ch.ready:
		return w.stopped()
	case <-t.C:
		w.h.mu.Lock()
		w.early = !w.ch.ok
		w.h.mu.Unlock()
		return w.stopped()
	case <-ctx.Done():
		return ctx.Err()
	case <-w.h.ctx.Done():
		return ErrClosed
	case <-w.ch.failed:
		return w.ch.err
	}
}

// Wait blocks until the waiter is woken or timeout passes (nil in both
// cases). It returns ctx.Err() if ctx ends first, ErrClosed at once if the
// hub is closed, and an error wrapping ErrSubscribe if Redis refused the
// subscription.
func (w *Waiter) Wait(ctx context.Context, timeout time.Duration) error {
	w.woken.Store(false)
	if err := w.stopped(); err != nil {
		return err
	}
	select {
	case <-w.c:
		w.woken.Store(true)
		return nil
	default:
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.c:
		w.woken.Store(true)
		return w.stopped()
	case <-t.C:
		return w.stopped()
	case <-ctx.Done():
		return ctx.Err()
	case <-w.h.ctx.Done():
		return ErrClosed
	case <-w.ch.failed:
		return w.ch.err
	}
}

// Woken reports whether the waiter's last Wait returned because the waiter
// was woken (a message, Wake, a wake-up passed on), not because its timeout
// passed.
func (w *Waiter) Woken() bool { return w.woken.Load() }

// stopped returns why the waiter can wait no more (the hub is closed, the
// subscription was refused), or nil.
func (w *Waiter) stopped() error {
	select {
	case <-w.h.ctx.Done():
		return ErrClosed
	case <-w.ch.failed:
		return w.ch.err
	default:
		return nil
	}
}

// PassOn tells the hub that the waiter's attempt after its last wake-up
// failed although free units remained, fewer than its weight (another
// process took some first). They are offered to the waiters behind it that
// fit in free, which the wake-up skipped because this waiter counted
// against the budget. It does nothing if the last Wait was not a wake-up.
// Unlike a message, it never wakes a waiter heavier than free, so waiters
// cannot pass a wake-up back and forth.
func (w *Waiter) PassOn(free int64) {
	if free < 1 || !w.woken.Load() {
		return
	}
	h := w.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.elem != nil {
		h.wakeFitLocked(w.ch, free)
	}
}

// Leave unregisters a waiter that gives up without acquiring (its context
// ended, or an attempt failed). If its last Wait was a wake-up it could not
// use, the wake-up is passed to the next waiter, which would otherwise
// sleep until its timeout although the resource may be free.
func (w *Waiter) Leave() {
	if w.woken.Load() {
		select {
		case w.c <- struct{}{}: // Close passes a pending wake-up on
		default:
		}
	}
	w.Close()
}

// Close unregisters a waiter, normally one that acquired. A wake-up it
// received but did not take is passed to the next waiter; the last waiter
// out starts the linger timer that ends the subscription.
func (w *Waiter) Close() {
	h := w.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.elem == nil {
		return
	}
	ch := w.ch
	ch.waiters.Remove(w.elem)
	w.elem = nil
	ch.dropID(w)
	select {
	case <-w.c:
		h.wakeLocked(ch, w.weight)
	default:
	}
	if ch.waiters.Len() == 0 && !h.closed && ch.linger == nil && h.chans[ch.name] == ch {
		ch.linger = time.AfterFunc(h.linger, func() { h.unsubscribeIdle(ch) })
	}
}

// unsubscribeIdle ends the subscription of ch if it still has no waiter.
func (h *Hub) unsubscribeIdle(ch *channel) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || ch.waiters.Len() > 0 || h.chans[ch.name] != ch {
		return
	}
	delete(h.chans, ch.name)
	ch.cancel()
}

// Close ends every subscription and waits for their goroutines. Waiters
// blocked in Ready or Wait return ErrClosed at once.
func (h *Hub) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	for _, ch := range h.chans {
		if ch.linger != nil {
			ch.linger.Stop()
		}
	}
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
}

// wakeLocked spends budget (a message, or a wake-up passed on by a waiter
// that left) on the waiters that fit in it. If none fits, the first waiter
// is woken anyway: the budget is a hint, and it tries and finds out.
func (h *Hub) wakeLocked(ch *channel, budget int64) {
	if !h.wakeFitLocked(ch, budget) {
		if e := ch.waiters.Front(); e != nil {
			select {
			case e.Value.(*Waiter).c <- struct{}{}:
			default: // already woken, not yet tried
			}
		}
	}
}

// wakeFitLocked wakes, in arrival order, the waiters whose weight fits in
// what is left of budget, skipping heavier ones so that units they could not
// use reach lighter waiters behind them. Waiters already holding a wake-up
// count against the budget too: they are about to try. It reports whether
// any waiter fitted.
func (h *Hub) wakeFitLocked(ch *channel, budget int64) bool {
	fit := false
	for e := ch.waiters.Front(); e != nil && budget > 0; e = e.Next() {
		w := e.Value.(*Waiter)
		if w.weight > budget {
			continue
		}
		fit = true
		budget -= w.weight
		select {
		case w.c <- struct{}{}:
		default: // already woken, not yet tried
		}
	}
	return fit
}

func (h *Hub) wakeAllLocked(ch *channel) {
	for e := ch.waiters.Front(); e != nil; e = e.Next() {
		select {
		case e.Value.(*Waiter).c <- struct{}{}:
		default:
		}
	}
}

// deliver handles one published message: its payload is the budget.
func (h *Hub) deliver(ch *channel, payload string) {
	if rest, ok := strings.CutPrefix(payload, "g "); ok {
		id, grant, _ := strings.Cut(rest, " ")
		h.mu.Lock()
		defer h.mu.Unlock()
		if w := ch.byID[id]; w != nil {
			w.grant, w.got = grant, true
			select {
			case w.c <- struct{}{}:
			default:
			}
		}
		return
	}
	budget, err := strconv.ParseInt(payload, 10, 64)
	if err != nil || budget < 1 {
		budget = 1
	}
	h.mu.Lock()
	h.wakeLocked(ch, budget)
	h.mu.Unlock()
}

// confirmed runs when Redis confirms the subscription of ch.
func (h *Hub) confirmed(ch *channel) {
	h.mu.Lock()
	if !ch.ok {
		ch.ok = true
		close(ch.ready)
		// Waiters that stopped waiting for this may have missed a
		// message (see Ready): they try again.
		for e := ch.waiters.Front(); e != nil; e = e.Next() {
			if w := e.Value.(*Waiter); w.early {
				w.early = false
				w.Wake()
			}
		}
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	// Re-subscribed after the connection dropped: anything published in
	// between was missed, so every waiter tries again (told after the
	// observer).
	h.report(ch.name, scriptcache.ReasonResubscribed, nil)
	h.mu.Lock()
	h.wakeAllLocked(ch)
	h.mu.Unlock()
}

// refused records that Redis refused the subscription of ch and forgets ch,
// so a later Subscribe of that name starts over.
func (h *Hub) refused(ch *channel, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sentinel := h.refusal
	if sentinel == nil {
		sentinel = ErrSubscribe
	}
	ch.err = &refusedError{sentinel: sentinel, channel: ch.name, err: err}
	close(ch.failed)
	if ch.linger != nil {
		ch.linger.Stop()
		ch.linger = nil
	}
	if h.chans[ch.name] == ch {
		delete(h.chans, ch.name)
	}
}

// run keeps ch subscribed until ctx is cancelled, re-subscribing with
// backoff when the connection drops. It ends, reporting to the waiters of
// ch, if Redis refuses the subscription.
func (h *Hub) run(ctx context.Context, ch *channel) {
	defer h.wg.Done()
	defer ch.cancel()
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := h.client.Subscribe(ctx, ch.name, h.sharded,
			func() { h.confirmed(ch) },
			func(payload string) { h.deliver(ch, payload) })
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, scriptcache.ErrRefused) {
			h.report(ch.name, scriptcache.ReasonRefused, err) // before the waiters hear
			h.refused(ch, err)
			return
		}
		h.report(ch.name, scriptcache.ReasonDropped, err)
		if time.Since(start) > time.Second {
			backoff = 10 * time.Millisecond
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, time.Second)
	}
}
