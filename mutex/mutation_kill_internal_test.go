package mutex

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestMultiErrNamesFirstLostMember: when several members of a MultiMutex
// have lost their holds by the time Err is first asked, Err reports the
// first of them in lock order (the order every process locks in). A Go
// mutant that kept looking after the first lost member (continue for
// break) reported the last one, and no test lost two members before
// asking: the public API cannot tell when each member's loss has landed,
// so this test waits on the members themselves.
func TestMultiErrNamesFirstLostMember(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, srv := reviewLocker(t, Options{WatchdogLease: 600 * time.Millisecond})
	mm, err := l.NewMultiMutex([]string{"multi-first:a:" + t.Name(), "multi-first:b:" + t.Name(), "multi-first:c:" + t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	if err := mm.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// The first and the last member in lock order lose their holds.
	first, last := mm.ms[0], mm.ms[len(mm.ms)-1]
	for _, m := range []*Mutex{first, last} {
		if _, err := srv.Do("DEL", m.key(keyLock)); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []*Mutex{first, last} {
		select {
		case <-m.Lost():
		case <-ctx.Done():
			t.Fatalf("member %q was not told of its loss", m.Name())
		}
	}
	err = mm.Err()
	if err == nil || !strings.Contains(err.Error(), first.Name()) || strings.Contains(err.Error(), last.Name()) {
		t.Errorf("Err = %v, want the loss of %q, the first lost member in lock order", err, first.Name())
	}
	_ = mm.Unlock(ctx)
}
