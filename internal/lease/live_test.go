package lease

import (
	"testing"
	"time"
)

// TestLive: a grant holds from its request's send until End, ttl minus the
// margin later, and not at End: the keeper declares a lease lost there too.
func TestLive(t *testing.T) {
	sent := time.Unix(1000, 0)
	for _, ttl := range []time.Duration{MinLease, 300 * time.Millisecond, 30 * time.Second, time.Hour} {
		end := End(sent, ttl)
		if want := sent.Add(ttl - Margin(ttl)); !end.Equal(want) {
			t.Fatalf("End(sent, %v) = %v, want %v", ttl, end, want)
		}
		if !Live(sent, ttl, sent) || !Live(sent, ttl, end.Add(-time.Nanosecond)) {
			t.Fatalf("ttl %v: not live before End", ttl)
		}
		if Live(sent, ttl, end) || Live(sent, ttl, end.Add(time.Hour)) {
			t.Fatalf("ttl %v: live at or after End", ttl)
		}
	}
}

// TestLeaseLive: a tracked lease is live until its deadline, and not once
// stopped.
func TestLeaseLive(t *testing.T) {
	k := NewKeeper()
	defer k.Close()
	sent := time.Now()
	l := k.Add(sent, time.Hour, nil, func(error) {})
	if !l.Live(sent) || l.Live(End(sent, time.Hour)) {
		t.Fatal("Live disagrees with End")
	}
	l.Stop()
	if l.Live(sent) {
		t.Fatal("a stopped lease is live")
	}
}
