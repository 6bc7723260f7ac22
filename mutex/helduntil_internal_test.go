package mutex

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// pauseKeeper stops k's scheduler goroutine until resume is called (or the
// test ends), as stopping the process (SIGSTOP, a VM freeze) stops it:
// a lease it tracks, already over, gets a loss callback that blocks. While
// stalled, the keeper starts no renewal and declares no loss.
func pauseKeeper(t *testing.T, k *lease.Keeper) (resume func()) {
	t.Helper()
	entered, release := make(chan struct{}), make(chan struct{})
	k.Add(time.Now().Add(-time.Hour), time.Second, nil, func(error) {
		close(entered)
		<-release
	})
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the keeper did not run the stalling callback")
	}
	var once sync.Once
	resume = func() { once.Do(func() { close(release) }) }
	t.Cleanup(resume) // before the Locker's Close, which waits for the keeper
	return resume
}

// holdLike is what TestHeldUntilWithoutKeeper needs of a hold.
type holdLike interface {
	HeldUntil() time.Time
	Valid() bool
	Lost() <-chan struct{}
	Err() error
}

// checkHeldUntilPastLease is the core of TestHeldUntilWithoutKeeper: h was
// just taken while the keeper is stalled. The test waits (the fault: the
// process "stopped") until its lease is over by the client clock; HeldUntil
// and Valid must say so at once, although the keeper has not run, so Lost
// is still open and Err nil, as a holder resumed after SIGCONT sees them.
// Resumed, the keeper declares the loss, and HeldUntil stays zero.
func checkHeldUntilPastLease(t *testing.T, h holdLike, leaseDur time.Duration, taken, returned time.Time, resume func()) {
	t.Helper()
	until := h.HeldUntil()
	// The lease counts from the send of the granting call, somewhere
	// between the call and its return (a loaded machine may send it late).
	if until.IsZero() || !until.After(taken) || until.After(returned.Add(leaseDur)) {
		t.Fatalf("HeldUntil = %v for a hold taken from %v to %v, want within its %v lease", until, taken, returned, leaseDur)
	}
	if !h.Valid() {
		t.Fatal("Valid = false right after taking the hold")
	}
	time.Sleep(time.Until(until) + 5*time.Millisecond) // the pause past the lease
	select {
	case <-h.Lost():
		t.Fatal("Lost closed while the keeper was stalled: the test does not show what it means to")
	default:
	}
	if err := h.Err(); err != nil {
		t.Fatalf("Err = %v while the keeper was stalled, want nil", err)
	}
	if h.Valid() {
		t.Fatal("Valid = true past the end of the lease, with the keeper stalled")
	}
	if got := h.HeldUntil(); !got.Before(time.Now()) {
		t.Fatalf("HeldUntil = %v past the end of the lease, want a time already past", got)
	}
	resume()
	select {
	case <-h.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the resumed keeper did not declare the loss")
	}
	if err := h.Err(); !errors.Is(err, ErrLost) || !errors.Is(err, lease.ErrExpired) {
		t.Fatalf("Err = %v after the keeper resumed, want ErrLost wrapping lease.ErrExpired", err)
	}
	if got := h.HeldUntil(); !got.IsZero() || h.Valid() {
		t.Fatalf("HeldUntil = %v, Valid = %v after the loss, want the zero time and false", got, h.Valid())
	}
}

// TestHeldUntilWithoutKeeper (issue 25): a holder resumed after a pause
// longer than its lease saw Lost open and Err nil until the keeper ran, and
// had no quick way to ask whether it may still write. HeldUntil and Valid
// read the client clock, so they answer at once, for every kind of hold.
func TestHeldUntilWithoutKeeper(t *testing.T) {
	const leaseDur = time.Second // a loaded machine may take a few hundred ms between the send and Valid
	ctx := context.Background()
	for _, c := range []struct {
		name string
		take func(t *testing.T, l *Locker) holdLike
	}{
		{"mutex", func(t *testing.T, l *Locker) holdLike {
			m := reviewMutex(t, l, "held-until"+t.Name())
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			return m
		}},
		{"rwmutex read", func(t *testing.T, l *Locker) holdLike {
			rw, err := l.NewRWMutex("held-until-rw" + t.Name())
			if err != nil {
				t.Fatal(err)
			}
			if err := rw.RLock(ctx); err != nil {
				t.Fatal(err)
			}
			return rw
		}},
		{"rwmutex write", func(t *testing.T, l *Locker) holdLike {
			rw, err := l.NewRWMutex("held-until-rw-w" + t.Name())
			if err != nil {
				t.Fatal(err)
			}
			if err := rw.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			return rw
		}},
		{"multimutex", func(t *testing.T, l *Locker) holdLike {
			mm, err := l.NewMultiMutex([]string{"held-until-a" + t.Name(), "held-until-b" + t.Name()})
			if err != nil {
				t.Fatal(err)
			}
			if err := mm.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			return mm
		}},
	} {
		for _, fixed := range []bool{false, true} {
			name := c.name + "/watchdog"
			opts := Options{WatchdogLease: leaseDur}
			if fixed {
				name, opts = c.name+"/fixed", Options{Lease: leaseDur}
			}
			t.Run(name, func(t *testing.T) {
				l, _ := reviewLocker(t, opts)
				resume := pauseKeeper(t, l.keeper)
				taken := time.Now()
				h := c.take(t, l)
				checkHeldUntilPastLease(t, h, leaseDur, taken, time.Now(), resume)
			})
		}
	}
}

// TestHeldUntilFollowsRenewals: with the keeper running, a watchdog hold's
// HeldUntil moves on with each renewal, and the release ends it.
func TestHeldUntilFollowsRenewals(t *testing.T) {
	ctx := context.Background()
	l, _ := reviewLocker(t, Options{WatchdogLease: 300 * time.Millisecond})
	m := reviewMutex(t, l, "held-until-renewed")
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	first := m.HeldUntil()
	if !redistest.WaitFor(ctx, 10*time.Second, func() bool { return m.HeldUntil().After(first) }) {
		t.Fatalf("HeldUntil stayed %v: no renewal moved it", first)
	}
	if !m.Valid() {
		t.Fatal("Valid = false while the watchdog renews the hold")
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := m.HeldUntil(); !got.IsZero() || m.Valid() {
		t.Fatalf("after Unlock HeldUntil = %v, Valid = %v, want the zero time and false", got, m.Valid())
	}
}
