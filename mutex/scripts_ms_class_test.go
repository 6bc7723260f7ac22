package mutex_test

import (
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/stopclock"
)

// The tests of this file put a lock script's state exactly on a bound it
// compares with its own clock (TIME), and one millisecond (or microsecond)
// either side. On a real server no test can choose the millisecond a
// script runs in; on miniredis, whose clock stands still where the test
// set it, TIME reads clkAt every time, so each bound is met exactly. They
// check the scripts' own arithmetic: the comparisons of a lease end, a
// mark end or a last token with TIME.

// clkAt is the stopped server clock of these tests; its microseconds are
// not a whole millisecond, so the scripts' ms and µs readings differ.
var clkAt = time.Date(2026, 1, 2, 3, 4, 5, 123_456_000, time.UTC)

var (
	clkMs = clkAt.UnixMilli() // TIME in ms, as the scripts compute now
	clkUs = clkAt.UnixMicro() // TIME in µs, as the scripts make a token
)

// clkMsText is the text of clkMs + d.
func clkMsText(d int64) string { return strconv.FormatInt(clkMs+d, 10) }

// clkRig is a miniredis whose clock stands at clkAt, with the scripts loaded.
type clkRig struct{ *stopclock.Rig }

func newClkRig(t *testing.T) *clkRig { return &clkRig{stopclock.New(t, clkAt)} }

// listen collects what is published on ch until the returned function,
// which publishes a last message of its own after everything the test
// ran (delivery is in order, and synchronous on miniredis), returns them.
func (r *clkRig) listen(t *testing.T, ch string) func() []string {
	t.Helper()
	sub := r.MR.NewSubscriber()
	sub.Subscribe(ch)
	var (
		mu   sync.Mutex
		got  []string
		end  = make(chan struct{})
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		for m := range sub.Messages() {
			if m.Message == "end of test" {
				close(end)
				continue
			}
			mu.Lock()
			got = append(got, m.Message)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		r.MR.Lock() // no publish runs while the subscriber goes
		sub.Unsubscribe(ch)
		sub.Close()
		r.MR.Unlock()
		<-done
	})
	return func() []string {
		r.MR.Publish(ch, "end of test")
		<-end
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
}

// TestRWLockHeldUntilLeaseEndMs: rwmutex_lock counts another owner's
// write hold only while its lease end e is after now: a Lock in the very
// millisecond e falls on takes the lock, one ms before it is refused.
func TestRWLockHeldUntilLeaseEndMs(t *testing.T) {
	granted := fmt.Sprint([]int64{1, 1, clkUs})
	r := newClkRig(t)
	for _, c := range []struct {
		name string
		e    int64 // the holder's lease end - now
		want string
	}{
		{"lease ends at now (the bound): granted", 0, granted},
		{"lease ends at now+1: refused", 1, "[0 1 0]"},
		{"lease ends at now-1: granted", -1, granted},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.MR.FlushAll() // the state of this case only
			r.Do(t, "HSET", "{rw}", "o", "other", "n", "1", "f", "5", "a", "x.1", "e", clkMsText(c.e), "c", "5")
			r.Do(t, "PEXPIRE", "{rw}", "60000")
			got := r.Exec(t, "rwmutex_lock", []string{"{rw}", "{rw}:r", "{rw}:x", "{rw}:m"},
				[]string{"me", "60000", "0", "y.1", "", "0", ""})
			if got != c.want {
				t.Errorf("lock = %s, want %s", got, c.want)
			}
		})
	}
}

// TestRWLockTokenAfterLastUs: rwmutex_lock's token is TIME in µs, or
// the last token + 1 when that is not less: a last token equal to TIME
// gives TIME + 1, never the same token twice.
func TestRWLockTokenAfterLastUs(t *testing.T) {
	r := newClkRig(t)
	for _, c := range []struct {
		name string
		last int64 // the last token - TIME in µs
		want int64 // the token - TIME in µs
	}{
		{"last token at TIME (the bound): TIME+1", 0, 1},
		{"last token at TIME-1: TIME", -1, 0},
		{"last token at TIME+1: TIME+2", 1, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.MR.FlushAll() // the state of this case only
			f := strconv.FormatInt(clkUs+c.last, 10)
			r.Do(t, "HSET", "{rw}", "f", f, "c", f)
			r.Do(t, "PEXPIRE", "{rw}", "60000")
			got := r.Exec(t, "rwmutex_lock", []string{"{rw}", "{rw}:r", "{rw}:x", "{rw}:m"},
				[]string{"me", "60000", "0", "y.1", "", "0", ""})
			if want := fmt.Sprint([]int64{1, 1, clkUs + c.want}); got != want {
				t.Errorf("lock = %s, want %s (token TIME%+d µs)", got, want, c.want)
			}
		})
	}
}

// TestLockTokenAfterLastUs: mutex_lock's token is TIME in µs, or the
// record's last token + 1 when that is not less: a last token equal to
// TIME gives TIME + 1, never the same token twice.
func TestLockTokenAfterLastUs(t *testing.T) {
	r := newClkRig(t)
	for _, c := range []struct {
		name string
		last int64 // the last token - TIME in µs
		want int64 // the token - TIME in µs
	}{
		{"last token at TIME (the bound): TIME+1", 0, 1},
		{"last token at TIME-1: TIME", -1, 0},
		{"last token at TIME+1: TIME+2", 1, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.MR.FlushAll() // the state of this case only
			f := strconv.FormatInt(clkUs+c.last, 10)
			r.Do(t, "SET", "{m}", "L:"+f+":"+f+"|", "PX", "60000")
			got := r.Exec(t, "mutex_lock", []string{"{m}", "{m}:x", "{m}:q", "{m}:qe"}, []string{"60000", "me", "y.1"})
			if want := strconv.FormatInt(clkUs+c.want, 10); got != want {
				t.Errorf("lock = %s, want %s (token TIME%+d µs)", got, want, c.want)
			}
		})
	}
}

// TestRWForceWriterLeaseEndMs: rwmutex_force reports a writer only while
// its lease end e is after now: a ForceUnlock in the very millisecond e
// falls on answers 0 for the writer (rwmutex_lock counts that hold over).
func TestRWForceWriterLeaseEndMs(t *testing.T) {
	r := newClkRig(t)
	for _, c := range []struct {
		name string
		e    int64 // the writer's lease end - now
		want string
	}{
		{"lease ends at now (the bound): no writer", 0, "[0 0]"},
		{"lease ends at now+1: a writer", 1, "[1 0]"},
		{"lease ends at now-1: no writer", -1, "[0 0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.MR.FlushAll() // the state of this case only
			r.Do(t, "HSET", "{rw}", "o", "other", "n", "1", "f", "5", "a", "x.1", "e", clkMsText(c.e), "c", "5")
			r.Do(t, "PEXPIRE", "{rw}", "60000")
			got := r.Exec(t, "rwmutex_force", []string{"{rw}", "{rw}:r", "{rw}:rw", "{rw}:ww"}, []string{"p", "1000"})
			if got != c.want {
				t.Errorf("force = %s, want %s", got, c.want)
			}
		})
	}
}

// TestRWAbandonMarkWakeMs: rwmutex_abandon, withdrawing the last writer's
// mark, wakes the readers only if the mark q was still running (q > now):
// a withdrawal in the very millisecond q falls on publishes nothing, as
// readers are let in from then on anyway.
func TestRWAbandonMarkWakeMs(t *testing.T) {
	r := newClkRig(t)
	for _, c := range []struct {
		name string
		q    int64 // the mark's end - now
		want string
	}{
		{"mark ends at now (the bound): no wake-up", 0, "[]"},
		{"mark ends at now+1: readers woken", 1, "[1000000]"},
		{"mark ends at now-1: no wake-up", -1, "[]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.MR.FlushAll() // the state of this case only
			q := clkMsText(c.q)
			r.Do(t, "HSET", "{rw}", "f", "5", "c", "5", "q", q)
			r.Do(t, "PEXPIRE", "{rw}", "60000")
			r.Do(t, "ZADD", "{rw}:m", q, "m1")
			r.Do(t, "PEXPIRE", "{rw}:m", "60000")
			published := r.listen(t, "{rw}:rw")
			got := r.Exec(t, "rwmutex_abandon", []string{"{rw}", "{rw}:r", "{rw}:x", "{rw}:rw", "{rw}:ww", "{rw}:m"},
				[]string{"me", "y.1", "m", "p", "1000", "60000", "m1"})
			if got != "1" {
				t.Errorf("abandon = %s, want 1 (the mark withdrawn)", got)
			}
			if pub := fmt.Sprint(published()); pub != c.want {
				t.Errorf("published on the readers' channel: %s, want %s", pub, c.want)
			}
		})
	}
}

// TestLockRefusalWaitMs: mutex_lock refuses a Lock while another owner
// holds, answering -1 - W, W the holder's PTTL in ms. In the last
// millisecond of the holder's record (a key is still there in the
// millisecond it expires: PTTL 0) that is -1, the header's answer for
// W = 0, not a table. miniredis reports PTTL 0 for a key with half a
// millisecond left, which its stopped clock keeps there.
func TestLockRefusalWaitMs(t *testing.T) {
	r := newClkRig(t)
	for _, c := range []struct {
		name string
		ttl  time.Duration // the holder's record's TTL
		want string
	}{
		{"holder's record in its last ms (PTTL 0): -1", 500 * time.Microsecond, "-1"},
		{"holder's record 1 ms from its end: -2", time.Millisecond, "-2"},
		{"holder's record 2 ms from its end: -3", 2 * time.Millisecond, "-3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.MR.FlushAll() // the state of this case only
			r.Do(t, "SET", "{m}", "L:5:5|1:x.1:other")
			r.MR.SetTTL("{m}", c.ttl)
			got := r.Exec(t, "mutex_lock", []string{"{m}", "{m}:x", "{m}:q", "{m}:qe"}, []string{"60000", "me", "y.1"})
			if got != c.want {
				t.Errorf("lock = %s, want %s", got, c.want)
			}
		})
	}
}

// TestRWInfoLeaseEndsMs: rwmutex_info reports a writer only while its
// lease end e is after now, and counts a reader only while its lease end
// is: in the very millisecond a lease ends on, RWInfo shows it gone, as
// rwmutex_lock and rwmutex_rlock then count it.
func TestRWInfoLeaseEndsMs(t *testing.T) {
	r := newClkRig(t)
	for _, c := range []struct {
		name string
		d    int64 // the writer's and the reader's lease ends - now
		want string
	}{
		{"leases end at now (the bound): none", 0, "[ 0 5 0 0 0]"},
		{"leases end at now+1: a writer and a reader", 1, "[other 1 5 1 1 0]"},
		{"leases end at now-1: none", -1, "[ 0 5 0 0 0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.MR.FlushAll() // the state of this case only
			r.Do(t, "HSET", "{rw}", "o", "other", "n", "1", "f", "5", "a", "x.1", "e", clkMsText(c.d), "c", "5")
			r.Do(t, "PEXPIRE", "{rw}", "60000")
			r.Do(t, "ZADD", "{rw}:r", clkMsText(c.d), "r.1")
			got := r.Exec(t, "rwmutex_info", []string{"{rw}", "{rw}:r"}, nil)
			if got != c.want {
				t.Errorf("info = %q, want %q", got, c.want)
			}
		})
	}
}
