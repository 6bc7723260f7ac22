package semaphore

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
// test ends), as stopping the process (SIGSTOP, a VM freeze) stops it: a
// lease it tracks, already over, gets a loss callback that blocks. While
// paused, the keeper starts no renewal and declares no loss.
func pauseKeeper(t *testing.T, k *lease.Keeper) (resume func()) {
	t.Helper()
	entered, release := make(chan struct{}), make(chan struct{})
	k.Add(time.Now().Add(-time.Hour), time.Second, nil, func(error) {
		close(entered)
		<-release
	})
	select {
	case <-entered:
	case <-time.After(internalWait):
		t.Fatal("the keeper did not run the pausing callback")
	}
	var once sync.Once
	resume = func() { once.Do(func() { close(release) }) }
	t.Cleanup(resume) // before the Manager's Close, which waits for the keeper
	return resume
}

// TestPermitHeldUntilWithoutKeeper (issue 25): a holder resumed after a
// pause longer than its lease saw Lost open and Err nil until the keeper
// ran, and had no quick way to ask whether it may still write. HeldUntil
// and Valid read the client clock, so they answer at once; the keeper,
// resumed, then declares the loss, and Context ends with it.
func TestPermitHeldUntilWithoutKeeper(t *testing.T) {
	const leaseDur = 300 * time.Millisecond
	for _, c := range []struct {
		name string
		opts Options
	}{
		{"watchdog", Options{WatchdogLease: leaseDur}},
		{"fixed", Options{Lease: leaseDur}},
		{"fair", Options{WatchdogLease: leaseDur, Fair: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			m := internalManager(t, redistest.Single(t).Addr(), c.opts)
			s, err := m.NewSemaphore("held-until:"+t.Name(), 2)
			if err != nil {
				t.Fatal(err)
			}
			resume := pauseKeeper(t, m.keeper)
			taken := time.Now()
			p, err := s.Acquire(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			pctx, cancel := p.Context(ctx)
			defer cancel()
			until := p.HeldUntil()
			if until.IsZero() || !until.After(taken) || until.After(taken.Add(leaseDur)) {
				t.Fatalf("HeldUntil = %v right after Acquire at %v, want within its %v lease", until, taken, leaseDur)
			}
			if !p.Valid() {
				t.Fatal("Valid = false right after Acquire")
			}
			time.Sleep(time.Until(until) + 5*time.Millisecond) // the pause past the lease
			select {
			case <-p.Lost():
				t.Fatal("Lost closed while the keeper was paused: the test does not show what it means to")
			default:
			}
			if err := p.Err(); err != nil {
				t.Fatalf("Err = %v while the keeper was paused, want nil", err)
			}
			if p.Valid() {
				t.Fatal("Valid = true past the end of the lease, with the keeper paused")
			}
			if got := p.HeldUntil(); !got.Before(time.Now()) {
				t.Fatalf("HeldUntil = %v past the end of the lease, want a time already past", got)
			}
			resume()
			select {
			case <-pctx.Done():
			case <-time.After(internalWait):
				t.Fatal("the resumed keeper did not declare the loss")
			}
			if cause := context.Cause(pctx); !errors.Is(cause, ErrLost) || !errors.Is(cause, lease.ErrExpired) {
				t.Fatalf("Context's cause = %v, want ErrLost wrapping lease.ErrExpired", cause)
			}
			if got := p.HeldUntil(); !got.IsZero() || p.Valid() {
				t.Fatalf("after the loss HeldUntil = %v, Valid = %v, want the zero time and false", got, p.Valid())
			}
		})
	}
}
