package lease

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
)

// TestSlotsNeverMixSlots: a batch renewal is one script call,
// and on a cluster the keys of one call must share a slot (rueidis's
// cluster client panics otherwise). Slots must give keys of one slot one
// Group and keys of different slots different ones, and no RenewBatch
// call may then carry items of two slots, however the leases' due times
// interleave; on a single server every key shares one group.
func TestSlotsNeverMixSlots(t *testing.T) {
	var keys []string
	for i := range 120 {
		keys = append(keys, fmt.Sprintf("sluice:lock:%d", i)) // spread over slots
	}
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("{hot}:%d", i)) // one slot
	}
	// Keys whose hash tags are empty or unterminated hash whole.
	keys = append(keys, "{}a", "{}b", "{a", "a}{b}", "{b}{c}")

	single := NewKeeper().NewSlots(false, nil)
	first := single.Group(keys[0])
	for _, k := range keys {
		if single.Group(k) != first {
			t.Fatalf("single server: key %q got a group of its own", k)
		}
	}
	single.k.Close()

	k := NewKeeper()
	defer k.Close()
	var mu sync.Mutex
	var calls, items int
	var mixed []string
	rounds := make(chan struct{}, 1)
	renew := func(ctx context.Context, batch []any, errs []error) error {
		slot := keyspace.Slot(batch[0].(string))
		for _, it := range batch[1:] {
			if s := keyspace.Slot(it.(string)); s != slot {
				mu.Lock()
				mixed = append(mixed, fmt.Sprintf("%q (slot %d) with %q (slot %d)", batch[0], slot, it, s))
				mu.Unlock()
			}
		}
		mu.Lock()
		calls++
		items += len(batch)
		if items >= 3*len(keys) {
			select {
			case rounds <- struct{}{}:
			default:
			}
		}
		mu.Unlock()
		return nil
	}
	slots := k.NewSlots(true, renew)
	bySlot := map[uint16]*Group{}
	for _, key := range keys {
		g := slots.Group(key)
		s := keyspace.Slot(key)
		if prev, ok := bySlot[s]; ok && prev != g {
			t.Fatalf("key %q: a second group for slot %d", key, s)
		}
		bySlot[s] = g
	}
	seen := map[*Group]uint16{}
	for s, g := range bySlot {
		if other, ok := seen[g]; ok {
			t.Fatalf("slots %d and %d share a group", s, other)
		}
		seen[g] = s
	}

	// Leases of staggered due times, so that collect forms batches with
	// early renewals across them.
	const ttl = 600 * time.Millisecond
	now := time.Now()
	var leases []*Lease
	for i, key := range keys {
		sent := now.Add(-time.Duration(i%7) * 20 * time.Millisecond)
		leases = append(leases, k.AddBatched(sent, ttl, slots.Group(key), key, func(err error) {
			t.Errorf("lease of %q lost while every renewal succeeds: %v", key, err)
		}))
	}
	select {
	case <-rounds:
	case <-time.After(signalWait):
		t.Fatal("the leases were not renewed three times over")
	}
	for _, l := range leases {
		l.Stop()
	}
	mu.Lock()
	defer mu.Unlock()
	if len(mixed) > 0 {
		t.Fatalf("%d renewal calls mixed slots, e.g. %s", len(mixed), mixed[0])
	}
	if calls >= items {
		t.Errorf("%d calls for %d renewals: nothing was batched", calls, items)
	}
	t.Logf("%d renewals in %d calls over %d slots", items, calls, len(bySlot))
}
