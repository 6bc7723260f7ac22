package mutex_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicekit/sluice/mutex"
)

// TestLockerLock checks the one-call forms both ways: the returned Mutex
// holds (another owner is refused until it unlocks), a refusal returns no
// Mutex, and a bad name is the constructor's error.
func TestLockerLock(t *testing.T) {
	ctx := context.Background()
	locks := newLocker(t, clientFor(t, realTargets[0]), mutex.Options{})

	m, err := locks.Lock(ctx, "one-call")
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	if m == nil || m.Token() <= 0 {
		t.Fatalf("Lock returned %v without a token", m)
	}
	other, err := locks.TryLock(ctx, "one-call")
	if !errors.Is(err, mutex.ErrNotObtained) || other != nil {
		t.Fatalf("TryLock on a held name: %v, %v; want nil, ErrNotObtained", other, err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	other, err = locks.TryLock(ctx, "one-call")
	if err != nil {
		t.Fatalf("TryLock on a free name: %v", err)
	}
	if other.Token() <= m.Token() {
		t.Errorf("token %d after %d: want larger", other.Token(), m.Token())
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if m, err := locks.Lock(ctx, ""); err == nil || m != nil {
		t.Errorf("Lock of an empty name: %v, %v; want an error", m, err)
	}
}
