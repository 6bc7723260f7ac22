package lease

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// batchCall is one RenewBatch request of a fakeGroup, held until the test
// answers it.
type batchCall struct {
	ctx     context.Context
	items   []any
	errs    []error // the answers; the test sets them before reply
	entered time.Time
	reply   chan error
}

// answer sets errs[i] to what of gives for items[i] and lets the call
// return err.
func (c *batchCall) answer(err error, of func(item any) error) {
	if of != nil {
		for i, it := range c.items {
			c.errs[i] = of(it)
		}
	}
	c.reply <- err
}

// fakeGroup hands every RenewBatch request to the test through calls.
type fakeGroup struct{ calls chan *batchCall }

func newFakeGroup() *fakeGroup { return &fakeGroup{calls: make(chan *batchCall)} }

func (f *fakeGroup) renew(ctx context.Context, items []any, errs []error) error {
	c := &batchCall{ctx: ctx, items: append([]any(nil), items...), errs: errs, entered: time.Now(), reply: make(chan error)}
	select {
	case f.calls <- c:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-c.reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// next returns the next request, failing t if none comes.
func (f *fakeGroup) next(t *testing.T) *batchCall {
	t.Helper()
	select {
	case c := <-f.calls:
		return c
	case <-time.After(signalWait):
		t.Fatalf("no renewal request within %v", signalWait)
		return nil
	}
}

// batchTTL is the TTL of the batching tests. Their leases are added as if
// granted just under ttl/3 ago (dueSoon), so a renewal may start 2*ttl/3 -
// Margin = 1.7 s late before they are (rightly) lost.
const batchTTL = 3 * time.Second

// dueSoon is a grant time that makes a lease of batchTTL due in 300 ms:
// time enough to add the leases of a test before the first is due, so that
// the scheduler sees them together.
func dueSoon() time.Time { return time.Now().Add(300*time.Millisecond - batchTTL/3) }

// addDue adds n leases to g, items "name0".."name<n-1>", granted at sent.
func addDue(k *Keeper, g *Group, name string, n int, sent time.Time) ([]*Lease, []*lostRecorder) {
	leases := make([]*Lease, n)
	losts := make([]*lostRecorder, n)
	for i := range leases {
		losts[i] = newLost()
		leases[i] = k.AddBatched(sent, batchTTL, g, fmt.Sprint(name, i), losts[i].fn)
	}
	return leases, losts
}

func checkNotLost(t *testing.T, losts []*lostRecorder) {
	t.Helper()
	for i, r := range losts {
		select {
		case err := <-r.ch:
			t.Errorf("lease %d lost: %v", i, err)
		default:
		}
	}
}

func stopAll(leases []*Lease) {
	for _, l := range leases {
		l.Stop()
	}
}

// TestBatchCoalesces: when one lease of a group is due, the group's leases
// due within the next TTL/12 are renewed with it, in one request, and each
// deadline counts from that request's send.
func TestBatchCoalesces(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	f := newFakeGroup()
	g := k.NewGroup(f.renew)
	first := dueSoon()
	var leases []*Lease
	var losts []*lostRecorder
	// Due soon, and spread over the following ttl/24 (inside the window).
	for i := range 10 {
		ls, rs := addDue(k, g, fmt.Sprint("l", i, "-"), 1, first.Add(time.Duration(i)*batchTTL/240))
		leases, losts = append(leases, ls...), append(losts, rs...)
	}
	// One due 600 ms after the first, well outside the window, is not
	// taken early.
	late, lateLost := addDue(k, g, "late", 1, first.Add(600*time.Millisecond))
	defer stopAll(late)

	c := f.next(t)
	if len(c.items) != len(leases) {
		t.Fatalf("first request renews %d leases (%v), want all %d due within the window", len(c.items), c.items, len(leases))
	}
	granted := leases[len(leases)-1].Deadline() // the latest first deadline
	c.answer(nil, nil)
	for i, l := range leases {
		if !waitUntil(func() bool { return l.Deadline().After(granted) }) {
			t.Fatalf("lease %d: deadline not moved by the renewal", i)
		}
		if d, latest := l.Deadline(), c.entered.Add(batchTTL-Margin(batchTTL)); d.After(latest) {
			t.Errorf("lease %d: deadline %v after the request, want at most ttl - Margin = %v", i, d.Sub(c.entered), latest.Sub(c.entered))
		}
		// Granted at first + i*batchTTL/240, in the past; renewed now.
		if s := l.Sent(); s.After(c.entered) || !s.After(first.Add(batchTTL/24)) {
			t.Errorf("lease %d: Sent %v from the request's start: want the renewal's send, not the grant's or later", i, s.Sub(c.entered))
		}
	}
	stopAll(leases)
	checkNotLost(t, losts)
	checkNotLost(t, lateLost)
}

// TestBatchSizeBound: leases due together go out in requests of at most
// MaxBatch, at most groupCalls of a group in flight at once; the others
// wait for a request to return.
func TestBatchSizeBound(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	f := newFakeGroup()
	g := k.NewGroup(f.renew)
	const n = 6*MaxBatch - 100
	// All of them due together, once all are in: adding thousands of
	// leases under -race on a loaded machine can take longer than
	// dueSoon's 300 ms, and a batch sent before the last ones are in
	// holds fewer, so the count below holds only if they were.
	due := time.Now().Add(1500 * time.Millisecond)
	leases, losts := addDue(k, g, "l", n, due.Add(-batchTTL/3))
	allIn := time.Now().Before(due)
	defer stopAll(leases)

	seen := make(map[any]bool)
	var held []*batchCall
	calls := 0
	for len(seen) < n {
		c := f.next(t)
		calls++
		if len(c.items) > MaxBatch {
			t.Errorf("request of %d leases, want at most MaxBatch = %d", len(c.items), MaxBatch)
		}
		for _, it := range c.items {
			if seen[it] {
				t.Errorf("%v renewed twice before every lease was renewed once", it)
			}
			seen[it] = true
		}
		held = append(held, c)
		if len(held) == groupCalls {
			// The requests in flight are at the bound: the others can
			// only start once these return.
			for _, c := range held {
				c.answer(nil, nil)
			}
			held = nil
		}
	}
	for _, c := range held {
		c.answer(nil, nil)
	}
	if want := (n + MaxBatch - 1) / MaxBatch; calls != want {
		if allIn {
			t.Errorf("%d requests to renew %d leases, want %d", calls, n, want)
		} else {
			t.Logf("%d requests to renew %d leases: some were due before the last was added, so the count is not judged", calls, n)
		}
	}
	checkNotLost(t, losts)
}

// TestBatchGoneOnlyThatLease: a lease the batch reports gone is lost with
// its error; the others in the same request are renewed.
func TestBatchGoneOnlyThatLease(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	f := newFakeGroup()
	g := k.NewGroup(f.renew)
	leases, losts := addDue(k, g, "l", 5, dueSoon())
	granted := leases[0].Deadline()
	defer stopAll(leases)
	c := f.next(t)
	if len(c.items) != 5 {
		t.Fatalf("request renews %d leases, want 5", len(c.items))
	}
	c.answer(nil, func(item any) error {
		if item == "l2" {
			return fmt.Errorf("%w: taken over", ErrGone)
		}
		return nil
	})
	if err := losts[2].wait(t); !errors.Is(err, ErrGone) {
		t.Fatalf("lease 2 lost with %v, want ErrGone", err)
	}
	for i, l := range leases {
		if i != 2 && !l.Deadline().After(granted) {
			t.Errorf("lease %d: deadline not moved by the renewal", i)
		}
	}
	checkNotLost(t, losts)
}

// TestBatchFailureRetried: a request that fails as a whole is retried for
// all its leases, and none is lost.
func TestBatchFailureRetried(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	f := newFakeGroup()
	g := k.NewGroup(f.renew)
	leases, losts := addDue(k, g, "l", 3, dueSoon())
	granted := leases[0].Deadline()
	defer stopAll(leases)
	first := f.next(t)
	first.answer(errors.New("connection reset"), nil)
	second := f.next(t)
	if len(second.items) != 3 {
		t.Fatalf("retry renews %v, want all 3 leases", second.items)
	}
	second.answer(nil, nil)
	for i, l := range leases {
		if !waitUntil(func() bool { return l.Deadline().After(granted) }) {
			t.Errorf("lease %d: deadline not moved by the retry", i)
		}
	}
	checkNotLost(t, losts)
}

// TestBatchItemFailureRetried: a retryable error for one lease retries that
// lease and leaves the others' renewal standing.
func TestBatchItemFailureRetried(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	f := newFakeGroup()
	g := k.NewGroup(f.renew)
	leases, losts := addDue(k, g, "l", 3, dueSoon())
	defer stopAll(leases)
	f.next(t).answer(nil, func(item any) error {
		if item == "l1" {
			return errors.New("busy")
		}
		return nil
	})
	retry := f.next(t)
	if len(retry.items) != 1 || retry.items[0] != "l1" {
		t.Fatalf("retry renews %v, want [l1]", retry.items)
	}
	retry.answer(nil, nil)
	checkNotLost(t, losts)
}

// TestStopDuringBatch: a lease stopped while its request is in flight is
// never renewed again and its answer, even "gone", is ignored; the others
// go on. A request whose every lease has stopped is cancelled.
func TestStopDuringBatch(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	f := newFakeGroup()
	g := k.NewGroup(f.renew)
	leases, losts := addDue(k, g, "l", 2, dueSoon())
	c := f.next(t)
	leases[0].Stop()
	c.answer(nil, func(item any) error { return ErrGone })
	if err := losts[1].wait(t); !errors.Is(err, ErrGone) {
		t.Fatalf("lease 1 lost with %v, want ErrGone", err)
	}
	checkNotLost(t, losts[:1])

	// A stopped lease is not in the next requests; a request left with
	// nobody is cancelled.
	more, moreLost := addDue(k, g, "m", 1, dueSoon())
	c = f.next(t)
	if len(c.items) != 1 || c.items[0] != "m0" {
		t.Fatalf("request renews %v, want [m0]", c.items)
	}
	more[0].Stop()
	select {
	case <-c.ctx.Done():
	case <-time.After(signalWait):
		t.Fatal("request not cancelled when its only lease stopped")
	}
	checkNotLost(t, moreLost)
}

// TestBatchHangingExpires: leases whose request never returns are lost at
// their deadline, and requests waiting behind it are not needed for that.
func TestBatchHangingExpires(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	f := newFakeGroup()
	g := k.NewGroup(f.renew)
	const ttl = 150 * time.Millisecond
	sent := time.Now()
	lost := newLost()
	l := k.AddBatched(sent, ttl, g, "l", lost.fn)
	c := f.next(t) // never answered
	if err := lost.wait(t); !errors.Is(err, ErrExpired) {
		t.Fatalf("lost with %v, want ErrExpired", err)
	}
	checkLossTiming(t, l, lost, sent, ttl)
	select {
	case <-c.ctx.Done():
	case <-time.After(signalWait):
		t.Fatal("the hanging request was not cancelled after its lease was lost")
	}
}

// TestCloseReportsBatchedLeases: Close tells batched leases, in flight or
// not, that they will not be renewed.
func TestCloseReportsBatchedLeases(t *testing.T) {
	k := NewKeeper()
	f := newFakeGroup()
	g := k.NewGroup(f.renew)
	_, inflight := addDue(k, g, "a", 1, dueSoon())
	f.next(t) // never answered
	_, idle := addDue(k, g, "b", 1, time.Now())
	k.Close()
	for _, r := range append(inflight, idle...) {
		select {
		case err := <-r.ch:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("lost with %v, want ErrClosed", err)
			}
		default:
			t.Error("Close returned without reporting a batched lease")
		}
	}
}

// TestStopWhileWaiting: a batch formed while the group's requests were at
// their bound, whose leases all stopped before its turn, is never sent.
func TestStopWhileWaiting(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	f := newFakeGroup()
	g := k.NewGroup(f.renew)
	leases, losts := addDue(k, g, "l", (groupCalls+1)*MaxBatch, dueSoon())
	defer stopAll(leases)
	held := make([]*batchCall, groupCalls)
	inFlight := make(map[any]bool)
	for i := range held {
		held[i] = f.next(t)
		for _, it := range held[i].items {
			inFlight[it] = true
		}
	}
	// The rest wait in one batch: stop them all.
	for i, l := range leases {
		if !inFlight[fmt.Sprint("l", i)] {
			l.Stop()
		}
	}
	for _, c := range held {
		c.answer(nil, nil)
	}
	extra, extraLost := addDue(k, g, "extra", 1, dueSoon())
	defer stopAll(extra)
	c := f.next(t)
	if len(c.items) != 1 || c.items[0] != "extra0" {
		t.Fatalf("request after the bound renews %d leases (first %v), want only extra0: stopped leases were sent", len(c.items), c.items[0])
	}
	c.answer(nil, nil)
	checkNotLost(t, losts)
	checkNotLost(t, extraLost)
}
