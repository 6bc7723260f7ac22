// Package notify wakes local waiters when a Redis script publishes that a
// lock or permits were released.
//
// A Hub keeps one Redis subscription per channel for the whole process,
// shared by every local waiter of that channel, with one goroutine per
// subscribed channel that ends when the last waiter has gone (after a short
// linger, so a busy hand-off does not subscribe and unsubscribe on every
// acquisition) or when the Hub is closed.
//
// Messages carry a budget: how many units were freed (1 for a mutex, the
// permits now free for a semaphore). The hub wakes waiters in arrival order
// while their weights fit in the budget, so a release does not stampede every
// local waiter into Redis. A woken waiter that leaves without taking its turn
// passes the wake-up on.
//
// Wake-ups are hints, never the only way forward: messages can be lost when
// the pub/sub connection drops, so waiters also wait no longer than the
// resource's remaining lease. After a subscription is re-established every
// waiter of the channel is woken to try again, since a release published
// while it was down was missed.
package notify

import (
	"container/list"
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// ErrClosed is returned by Subscribe on a closed hub.
var ErrClosed = errors.New("notify: hub closed")

// DefaultLinger is how long a subscription is kept after its last waiter
// leaves.
const DefaultLinger = 2 * time.Second

// Hub shares subscriptions between local waiters.
type Hub struct {
	client  rueidis.Client
	sharded bool
	linger  time.Duration
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup // subscription goroutines

	mu     sync.Mutex
	chans  map[string]*channel // guarded by mu
	closed bool
}

type channel struct {
	name    string
	waiters list.List // of *Waiter, arrival order
	cancel  context.CancelFunc
	ready   chan struct{} // closed when first confirmed
	ok      bool          // confirmed at least once
	linger  *time.Timer
}

// New returns a hub that subscribes through client; sharded selects
// SSUBSCRIBE (Redis 7 cluster) over SUBSCRIBE.
func New(client rueidis.Client, sharded bool) *Hub {
	ctx, cancel := context.WithCancel(context.Background())
	return &Hub{client: client, sharded: sharded, linger: DefaultLinger, ctx: ctx, cancel: cancel, chans: make(map[string]*channel)}
}

// Waiter is one local waiter on a channel.
type Waiter struct {
	h      *Hub
	ch     *channel
	elem   *list.Element
	weight int64
	c      chan struct{} // holds at most one wake-up
	woken  atomic.Bool   // the last Wait returned because of a wake-up
}

// Subscribe registers a waiter of the given weight on channel, subscribing
// the process to it if no other local waiter has. It does not wait for the
// subscription: see Ready. The waiter must be closed.
func (h *Hub) Subscribe(channelName string, weight int64) (*Waiter, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	ch := h.chans[channelName]
	if ch == nil {
		ch = &channel{name: channelName, ready: make(chan struct{})}
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
	return w, nil
}

// Ready waits until the channel's subscription is confirmed by Redis, so no
// message published after Ready returns nil can be missed, or until timeout
// passes (nil too: a waiter then relies on its timeout), or ctx is done
// (ctx.Err()).
func (w *Waiter) Ready(ctx context.Context, timeout time.Duration) error {
	select {
	case <-w.ch.ready:
		return nil
	default:
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.ch.ready:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Wait blocks until the waiter is woken, timeout passes (nil in both cases)
// or ctx is done (ctx.Err()).
func (w *Waiter) Wait(ctx context.Context, timeout time.Duration) error {
	select {
	case <-w.c:
		w.woken.Store(true)
		return nil
	default:
	}
	w.woken.Store(false)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-w.c:
		w.woken.Store(true)
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
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
	select {
	case <-w.c:
		h.wakeLocked(ch, w.weight)
	default:
	}
	if ch.waiters.Len() == 0 && !h.closed && ch.linger == nil {
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
// still registered are woken so they notice and stop.
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
		h.wakeAllLocked(ch)
	}
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
}

// wakeLocked wakes waiters in arrival order while their weights fit in
// budget. Waiters already holding a wake-up count against the budget: they
// are about to try. At least one waiter is woken if any is idle.
func (h *Hub) wakeLocked(ch *channel, budget int64) {
	woke := false
	for e := ch.waiters.Front(); e != nil && budget > 0; e = e.Next() {
		w := e.Value.(*Waiter)
		if w.weight > budget && woke {
			break
		}
		budget -= w.weight
		select {
		case w.c <- struct{}{}:
			woke = true
		default: // already woken, not yet tried
		}
	}
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
	defer h.mu.Unlock()
	if !ch.ok {
		ch.ok = true
		close(ch.ready)
		return
	}
	// Re-subscribed after the connection dropped: anything published in
	// between was missed, so every waiter tries again.
	h.wakeAllLocked(ch)
}

// run keeps ch subscribed until ctx is cancelled, re-subscribing with
// backoff when the connection drops.
func (h *Hub) run(ctx context.Context, ch *channel) {
	defer h.wg.Done()
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		rctx := rueidis.WithOnSubscriptionHook(ctx, func(s rueidis.PubSubSubscription) {
			if s.Kind == "subscribe" || s.Kind == "ssubscribe" {
				h.confirmed(ch)
			}
		})
		// Receive leaves the server-side subscription in place when its
		// context ends; unsubscribe on the same connection so a process
		// that waited on many names does not stay subscribed to all.
		rctx = rueidis.WithOnReceiveReturnHook(rctx, func(err error, cc rueidis.CommandClient) error {
			if ctx.Err() != nil {
				uctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				if h.sharded {
					cc.Do(uctx, cc.B().Sunsubscribe().Channel(ch.name).Build())
				} else {
					cc.Do(uctx, cc.B().Unsubscribe().Channel(ch.name).Build())
				}
			}
			return err
		})
		var sub rueidis.Completed
		if h.sharded {
			sub = h.client.B().Ssubscribe().Channel(ch.name).Build()
		} else {
			sub = h.client.B().Subscribe().Channel(ch.name).Build()
		}
		start := time.Now()
		h.client.Receive(rctx, sub, func(m rueidis.PubSubMessage) { h.deliver(ch, m.Message) })
		if ctx.Err() != nil {
			return
		}
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
