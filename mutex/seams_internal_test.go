package mutex

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestFairReapAgainAtOnce (issue 22, suspected, confirmed): a fair Lock of a
// free lock whose queue starts with more than 16 dead entries (waiters that
// died) drops 16 per call and answers "try again now". That answer was read
// as "the holder's lease ends in 0 ms", rounded up to 1 ms, which a fair
// waiter's wait turns into its ten-lease backstop: the Lock waited for the
// next refresh of its queue entry (which it did not even have) to wake it,
// though no release was coming. A fair TryLock reported the free lock held.
// Now both call again at once until the dead entries are gone.
//
// The refresh is pushed out of reach (recheck an hour), so that only the
// Lock's own calls can get it the lock within the test's time.
func TestFairReapAgainAtOnce(t *testing.T) {
	ctx := context.Background()
	l, srv := reviewLocker(t, Options{Fair: true})
	for _, try := range []bool{false, true} {
		name := "reap-again:" + strconv.FormatBool(try)
		m := reviewMutex(t, l, name)
		m.own().recheck = time.Hour
		// No hash (it would flag an empty queue: see mutex_lock's k), and
		// 40 dead entries: more than two calls' worth, so that the first
		// attempt and the one after the subscription leave some.
		if _, err := srv.Do("DEL", m.key(keyLock)); err != nil {
			t.Fatal(err)
		}
		for i := range 40 {
			id := "dead" + strconv.Itoa(i) + ".1"
			if _, err := srv.Do("ZADD", m.key(keyQueue), strconv.Itoa(i+1), id); err != nil {
				t.Fatal(err)
			}
			if _, err := srv.Do("HSET", m.key(keyEntries), id, "1 dead"); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range []string{m.key(keyQueue), m.key(keyEntries)} {
			if _, err := srv.Do("PEXPIRE", k, "60000"); err != nil {
				t.Fatal(err)
			}
		}
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var err error
		if try {
			err = m.TryLock(lctx)
		} else {
			err = m.Lock(lctx)
		}
		cancel()
		if err != nil {
			t.Fatalf("try=%v: the lock is free with only dead waiters queued, got %v", try, err)
		}
		if n, _ := srv.Do("ZCARD", m.key(keyQueue)); n != "0" {
			t.Errorf("try=%v: %s entries left in the queue, want none", try, n)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
