package notify

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

func TestMain(m *testing.M) { redistest.Main(m) }

const signalWait = 5 * time.Second // a wake-up that should come; generous for a loaded machine

func woken(t *testing.T, w *Waiter) {
	t.Helper()
	select {
	case <-w.c:
	case <-time.After(signalWait):
		t.Fatal("waiter not woken")
	}
}

func notWoken(t *testing.T, w *Waiter) {
	t.Helper()
	select {
	case <-w.c:
		t.Fatal("waiter woken, want not")
	default:
	}
}

func ready(t *testing.T, ws ...*Waiter) {
	t.Helper()
	for _, w := range ws {
		select {
		case <-w.ch.ready:
		case <-time.After(signalWait):
			t.Fatal("subscription not confirmed")
		}
	}
}

type setup struct {
	name    string
	hub     func(t *testing.T) *Hub
	publish func(t *testing.T, channel, msg string)
}

func setups() []setup {
	return []setup{
		{
			name: "single",
			hub: func(t *testing.T) *Hub {
				h := New(hubClient(t, redistest.Client(t, redistest.Single(t).Addr())), false)
				t.Cleanup(h.Close)
				return h
			},
			publish: func(t *testing.T, channel, msg string) {
				if _, err := redistest.Single(t).Do("PUBLISH", channel, msg); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "cluster-sharded",
			hub: func(t *testing.T) *Hub {
				h := New(hubClient(t, redistest.Client(t, redistest.SharedCluster(t).Addrs()...)), true)
				t.Cleanup(h.Close)
				return h
			},
			publish: func(t *testing.T, channel, msg string) {
				c := redistest.Client(t, redistest.SharedCluster(t).Addrs()...)
				if err := c.Do(context.Background(), c.B().Spublish().Channel(channel).Message(msg).Build()).Error(); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
}

func TestWakeOne(t *testing.T) {
	for _, s := range setups() {
		t.Run(s.name, func(t *testing.T) {
			h := s.hub(t)
			ch := "{n}:" + t.Name()
			var ws []*Waiter
			for range 3 {
				w, err := h.Subscribe(ch, 1)
				if err != nil {
					t.Fatal(err)
				}
				defer w.Close()
				ws = append(ws, w)
			}
			ready(t, ws...)
			s.publish(t, ch, "1")
			woken(t, ws[0])
			// ws[0] acquired and left; the next release goes to ws[1] only.
			ws[0].Close()
			s.publish(t, ch, "1")
			woken(t, ws[1])
			notWoken(t, ws[2])
		})
	}
}

func TestWakeBudget(t *testing.T) {
	h := setups()[0].hub(t)
	pub := setups()[0].publish
	ch := "{n}:budget"
	var ws []*Waiter
	for _, weight := range []int64{2, 1, 3} {
		w, err := h.Subscribe(ch, weight)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		ws = append(ws, w)
	}
	ready(t, ws...)
	pub(t, ch, "3") // fits 2+1, not the 3 behind them
	woken(t, ws[0])
	woken(t, ws[1])
	notWoken(t, ws[2])
	ws[0].Close()
	ws[1].Close()
	pub(t, ch, "1")
	woken(t, ws[2]) // the first idle waiter gets a wake-up even if it needs more
	pub(t, ch, "not-a-number")
	woken(t, ws[2]) // treated as budget 1
}

func TestCloseHandsOnWakeUp(t *testing.T) {
	h := setups()[0].hub(t)
	pub := setups()[0].publish
	ch := "{n}:handon"
	w1, _ := h.Subscribe(ch, 1)
	w2, _ := h.Subscribe(ch, 1)
	defer w2.Close()
	ready(t, w1, w2)
	pub(t, ch, "1")
	// w1 was woken (it is first) but leaves without taking the wake-up,
	// as a waiter whose context ended would.
	if !waitLen(w1) {
		t.Fatal("w1 not woken")
	}
	w1.Close()
	woken(t, w2)
}

// blockedIn waits until some goroutine is blocked in a select inside fn, so
// that what the test does next happens while it waits, not before.
func blockedIn(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	ok := redistest.WaitFor(context.Background(), signalWait, func() bool {
		stacks := string(buf[:runtime.Stack(buf, true)])
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, fn) {
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no goroutine blocked in %s", fn)
	}
}

func waitLen(w *Waiter) bool {
	deadline := time.Now().Add(signalWait)
	for len(w.c) == 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// TestOneSubscriptionPerChannel: many local waiters, one server-side
// subscriber; after the last leaves and the linger passes, none.
func TestOneSubscriptionPerChannel(t *testing.T) {
	srv := redistest.Single(t)
	h := New(hubClient(t, redistest.Client(t, srv.Addr())), false)
	defer h.Close()
	h.linger = 50 * time.Millisecond
	ch := "{n}:numsub"
	var ws []*Waiter
	for range 20 {
		w, _ := h.Subscribe(ch, 1)
		ws = append(ws, w)
	}
	ready(t, ws...)
	if got := numsub(t, srv, ch); got != 1 {
		t.Errorf("PUBSUB NUMSUB with 20 local waiters = %d, want 1", got)
	}
	for _, w := range ws {
		w.Close()
	}
	if !redistest.WaitFor(context.Background(), signalWait, func() bool { return numsub(t, srv, ch) == 0 }) {
		t.Errorf("still subscribed after the last waiter left and the linger passed")
	}
}

// TestLingerStartsWithLastWaiter: the linger that ends a subscription
// starts when the last waiter leaves, not when an earlier one does. The
// second waiter leaves well after the linger of the first would have passed
// (nothing signals a timer that should not run; a loaded machine only makes
// the test weaker, never wrong): the channel must stay subscribed while
// it waits, and be unsubscribed once it has left.
func TestLingerStartsWithLastWaiter(t *testing.T) {
	srv := redistest.Single(t)
	h := New(hubClient(t, redistest.Client(t, srv.Addr())), false)
	defer h.Close()
	h.linger = 50 * time.Millisecond
	ch := "{n}:lastout"
	first, _ := h.Subscribe(ch, 1)
	second, _ := h.Subscribe(ch, 1)
	ready(t, first, second)
	first.Close()
	time.Sleep(4 * h.linger)
	if got := numsub(t, srv, ch); got != 1 {
		t.Fatalf("PUBSUB NUMSUB with one waiter left = %d, want 1", got)
	}
	second.Close()
	if !redistest.WaitFor(context.Background(), signalWait, func() bool { return numsub(t, srv, ch) == 0 }) {
		t.Errorf("still subscribed after the last waiter left and the linger passed")
	}
}

func numsub(t *testing.T, srv *redistest.Server, ch string) int {
	t.Helper()
	out, err := srv.Do("PUBSUB", "NUMSUB", ch)
	if err != nil {
		t.Fatal(err)
	}
	// reply: channel name, count
	var n int
	for i, line := range splitLines(out) {
		if i == 1 {
			n, _ = strconv.Atoi(line)
		}
	}
	return n
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// TestResubscribeWakesAll kills the pub/sub connection: once subscribed
// again, every waiter is woken, since a release may have been missed.
func TestResubscribeWakesAll(t *testing.T) {
	srv := redistest.NewServer(t)
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	h := New(hubClient(t, client), false)
	defer h.Close()
	ch := "{n}:drop"
	w1, _ := h.Subscribe(ch, 1)
	defer w1.Close()
	w2, _ := h.Subscribe(ch, 1)
	defer w2.Close()
	ready(t, w1, w2)
	if _, err := srv.Do("CLIENT", "KILL", "TYPE", "pubsub"); err != nil {
		// With RESP3 the subscription shares the normal connection.
		if _, err := srv.Do("CLIENT", "KILL", "TYPE", "normal"); err != nil {
			t.Fatal(err)
		}
	}
	woken(t, w1)
	woken(t, w2)
}

func TestClosedHub(t *testing.T) {
	h := setups()[0].hub(t)
	w, _ := h.Subscribe("{n}:closed", 1)
	h.Close()
	if err := w.Wait(context.Background(), time.Hour); !errors.Is(err, ErrClosed) {
		t.Fatalf("Wait after Close = %v, want ErrClosed", err)
	}
	if err := w.Ready(context.Background(), time.Hour); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ready after Close = %v, want ErrClosed", err)
	}
	w.Close()
	if _, err := h.Subscribe("{n}:closed", 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Subscribe after Close: %v, want ErrClosed", err)
	}
}

// TestCloseInterruptsWaiters: Close makes a Wait, and a Ready whose
// subscription cannot be confirmed (the server is paused), return ErrClosed
// at once instead of after their timeouts.
func TestCloseInterruptsWaiters(t *testing.T) {
	srv := redistest.NewServer(t)
	h := New(hubClient(t, redistest.Client(t, srv.Addr())), false)
	defer h.Close()
	waiting, _ := h.Subscribe("{n}:close-wait", 1)
	defer waiting.Close()
	ready(t, waiting)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Resume() })
	unconfirmed, _ := h.Subscribe("{n}:close-ready", 1)
	defer unconfirmed.Close()

	errs := make(chan error, 2)
	go func() { errs <- waiting.Wait(context.Background(), time.Hour) }()
	go func() { errs <- unconfirmed.Ready(context.Background(), time.Hour) }()
	blockedIn(t, "notify.(*Waiter).Wait(")
	blockedIn(t, "notify.(*Waiter).Ready(")
	h.Close()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("Wait or Ready during Close = %v, want ErrClosed", err)
			}
		case <-time.After(signalWait):
			t.Fatal("Wait or Ready still blocked after Close")
		}
	}
}

// TestWakeSkipsHeavier: a budget too small for the first waiter goes to a
// lighter one behind it that can use it, not to the first (issue 10, item
// 5: capacity 5, a weight-5 waiter ahead of a weight-1 waiter, one permit
// released).
func TestWakeSkipsHeavier(t *testing.T) {
	h := setups()[0].hub(t)
	pub := setups()[0].publish
	ch := "{n}:skip"
	heavy, _ := h.Subscribe(ch, 5)
	defer heavy.Close()
	light, _ := h.Subscribe(ch, 1)
	defer light.Close()
	ready(t, heavy, light)
	pub(t, ch, "1")
	woken(t, light)
	notWoken(t, heavy)
	pub(t, ch, "5") // both fit in turn: the first takes it all
	woken(t, heavy)
	notWoken(t, light)
}

// TestPassOn: a woken waiter whose attempt failed with fewer units free than
// it needs offers them to the waiters behind it that fit; a waiter that was
// not woken passes nothing on.
func TestPassOn(t *testing.T) {
	h := setups()[0].hub(t)
	pub := setups()[0].publish
	ch := "{n}:passon"
	heavy, _ := h.Subscribe(ch, 3)
	defer heavy.Close()
	mid, _ := h.Subscribe(ch, 2)
	defer mid.Close()
	light, _ := h.Subscribe(ch, 1)
	defer light.Close()
	ready(t, heavy, mid, light)
	pub(t, ch, "3") // the first waiter fits and takes the whole budget
	if err := heavy.Wait(context.Background(), signalWait); err != nil || !heavy.woken.Load() {
		t.Fatalf("heavy.Wait = %v, woken %v; want a wake-up", err, heavy.woken.Load())
	}
	notWoken(t, mid)
	notWoken(t, light)
	// Someone elsewhere took 2 first: heavy finds 1 free, which fits light.
	heavy.PassOn(1)
	woken(t, light)
	notWoken(t, mid)
	notWoken(t, heavy) // never back to the waiter that passed it on

	if err := mid.Wait(context.Background(), time.Millisecond); err != nil || mid.woken.Load() {
		t.Fatalf("mid.Wait = %v, woken %v; want a timeout", err, mid.woken.Load())
	}
	mid.PassOn(1)
	notWoken(t, light)
}

// TestSubscribeRefused: an ACL user without access to the channel
// (resetchannels, the Redis 7 default) gets NOPERM for SUBSCRIBE. Ready and
// Wait report it instead of waiting their whole timeout, every time; once
// access is granted, a new Subscribe works.
func TestSubscribeRefused(t *testing.T) {
	srv := redistest.NewServer(t)
	if _, err := srv.Do("ACL", "SETUSER", "u", "on", ">pw", "~*", "+@all", "resetchannels"); err != nil {
		t.Fatal(err)
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true, Username: "u", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	h := New(hubClient(t, client), false)
	defer h.Close()
	ch := "{n}:refused"
	for i := range 2 { // not cached: the second Subscribe is refused anew
		w, err := h.Subscribe(ch, 1)
		if err != nil {
			t.Fatal(err)
		}
		err = w.Ready(context.Background(), time.Hour)
		var re *rueidis.RedisError
		if !errors.Is(err, ErrSubscribe) || !errors.As(err, &re) || !strings.HasPrefix(re.Error(), "NOPERM") {
			t.Fatalf("Ready %d with NOPERM = %v, want ErrSubscribe wrapping the NOPERM reply", i, err)
		}
		if err := w.Wait(context.Background(), time.Hour); !errors.Is(err, ErrSubscribe) {
			t.Fatalf("Wait %d with NOPERM = %v, want ErrSubscribe", i, err)
		}
		w.Leave()
	}
	if _, err := srv.Do("ACL", "SETUSER", "u", "allchannels"); err != nil {
		t.Fatal(err)
	}
	w, err := h.Subscribe(ch, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ready(t, w)
	if err := w.Ready(context.Background(), time.Hour); err != nil {
		t.Fatalf("Ready once allowed = %v, want nil", err)
	}
}

// TestLeavePassesUsedWakeUp: a waiter that was woken, tried, and then gives
// up without acquiring passes a wake-up on; one that leaves after a plain
// timeout does not.
func TestLeavePassesUsedWakeUp(t *testing.T) {
	h := setups()[0].hub(t)
	pub := setups()[0].publish
	ch := "{n}:leave"
	w1, _ := h.Subscribe(ch, 1)
	w2, _ := h.Subscribe(ch, 1)
	defer w2.Close()
	ready(t, w1, w2)
	pub(t, ch, "1")
	if err := w1.Wait(context.Background(), signalWait); err != nil || !w1.woken.Load() {
		t.Fatalf("w1.Wait = %v, woken %v; want a wake-up", err, w1.woken.Load())
	}
	// w1's attempt failed (say its context ended): it leaves.
	w1.Leave()
	woken(t, w2)

	w3, _ := h.Subscribe(ch, 1)
	w4, _ := h.Subscribe(ch, 1)
	defer w4.Close()
	ready(t, w3, w4)
	if err := w3.Wait(context.Background(), time.Millisecond); err != nil || w3.woken.Load() {
		t.Fatalf("w3.Wait = %v, woken %v; want a timeout", err, w3.woken.Load())
	}
	w3.Leave()
	notWoken(t, w4)
}

// hubClient returns the scriptcache.Client of a rueidis client.
func hubClient(t testing.TB, c rueidis.Client) scriptcache.Client {
	t.Helper()
	sc, err := scriptcache.New(context.Background(), c)
	if err != nil {
		t.Fatalf("scriptcache.New: %v", err)
	}
	return sc.Client()
}

// TestWakeOnlyThatWaiter: Wake wakes the waiter it is called on, and no
// other waiter of the channel; a Wait after it returns at once, as woken.
func TestWakeOnlyThatWaiter(t *testing.T) {
	h := New(hubClient(t, redistest.Client(t, redistest.Single(t).Addr())), false)
	t.Cleanup(h.Close)
	ch := "{n}:" + t.Name()
	a, err := h.Subscribe(ch, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := h.Subscribe(ch, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.Wake()
	b.Wake() // kept once, like a message
	notWoken(t, a)
	if err := b.Wait(context.Background(), signalWait); err != nil || !b.woken.Load() {
		t.Fatalf("Wait after Wake: %v, woken %v; want nil, true", err, b.woken.Load())
	}
	notWoken(t, b)
}

// TestSubscribedAndConfirmed: a channel counts as subscribed only once
// Redis has confirmed it, and a waiter registered then is confirmed at
// once; a channel nobody uses is not subscribed.
func TestSubscribedAndConfirmed(t *testing.T) {
	h := New(hubClient(t, redistest.Client(t, redistest.Single(t).Addr())), false)
	t.Cleanup(h.Close)
	ch := "{n}:" + t.Name()
	if h.Subscribed(ch) {
		t.Fatal("Subscribed before any waiter")
	}
	a, err := h.Subscribe(ch, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ready(t, a)
	if !h.Subscribed(ch) || !a.Confirmed() {
		t.Fatalf("after confirmation: Subscribed %v, Confirmed %v; want both", h.Subscribed(ch), a.Confirmed())
	}
	b, err := h.Subscribe(ch, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !b.Confirmed() {
		t.Fatal("a waiter registered on a confirmed subscription is not confirmed")
	}
	if h.Subscribed("{n}:other") {
		t.Fatal("Subscribed to a channel nobody waits on")
	}
}

// heldConfirmation is a Client whose subscription confirmations wait until
// release is closed, like a slow SUBSCRIBE round trip.
type heldConfirmation struct {
	scriptcache.Client
	release chan struct{}
}

func (c heldConfirmation) Subscribe(ctx context.Context, channel string, sharded bool, subscribed func(), message func(string)) error {
	return c.Client.Subscribe(ctx, channel, sharded, func() {
		select {
		case <-c.release:
			subscribed()
		case <-ctx.Done():
		}
	}, message)
}

// TestEarlyReadyWokenAtConfirmation: a waiter whose Ready gave up before
// the subscription was confirmed has tried again and waits for a message,
// but whatever was published before the confirmation never reached the
// process: it is woken when the confirmation comes, and no other waiter is.
func TestEarlyReadyWokenAtConfirmation(t *testing.T) {
	c := heldConfirmation{hubClient(t, redistest.Client(t, redistest.Single(t).Addr())), make(chan struct{})}
	h := New(c, false)
	t.Cleanup(h.Close)
	ch := "{n}:" + t.Name()
	early, err := h.Subscribe(ch, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	patient, err := h.Subscribe(ch, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer patient.Close()
	if err := early.Ready(context.Background(), time.Millisecond); err != nil || early.Confirmed() {
		t.Fatalf("Ready before the confirmation = %v, confirmed %v; want a timeout", err, early.Confirmed())
	}
	notWoken(t, early)
	close(c.release)
	ready(t, early)
	woken(t, early)
	notWoken(t, patient)
}

// TestTakeGrantOnceAndSetID: TakeGrant hands a grant out once; after SetID
// the waiter takes grants for its new id only.
func TestTakeGrantOnceAndSetID(t *testing.T) {
	s := setups()[0]
	h := s.hub(t)
	ch := "{n}:" + t.Name()
	w, err := h.SubscribeID(ch, 1, "a.1")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ready(t, w)
	s.publish(t, ch, "g a.1 7")
	woken(t, w)
	if g, ok := w.TakeGrant(); !ok || g != "7" {
		t.Fatalf("TakeGrant = %q, %v; want 7, true", g, ok)
	}
	if g, ok := w.TakeGrant(); ok {
		t.Fatalf("TakeGrant again = %q; want the grant taken once", g)
	}
	w.SetID("a.2")
	s.publish(t, ch, "g a.1 8") // the old id: not this waiter's any more
	s.publish(t, ch, "1")       // delivered after it, in order: a wake-up
	woken(t, w)
	if g, ok := w.TakeGrant(); ok {
		t.Fatalf("a grant for the old id reached the waiter: %q", g)
	}
	s.publish(t, ch, "g a.2 9")
	woken(t, w)
	if g, ok := w.TakeGrant(); !ok || g != "9" {
		t.Fatalf("TakeGrant after SetID = %q, %v; want 9, true", g, ok)
	}
}

// droppingSubscriptions is a Client whose subscriptions drop: each call of
// Subscribe returns an error at once, except those that live says to keep
// up for a while first (until ctx ends). It records when each call came
// and when it returned.
type droppingSubscriptions struct {
	scriptcache.Client
	live  func(call int) time.Duration
	mu    sync.Mutex
	calls []time.Time // entry of each call
	rets  []time.Time // return of each call
	more  chan struct{}
}

func (c *droppingSubscriptions) Subscribe(ctx context.Context, _ string, _ bool, _ func(), _ func(string)) error {
	c.mu.Lock()
	i := len(c.calls)
	c.calls = append(c.calls, time.Now())
	c.mu.Unlock()
	if d := c.live(i); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	c.mu.Lock()
	c.rets = append(c.rets, time.Now())
	c.mu.Unlock()
	select {
	case c.more <- struct{}{}:
	default:
	}
	return errors.New("test: connection dropped")
}

// returned waits until n calls have returned, and gives the entry and
// return times of the first n.
func (c *droppingSubscriptions) returned(t *testing.T, n int) (calls, rets []time.Time) {
	t.Helper()
	deadline := time.After(4 * signalWait)
	for {
		c.mu.Lock()
		if len(c.rets) >= n {
			calls, rets = slices.Clone(c.calls[:n]), slices.Clone(c.rets[:n])
			c.mu.Unlock()
			return calls, rets
		}
		c.mu.Unlock()
		select {
		case <-c.more:
		case <-deadline:
			t.Fatalf("%d subscription calls returned, want %d", len(rets), n)
		}
	}
}

// TestResubscribeBackoff: a subscription that drops at once is tried again
// after a backoff that doubles from 10 ms to a second (a Redis that drops
// every subscription is not hammered); one that lived over a second
// starts the backoff over, at 10 ms.
//
// The bounds hold on a loaded machine: timers never fire early, so the
// first five waits take at least 10+20+40+80+160 ms; a stall of a second
// inside those calls would reset the backoff (the subscription "lived" a
// second), but it lies within the same window. The wait after the long
// subscription is 10 ms; 900 ms of slack is left before the second it
// would be without the reset.
func TestResubscribeBackoff(t *testing.T) {
	const quick = 7 // drops at once: the 7th waits 640 ms, and the backoff is at its cap, a second
	c := &droppingSubscriptions{more: make(chan struct{}, 1), live: func(call int) time.Duration {
		if call == quick {
			return 1100 * time.Millisecond
		}
		return 0
	}}
	h := New(c, false)
	t.Cleanup(h.Close)
	w, err := h.Subscribe("{n}:"+t.Name(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	calls, rets := c.returned(t, quick+2)
	if d := calls[5].Sub(rets[0]); d < 310*time.Millisecond {
		t.Errorf("5 backoffs after subscriptions that dropped at once took %v, want at least 10+20+40+80+160 ms", d)
	}
	if d := rets[quick].Sub(calls[quick]); d < time.Second {
		t.Fatalf("the long subscription lived %v, want over a second", d)
	}
	if d := calls[quick+1].Sub(rets[quick]); d >= 900*time.Millisecond {
		t.Errorf("backoff after a subscription that lived over a second = %v, want 10 ms, not the second it had grown to", d)
	}
}
