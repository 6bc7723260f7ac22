package semaphore_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/stopclock"
)

// The tests of this file put a script's state exactly on a bound it
// compares with its own clock (TIME), and one millisecond either side. On
// a real server no test can choose the millisecond a script runs in; on
// miniredis, whose clock stands still where the test set it, TIME reads
// msAt every time, so each bound is met exactly. They check the scripts'
// own arithmetic: the comparisons and expiries they compute from TIME.

// msAt is the stopped server clock of these tests (a whole millisecond).
var msAt = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// msNow is msAt in Unix milliseconds, as the scripts read it from TIME.
var msNow = msAt.UnixMilli()

// msRig is a miniredis whose clock stands at msAt, with the scripts loaded.
type msRig struct{ *stopclock.Rig }

func newMsRig(t *testing.T) *msRig { return &msRig{stopclock.New(t, msAt)} }

// ms is the text of msNow + d.
func ms(d int64) string { return strconv.FormatInt(msNow+d, 10) }

// pttl is a key's TTL in milliseconds (-2 without the key, as PTTL).
func (r *msRig) pttl(k string) int64 {
	if !r.MR.Exists(k) {
		return -2
	}
	return r.MR.TTL(k).Milliseconds()
}

// TestAcquireXBoundsMs: semaphore_acquire leaves ':x' (and the keys'
// expiry) alone only while ':x' >= now + need + 1, need being the lease:
// the common grant returns at once then, and save moves ':x' only below
// that bound. At the bound and above, ':x' stays; one ms below, it moves
// to now + need + 1 + lease/16 (or the permits key's later expiry).
func TestAcquireXBoundsMs(t *testing.T) {
	const lease = 60_000
	moved := ms(lease + 1 + lease/16)
	r := newMsRig(t)
	for _, c := range []struct {
		name  string
		x     int64 // ':x' - now
		n     string
		wantX string
	}{
		// The common grant (one permit): its check x >= now + need + 1.
		{"one permit, x at now+lease+1 (the bound): kept", lease + 1, "1", ms(lease + 1)},
		{"one permit, x at now+lease (1 ms under): moved", lease, "1", moved},
		{"one permit, x at now+lease+2 (1 ms over): kept", lease + 2, "1", ms(lease + 2)},
		// save's check x < now + need + 1 (two permits skip the common grant).
		{"two permits, x at now+lease+1 (the bound): kept", lease + 1, "2", ms(lease + 1)},
		{"two permits, x at now+lease (1 ms under): moved", lease, "2", moved},
		{"two permits, x at now+lease+2 (1 ms over): kept", lease + 2, "2", ms(lease + 2)},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.MR.FlushAll() // the state of this case only
			hash, permits := "{s}", "{s}:e"
			r.Do(t, "HSET", hash, ":cap", "3", ":x", ms(c.x))
			r.Do(t, "ZADD", permits, ms(lease), "a")
			r.Do(t, "PEXPIREAT", hash, ms(c.x))
			r.Do(t, "PEXPIREAT", permits, ms(c.x))
			if got := r.Exec(t, "semaphore_acquire", []string{hash, permits}, []string{"3", c.n, "b", strconv.Itoa(lease), "pa"}); got != "1" {
				t.Fatalf("acquire = %s, want 1 (granted)", got)
			}
			if got := r.MR.HGet(hash, ":x"); got != c.wantX {
				t.Errorf("':x' after the grant = now%+d, want now%+d", atoi(t, got)-msNow, atoi(t, c.wantX)-msNow)
			}
			want := atoi(t, c.wantX) - msNow
			for _, k := range []string{hash, permits} {
				if got := r.pttl(k); got != want {
					t.Errorf("PTTL of %s after the grant = %d, want %d (':x')", k, got, want)
				}
			}
		})
	}
}

func atoi(t *testing.T, s string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return v
}

// TestReleaseJudgesExpiryMs: semaphore_release counts a permit held only
// while its expiry is after now: a release in the very millisecond the
// permit ends answers 0, one ms before it 1. The permit goes either way.
func TestReleaseJudgesExpiryMs(t *testing.T) {
	r := newMsRig(t)
	for _, c := range []struct {
		name  string
		score int64 // the permit's expiry - now
		want  string
	}{
		{"expiry at now (the bound): not held", 0, "0"},
		{"expiry at now+1: held", 1, "1"},
		{"expiry at now-1: not held", -1, "0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.MR.FlushAll() // the state of this case only
			hash, permits := "{s}", "{s}:e"
			r.Do(t, "HSET", hash, ":cap", "2", ":x", ms(60_000))
			r.Do(t, "ZADD", permits, ms(c.score), "a", ms(60_000), "b")
			if got := r.Exec(t, "semaphore_release", []string{hash, permits, "{s}:w"}, []string{"a", "p"}); got != c.want {
				t.Errorf("release = %s, want %s", got, c.want)
			}
			if left, err := r.MR.ZMembers(permits); err != nil || fmt.Sprint(left) != "[b]" {
				t.Errorf("permits after the release = %v (%v), want [b]", left, err)
			}
		})
	}
}

// TestRenewBatchJudgesExpiryMs: semaphore_renew_batch renews a permit only
// while its expiry is after now: a renewal in the very millisecond the
// permit ends answers 0 and leaves it as it was.
func TestRenewBatchJudgesExpiryMs(t *testing.T) {
	const lease = 60_000
	r := newMsRig(t)
	for _, c := range []struct {
		name      string
		score     int64 // the permit's expiry - now
		want      string
		wantScore int64
	}{
		{"expiry at now (the bound): not renewed", 0, "[0]", 0},
		{"expiry at now+1: renewed", 1, "[1]", lease},
		{"expiry at now-1: not renewed", -1, "[0]", -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.MR.FlushAll() // the state of this case only
			hash, permits := "{s}", "{s}:e"
			r.Do(t, "HSET", hash, ":cap", "2", ":x", ms(lease))
			r.Do(t, "ZADD", permits, ms(c.score), "a", ms(lease/2), "b")
			if got := r.Exec(t, "semaphore_renew_batch", []string{hash, permits}, []string{strconv.Itoa(lease), "1", "a"}); got != c.want {
				t.Errorf("renew = %s, want %s", got, c.want)
			}
			if got, err := r.MR.ZScore(permits, "a"); err != nil || int64(got)-msNow != c.wantScore {
				t.Errorf("the permit's expiry after the renewal = now%+d (%v), want now%+d", int64(got)-msNow, err, c.wantScore)
			}
		})
	}
}

// TestQueueRefreshBoundsMs: semaphore_queue_refresh answers 2 (look for
// yourself) when its semaphore's first permit has expired (expiry <= now)
// or the head's queue entry has (expiry <= now) while permits are free,
// and extends the queue keys only when their TTL is under the lease.
func TestQueueRefreshBoundsMs(t *testing.T) {
	const lease = 60_000
	live := ms(lease)
	r := newMsRig(t)
	for _, c := range []struct {
		name     string
		first    int64  // the one permit's expiry - now
		cap      string // capacity
		head     int64  // the head w0's entry expiry - now (0: no w0)
		headW    string
		queueTTL int64 // the queue keys' TTL before
		want     string
		wantTTL  int64
	}{
		// The first permit's expiry (capacity 1, none free otherwise).
		{name: "first permit ends at now (the bound): 2", first: 0, cap: "1", queueTTL: 2 * lease, want: "[2]", wantTTL: 2 * lease},
		{name: "first permit ends at now+1: 1", first: 1, cap: "1", queueTTL: 2 * lease, want: "[1]", wantTTL: 2 * lease},
		{name: "first permit ends at now-1: 2", first: -1, cap: "1", queueTTL: 2 * lease, want: "[2]", wantTTL: 2 * lease},
		// The head's entry (one permit free, the head wants two).
		{name: "head entry ends at now (the bound): 2", first: lease, cap: "2", head: 0, headW: "2", queueTTL: 2 * lease, want: "[2]", wantTTL: 2 * lease},
		{name: "head entry ends at now+1: 1", first: lease, cap: "2", head: 1, headW: "2", queueTTL: 2 * lease, want: "[1]", wantTTL: 2 * lease},
		{name: "head entry ends at now-1: 2", first: lease, cap: "2", head: -1, headW: "2", queueTTL: 2 * lease, want: "[2]", wantTTL: 2 * lease},
		// The queue keys' TTL against the lease.
		{name: "queue TTL at the lease (the bound): kept", first: lease, cap: "1", queueTTL: lease, want: "[1]", wantTTL: lease},
		{name: "queue TTL 1 ms under the lease: extended", first: lease, cap: "1", queueTTL: lease - 1, want: "[1]", wantTTL: lease + lease/16},
		{name: "queue TTL 1 ms over the lease: kept", first: lease, cap: "1", queueTTL: lease + 1, want: "[1]", wantTTL: lease + 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.MR.FlushAll() // the state of this case only
			hash, permits, queue, entries := "{s}", "{s}:e", "{s}:q", "{s}:qe"
			r.Do(t, "HSET", hash, ":cap", c.cap, ":x", ms(2*lease))
			r.Do(t, "ZADD", permits, ms(c.first), "a")
			if c.headW != "" {
				r.Do(t, "ZADD", queue, "1", "w0", "2", "w1")
				r.Do(t, "HSET", entries, "w0", ms(c.head)+" "+c.headW, "w1", live+" 1")
			} else {
				r.Do(t, "ZADD", queue, "1", "w1")
				r.Do(t, "HSET", entries, "w1", live+" 1")
			}
			r.Do(t, "PEXPIRE", queue, strconv.FormatInt(c.queueTTL, 10))
			r.Do(t, "PEXPIRE", entries, strconv.FormatInt(c.queueTTL, 10))
			if got := r.Exec(t, "semaphore_queue_refresh", []string{hash, permits, queue, entries}, []string{strconv.Itoa(lease), "1", "w1", "1"}); got != c.want {
				t.Errorf("refresh = %s, want %s", got, c.want)
			}
			for _, k := range []string{queue, entries} {
				if got := r.pttl(k); got != c.wantTTL {
					t.Errorf("PTTL of %s after the refresh = %d, want %d", k, got, c.wantTTL)
				}
			}
		})
	}
}
