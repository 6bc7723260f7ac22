package lease

import (
	"testing"
	"time"
)

// TestEntry: a refreshed entry stays live and its Sent moves to the
// refresh; one a refresh finds gone wakes its waiter once and is no longer
// live; Stop ends one without waking; nil is a valid, empty entry.
func TestEntry(t *testing.T) {
	var none *Entry
	if none.Live() {
		t.Error("nil entry is live")
	}
	at := time.Now()
	if got := none.Sent(at); !got.Equal(at) {
		t.Errorf("nil entry's Sent(at) = %v, want at", got)
	}
	none.Stop()

	k := NewKeeper()
	defer k.Close()
	f := newFakeGroup()
	g := k.NewGroup(f.renew)
	wakes := make(chan string, 4)
	sent := dueSoon()
	kept := k.AddEntry(sent, batchTTL, g, "kept", func() { wakes <- "kept" })
	gone := k.AddEntry(sent, batchTTL, g, "gone", func() { wakes <- "gone" })
	stopped := k.AddEntry(sent, batchTTL, g, "stopped", func() { wakes <- "stopped" })
	stopped.Stop() // it must never wake (checked at the end)

	c := f.next(t)
	before := time.Now()
	c.answer(nil, func(item any) error {
		if item == "gone" {
			return ErrGone
		}
		return nil
	})
	select {
	case who := <-wakes:
		if who != "gone" {
			t.Fatalf("woken: %q, want only the entry the refresh found gone", who)
		}
	case <-time.After(signalWait):
		t.Fatal("the entry found gone did not wake its waiter")
	}
	if gone.Live() {
		t.Error("an entry found gone is still live")
	}
	if !kept.Live() {
		t.Error("a refreshed entry is not live")
	}
	if got := kept.Sent(sent); !got.After(sent) || got.After(before) {
		t.Errorf("kept.Sent(the grant's send) = %v after it, want the refresh's send, between it and %v", got.Sub(sent), before.Sub(sent))
	}
	later := time.Now().Add(time.Hour)
	if got := kept.Sent(later); !got.Equal(later) {
		t.Error("Sent does not return the waiter's own write when it is the later one")
	}
	kept.Stop()
	gone.Stop()
	select {
	case who := <-wakes:
		t.Errorf("woken again: %q", who)
	default:
	}
}
