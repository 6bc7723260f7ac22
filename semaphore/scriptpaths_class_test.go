package semaphore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// Class tests of the plain semaphore's scripts (issue 32): semaphore_acquire,
// semaphore_release and semaphore_renew_batch (and one path of
// semaphore_queue_refresh) run by hand on states written key by key, with
// the whole state read back after each call (see qcase.dump in
// queue_script_test.go): every field, score and expiry, the reply, the
// messages heard on the wake-up channel and how many calls of the commands
// that matter (PUBLISH and SPUBLISH among them) the script made. Each case sits on one path of a script and on a
// bound of it, and the cases come in pairs across the bound: what must be
// written beside what must be left, what must be granted beside what must
// be refused. A listener of the channel hears PUBLISH only (a single
// server delivers SPUBLISH to SSUBSCRIBE alone), so the counts tell the
// two apart both ways.

// execAny runs the script called name as exec does, for a script that
// answers an integer or an array of integers.
func (q *queueScript) execAny(t *testing.T, name string, keys, args, count []string) string {
	t.Helper()
	s := script(t, q.e, name)
	before := commandCalls(t, q.srv)
	r := s.Exec(context.Background(), keys, args)
	var b strings.Builder
	if v, err := r.AsInt64(); err == nil {
		fmt.Fprintf(&b, "reply %d\n", v)
	} else if vs, err := r.AsIntSlice(); err == nil {
		fmt.Fprintf(&b, "reply %v\n", vs)
	} else {
		t.Fatalf("%s %q: %v", name, args, err)
	}
	after := commandCalls(t, q.srv)
	if len(count) > 0 {
		b.WriteString("calls")
		for _, cmd := range count {
			fmt.Fprintf(&b, " %s=%d", cmd, after[cmd]-before[cmd])
		}
		b.WriteString("\n")
	}
	return b.String()
}

// scriptCase is one call of a plain semaphore script on a state.
type scriptCase struct {
	name  string
	state qstate
	args  []string // ARGV
	count []string // commands whose calls the case counts
	want  string
	// channel: "" sends the wake-up channel (the listened one) as
	// KEYS[3]; "none" sends no KEYS[3] (the script then names the same
	// channel itself); "other" sends another channel, not listened to.
	channel string
}

func runScriptCases(t *testing.T, name string, cases []scriptCase) {
	t.Helper()
	q := newQueueScript(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			qc := q.start(t, c.state)
			keys := qc.keys[:3]
			switch c.channel {
			case "none":
				keys = qc.keys[:2]
			case "other":
				keys = []string{qc.keys[0], qc.keys[1], qc.keys[2] + "-other"}
			}
			got := q.execAny(t, name, keys, c.args, c.count)
			got += qc.dump(t)
			slack := serverMs(t, q.e) - qc.base + 1
			want := trimState(c.want)
			if !matchState(got, want, slack) {
				t.Errorf("%s %q (times within %d ms):\n%s\nwant\n%s", name, c.args, slack, got, want)
			}
		})
	}
}

// TestAcquireScriptPaths: semaphore_acquire's paths. The common grant
// writes nothing but the permit; a grant that changes the hash (a heavier
// permit, after a wait, with ':x' short of its end) writes exactly that; a
// call that does not fit as things are reclaims expired permits first and
// then grants through its second grant (the ZADD after the reclaim, whose
// HSET and PEXPIREAT are checked here), announcing the capacity it freed
// and did not take by PUBLISH or SPUBLISH as ARGV[5] says; a call with
// n = 0 reports, and one refused answers the wait, with ':w' set by an
// Acquire and not by a TryAcquire.
func TestAcquireScriptPaths(t *testing.T) {
	count := []string{"hset", "pexpireat", "publish", "spublish"}
	// The common grant's calls: nothing read beyond the four of the
	// header (no ZSCORE, no ZRANGE of the reclaim).
	quick := []string{"hset", "pexpireat", "zscore", "zrange"}
	runScriptCases(t, "semaphore_acquire", []scriptCase{
		{
			name: "the common grant writes the permit only",
			state: qstate{
				hash:    []string{":cap", "3", ":x", live},
				permits: []string{"a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"3", "1", "p", "60000", "pa"},
			count: quick,
			want: `reply 1
				calls hset=0 pexpireat=0 zscore=0 zrange=0
				hash :cap=3 :x=t+600000 | expires t+600000 last+0
				permits p=t~+60000 a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a grant that fills the capacity exactly, of two permits, writes its weight",
			state: qstate{
				hash:    []string{":cap", "3", ":x", live},
				permits: []string{"a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"3", "2", "p", "60000", "pa"},
			count: quick,
			want: `reply 1
				calls hset=1 pexpireat=0 zscore=0 zrange=0
				hash :cap=3 :h=1 :x=t+600000 p=2 | expires t+600000 last+0
				permits p=t~+60000 a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "the grant of an Acquire that waited sets ':w'",
			state: qstate{
				hash:    []string{":cap", "3", ":x", live},
				permits: []string{"a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"3", "1", "p", "60000", "pw"},
			count: count,
			want: `reply 1
				calls hset=1 pexpireat=0 publish=0 spublish=0
				hash :cap=3 :w=1 :x=t+600000 | expires t+600000 last+0
				permits p=t~+60000 a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a grant whose end passes ':x' moves it and both keys' expiry",
			state: qstate{
				hash:    []string{":cap", "3", ":x", "t+20000"},
				permits: []string{"a", live},
				expire:  map[int]string{0: "t+20000", 1: "t+20000"},
			},
			args:  []string{"3", "1", "p", "60000", "pa"},
			count: count,
			want: `reply 1
				calls hset=1 pexpireat=2 publish=0 spublish=0
				hash :cap=3 :x=t~+63751 | expires t~+63751 last~-536249
				permits p=t~+60000 a=t+600000 | expires t~+63751 last~-536249
				queue -
				entries -
				published []`,
		},
		{
			name: "the keys outlive a new permit by 1 + lease/16 ms exactly",
			args: []string{"3", "1", "p", "959999", "pa"},
			want: `reply 1
				hash :cap=3 :x=t~+1019999 | expires t~+1019999 last+60000
				permits p=t~+959999 | expires t~+1019999 last+60000
				queue -
				entries -
				published []`,
		},
		{
			name: "permits listed without a state hash count nowhere: deleted before the grant",
			state: qstate{
				permits: []string{"old", live, "older", live},
				expire:  map[int]string{1: live},
			},
			args: []string{"1", "1", "p", "60000", "pa"},
			want: `reply 1
				hash :cap=1 :x=t~+63751 | expires t~+63751 last+3751
				permits p=t~+60000 | expires t~+63751 last+3751
				queue -
				entries -
				published []`,
		},
		{
			// (The permits set the grant makes gets no expiry here: ':x'
			// says both keys live past the permit, which the operator's
			// DEL of the set made untrue. The first call after the hash
			// expires deletes the set.)
			name: "a hash left with no permit listed: its ':h' counts nothing and is cleared, by the common grant too",
			state: qstate{
				hash:   []string{":cap", "3", ":h", "2", ":x", live},
				expire: map[int]string{0: live},
			},
			args:  []string{"3", "1", "p", "60000", "pa"},
			count: quick,
			want: `reply 1
				calls hset=1 pexpireat=0 zscore=0 zrange=0
				hash :cap=3 :h=0 :x=t+600000 | expires t+600000 last~+540000
				permits p=t~+60000 | expires none
				queue -
				entries -
				published []`,
		},
		{
			name: "a hash left with no permit listed takes the caller's capacity, whatever n reads like",
			state: qstate{
				hash:   []string{":cap", "3", ":h", "2", ":x", live},
				expire: map[int]string{0: live},
			},
			args:  []string{"4", "3", "p", "60000", "pa"},
			count: count,
			want: `reply 1
				calls hset=1 pexpireat=0 publish=0 spublish=0
				hash :cap=4 :h=2 :x=t+600000 p=3 | expires t+600000 last~+540000
				permits p=t~+60000 | expires none
				queue -
				entries -
				published []`,
		},
		{
			name: "one heavy permit listed counts its whole weight: two more do not fit in three",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "1", "a", "2", ":x", live},
				permits: []string{"a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"3", "2", "p", "60000", "pt"},
			count: count,
			want: `reply [0 2 3 ~600000]
				calls hset=0 pexpireat=0 publish=0 spublish=0
				hash :cap=3 :h=1 :x=t+600000 a=2 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "another capacity while a permit is held, with n reading like the stored one: -1",
			state: qstate{
				hash:    []string{":cap", "3", ":x", live},
				permits: []string{"a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args: []string{"4", "3", "p", "60000", "pa"},
			want: `reply [-1 1 3 ~600000]
				hash :cap=3 :x=t+600000 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a set capacity grants a caller of another capacity under it, writing nothing but the permit",
			state: qstate{
				hash:    []string{":cap", "2", ":set", "90000", ":x", live},
				permits: []string{"a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"4", "1", "p", "60000", "pa"},
			count: quick,
			want: `reply 1
				calls hset=0 pexpireat=0 zscore=0 zrange=0
				hash :cap=2 :set=90000 :x=t+600000 | expires t+600000 last+0
				permits p=t~+60000 a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a grant whose end passes ':x' never moves an expiry another script set later: it takes that one",
			state: qstate{
				hash:    []string{":cap", "3", ":x", "t+20000"},
				permits: []string{"a", "t+20000"},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"3", "1", "p", "60000", "pa"},
			count: count,
			want: `reply 1
				calls hset=1 pexpireat=2 publish=0 spublish=0
				hash :cap=3 :x=t~+600000 | expires t~+600000 last~+540000
				permits a=t+20000 p=t~+60000 | expires t~+600000 last~+540000
				queue -
				entries -
				published []`,
		},
		{
			name: "a set capacity whose retention reads like the caller's capacity still applies",
			state: qstate{
				hash:    []string{":cap", "2", ":set", "4", ":x", live},
				permits: []string{"a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"4", "2", "p", "60000", "pt"},
			count: count,
			want: `reply [0 1 2 ~600000]
				calls hset=0 pexpireat=0 publish=0 spublish=0
				hash :cap=2 :set=4 :x=t+600000 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "one permit more than fits: refused, nothing reclaimed or written but ':w'",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "1", "a", "2", ":x", live},
				permits: []string{"a", live, "b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"3", "1", "p", "60000", "pa"},
			count: count,
			want: `reply ~-600001
				calls hset=1 pexpireat=0 publish=0 spublish=0
				hash :cap=3 :h=1 :w=1 :x=t+600000 a=2 | expires t+600000 last+0
				permits a=t+600000 b=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a refused TryAcquire sets no ':w'",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "1", "a", "2", ":x", live},
				permits: []string{"a", live, "b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"3", "1", "p", "60000", "pt"},
			count: count,
			want: `reply ~-600001
				calls hset=0 pexpireat=0 publish=0 spublish=0
				hash :cap=3 :h=1 :x=t+600000 a=2 | expires t+600000 last+0
				permits a=t+600000 b=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "the second grant: a heavy expired permit reclaimed, then a grant that fills the capacity exactly, nothing announced",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "1", "gone", "2", ":x", "t+20000"},
				permits: []string{"gone", dead, "a", live},
				expire:  map[int]string{0: "t+20000", 1: "t+20000"},
			},
			args:  []string{"3", "2", "p", "60000", "pa"},
			count: count,
			want: `reply 1
				calls hset=2 pexpireat=2 publish=0 spublish=0
				hash :cap=3 :h=1 :x=t~+63751 p=2 | expires t~+63751 last~-536249
				permits p=t~+60000 a=t+600000 | expires t~+63751 last~-536249
				queue -
				entries -
				published []`,
		},
		{
			name: "the second grant leaves capacity it freed: announced by PUBLISH",
			state: qstate{
				hash:    []string{":cap", "4", ":h", "1", "gone", "2", ":x", live},
				permits: []string{"gone", dead, "a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"4", "2", "p", "60000", "pw"},
			count: count,
			want: `reply 1
				calls hset=2 pexpireat=0 publish=1 spublish=0
				hash :cap=4 :h=1 :w=1 :x=t+600000 p=2 | expires t+600000 last+0
				permits p=t~+60000 a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published ["1"]`,
		},
		{
			name: "the second grant leaves capacity it freed: announced by SPUBLISH in mode s",
			state: qstate{
				hash:    []string{":cap", "4", ":h", "1", "gone", "2", ":x", live},
				permits: []string{"gone", dead, "a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"4", "2", "p", "60000", "sa"},
			count: count,
			want: `reply 1
				calls hset=2 pexpireat=0 publish=0 spublish=1
				hash :cap=4 :h=1 :x=t+600000 p=2 | expires t+600000 last+0
				permits p=t~+60000 a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a retry whose own grant expired: reclaimed and granted again, counted once",
			state: qstate{
				hash:    []string{":cap", "2", ":x", live},
				permits: []string{"p", dead, "a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"2", "1", "p", "60000", "pa"},
			count: count,
			want: `reply 1
				calls hset=0 pexpireat=0 publish=0 spublish=0
				hash :cap=2 :x=t+600000 | expires t+600000 last+0
				permits p=t~+60000 a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a retry whose grant is live: renewed, not counted twice",
			state: qstate{
				hash:    []string{":cap", "2", ":x", live},
				permits: []string{"p", "t+30000", "a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"2", "1", "p", "60000", "pa"},
			count: count,
			want: `reply 1
				calls hset=0 pexpireat=0 publish=0 spublish=0
				hash :cap=2 :x=t+600000 | expires t+600000 last+0
				permits p=t~+60000 a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "n = 0 on an idle semaphore: the caller's capacity, nothing used, no expiry known",
			args: []string{"5", "0", "p", "60000", "pa"},
			want: `reply [1 0 5 -1]
				hash -
				permits -
				queue -
				entries -
				published []`,
		},
		{
			name: "n = 0 reclaims and announces by PUBLISH; the wait is the first live permit's",
			state: qstate{
				hash:    []string{":cap", "3", ":x", live},
				permits: []string{"gone", dead, "a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"3", "0", "p", "60000", "pa"},
			count: count,
			want: `reply [1 1 3 ~600000]
				calls hset=0 pexpireat=0 publish=1 spublish=0
				hash :cap=3 :x=t+600000 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published ["2"]`,
		},
		{
			name: "n = 0 reclaims and announces by SPUBLISH in mode s",
			state: qstate{
				hash:    []string{":cap", "3", ":x", live},
				permits: []string{"gone", dead, "a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"3", "0", "p", "60000", "st"},
			count: count,
			want: `reply [1 1 3 ~600000]
				calls hset=0 pexpireat=0 publish=0 spublish=1
				hash :cap=3 :x=t+600000 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "n above the capacity with nothing held: -2, no expiry known",
			args: []string{"3", "4", "p", "60000", "pa"},
			want: `reply [-2 0 3 -1]
				hash -
				permits -
				queue -
				entries -
				published []`,
		},
		{
			name: "another capacity while a permit is held: -1 with the stored capacity",
			state: qstate{
				hash:    []string{":cap", "3", ":x", live},
				permits: []string{"a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args: []string{"4", "1", "p", "60000", "pa"},
			want: `reply [-1 1 3 ~600000]
				hash :cap=3 :x=t+600000 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "another capacity once the only permit held expired: reclaimed, and the caller's capacity applies",
			state: qstate{
				hash:    []string{":cap", "3", ":x", live},
				permits: []string{"gone", dead},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"4", "4", "p", "60000", "pa"},
			count: count,
			want: `reply 1
				calls hset=1 pexpireat=2 publish=0 spublish=0
				hash :cap=4 :h=3 :x=t~+63751 p=4 | expires t~+63751 last+3751
				permits p=t~+60000 | expires t~+63751 last+3751
				queue -
				entries -
				published []`,
		},
		{
			// A retry after a lost reply, its first grant expired and the
			// only permit: granted again, and not reclaimed with the
			// others (it is listed before they go).
			name: "every permit expired, the caller's own the oldest: granted again, not reclaimed",
			state: qstate{
				hash:    []string{":cap", "3", ":x", live},
				permits: []string{"p", "t-200000", "gone", dead}, // p first
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"3", "1", "p", "60000", "pa"},
			count: count,
			want: `reply 1
				calls hset=1 pexpireat=2 publish=1 spublish=0
				hash :cap=3 :x=t~+63751 | expires t~+63751 last+3751
				permits p=t~+60000 | expires t~+63751 last+3751
				queue -
				entries -
				published ["2"]`,
		},
		{
			name: "a set capacity applies whatever the caller brings, also with nothing held",
			state: qstate{
				hash:   []string{":cap", "2", ":set", "90000", ":x", live},
				expire: map[int]string{0: live},
			},
			args: []string{"4", "3", "p", "60000", "pa"},
			want: `reply [-2 0 2 -1]
				hash :cap=2 :set=90000 :x=t+600000 | expires t+600000
				permits -
				queue -
				entries -
				published []`,
		},
	})
}

// TestRenewBatchScriptPaths: semaphore_renew_batch's answers and writes,
// on two semaphores per call. A live permit is renewed (1) and its
// semaphore's keys then expire at the latest of its last permit, the new
// expiry, ':x' and now + ':set'; an expired, unlisted or unhashed permit is
// not (0) and its semaphore's keys are left as they were; a key of another
// type answers -1 for its own semaphore's permits only.
func TestRenewBatchScriptPaths(t *testing.T) {
	q := newQueueScript(t)
	count := []string{"pexpireat", "zadd"}
	for _, c := range []struct {
		name   string
		states [2]qstate
		args   []string // after the lease (60000): j, id, ...
		want   string
	}{
		{
			name: "live permits renewed; the keys' expiry is the latest permit's, or ':x' when that is later",
			states: [2]qstate{
				{
					hash:    []string{":cap", "3", ":x", "t+20000"},
					permits: []string{"a", "t+10000", "b", "t+50000"},
					expire:  map[int]string{0: "t+20000", 1: "t+20000"},
				},
				{
					hash:    []string{":cap", "3", ":x", "t+90000"},
					permits: []string{"c", "t+10000"},
					expire:  map[int]string{0: "t+90000", 1: "t+90000"},
				},
			},
			args: []string{"1", "a", "2", "c"},
			want: `reply [1 1]
				calls pexpireat=4 zadd=2
				hash :cap=3 :x=t+20000 | expires t~+60000 last+0
				permits b=t+50000 a=t~+60000 | expires t~+60000 last+0
				queue -
				entries -
				published []
				hash :cap=3 :x=t+90000 | expires t+90000 last~+30000
				permits c=t~+60000 | expires t+90000 last~+30000
				queue -
				entries -
				published []`,
		},
		{
			name: "a permit listed beyond the new expiry keeps the keys to its own; ':set' from now when later",
			states: [2]qstate{
				{
					hash:    []string{":cap", "3", ":x", "t+20000"},
					permits: []string{"a", "t+10000", "b", "t+80000"},
					expire:  map[int]string{0: "t+80000", 1: "t+80000"},
				},
				{
					hash:    []string{":cap", "3", ":set", "100000", ":x", "t+20000"},
					permits: []string{"c", "t+10000"},
					expire:  map[int]string{0: "t+20000", 1: "t+20000"},
				},
			},
			args: []string{"1", "a", "2", "c"},
			want: `reply [1 1]
				calls pexpireat=4 zadd=2
				hash :cap=3 :x=t+20000 | expires t+80000 last+0
				permits a=t~+60000 b=t+80000 | expires t+80000 last+0
				queue -
				entries -
				published []
				hash :cap=3 :set=100000 :x=t+20000 | expires t~+100000 last~+40000
				permits c=t~+60000 | expires t~+100000 last~+40000
				queue -
				entries -
				published []`,
		},
		{
			name: "expired, unlisted and unhashed permits are not renewed, and their keys not touched",
			states: [2]qstate{
				{
					hash:    []string{":cap", "3", ":x", "t+20000"},
					permits: []string{"gone", dead, "b", "t+20000"},
					expire:  map[int]string{0: "t+20000", 1: "t+20000"},
				},
				{
					permits: []string{"c", "t+20000"},
					expire:  map[int]string{1: "t+20000"},
				},
			},
			args: []string{"1", "gone", "1", "x", "2", "c"},
			want: `reply [0 0 0]
				calls pexpireat=0 zadd=0
				hash :cap=3 :x=t+20000 | expires t+20000 last+0
				permits gone=t-100000 b=t+20000 | expires t+20000 last+0
				queue -
				entries -
				published []
				hash -
				permits c=t+20000 | expires t+20000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a permits set of another type answers -1 for its semaphore only",
			states: [2]qstate{
				{
					hash:   []string{":cap", "3", ":x", "t+20000"},
					str:    map[int]string{1: "x"},
					expire: map[int]string{0: "t+20000"},
				},
				{
					hash:    []string{":cap", "3", ":x", "t+20000"},
					permits: []string{"c", "t+10000"},
					expire:  map[int]string{0: "t+20000", 1: "t+20000"},
				},
			},
			args: []string{"1", "a", "2", "c", "1", "b"},
			want: `reply [-1 1 -1]
				calls pexpireat=2 zadd=1
				hash :cap=3 :x=t+20000 | expires t+20000
				permits string x
				queue -
				entries -
				published []
				hash :cap=3 :x=t+20000 | expires t~+60000 last+0
				permits c=t~+60000 | expires t~+60000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a state hash of another type answers -1 for its semaphore only",
			states: [2]qstate{
				{
					str:     map[int]string{0: "x"},
					permits: []string{"a", "t+10000"},
					expire:  map[int]string{1: "t+20000"},
				},
				{
					hash:    []string{":cap", "3", ":x", "t+20000"},
					permits: []string{"c", "t+10000"},
					expire:  map[int]string{0: "t+20000", 1: "t+20000"},
				},
			},
			args: []string{"1", "a", "2", "c"},
			want: `reply [-1 1]
				calls pexpireat=2 zadd=1
				hash string x
				permits a=t+10000 | expires t+20000 last+10000
				queue -
				entries -
				published []
				hash :cap=3 :x=t+20000 | expires t~+60000 last+0
				permits c=t~+60000 | expires t~+60000 last+0
				queue -
				entries -
				published []`,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var keys []string
			var qcs []*qcase
			for _, st := range c.states {
				qc := q.start(t, st)
				qcs = append(qcs, qc)
				keys = append(keys, qc.keys[0], qc.keys[1])
			}
			got := q.execAny(t, "semaphore_renew_batch", keys, append([]string{"60000"}, c.args...), count)
			for _, qc := range qcs {
				got += qc.dump(t)
			}
			slack := serverMs(t, q.e) - qcs[0].base + 1
			want := trimState(c.want)
			if !matchState(got, want, slack) {
				t.Errorf("renew %q (times within %d ms):\n%s\nwant\n%s", c.args, slack, got, want)
			}
		})
	}
}

// TestReleaseScriptPaths: semaphore_release's paths. ARGV[2] chooses
// SPUBLISH ("s") or PUBLISH for the wake-up, sent only with ':w' set and
// worth the permits free (at least 1); ARGV[3] "n" releases without
// judging the expiry (a permit still listed counts as held), anything else
// judges it. A heavier permit takes its weight with it; the last permit
// takes the keys, but a set capacity, kept ':set' ms; a release that
// leaves permits makes both keys live at least ':set' ms.
func TestReleaseScriptPaths(t *testing.T) {
	count := []string{"publish", "spublish", "time", "pexpireat"}
	runScriptCases(t, "semaphore_release", []scriptCase{
		{
			name: "a live permit, judged, with a waiter: PUBLISH of the free count",
			state: qstate{
				hash:    []string{":cap", "4", ":h", "1", "b", "2", ":w", "1", ":x", live},
				permits: []string{"a", live, "b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "p"},
			count: count,
			want: `reply 1
				calls publish=1 spublish=0 time=1 pexpireat=0
				hash :cap=4 :h=1 :w=1 :x=t+600000 b=2 | expires t+600000 last+0
				permits b=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published ["2"]`,
		},
		{
			name: "ARGV[2] s: SPUBLISH, also when ARGV[3] is n",
			state: qstate{
				hash:    []string{":cap", "4", ":w", "1", ":x", live},
				permits: []string{"a", live, "b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "s", "n"},
			count: count,
			want: `reply 1
				calls publish=0 spublish=1 time=0 pexpireat=0
				hash :cap=4 :w=1 :x=t+600000 | expires t+600000 last+0
				permits b=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "ARGV[2] p: PUBLISH, also when ARGV[3] is s",
			state: qstate{
				hash:    []string{":cap", "4", ":w", "1", ":x", live},
				permits: []string{"a", live, "b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "p", "s"},
			count: count,
			want: `reply 1
				calls publish=1 spublish=0 time=1 pexpireat=0
				hash :cap=4 :w=1 :x=t+600000 | expires t+600000 last+0
				permits b=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published ["3"]`,
		},
		{
			name: "no waiter: nothing published",
			state: qstate{
				hash:    []string{":cap", "4", ":x", live},
				permits: []string{"a", live, "b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "p"},
			count: count,
			want: `reply 1
				calls publish=0 spublish=0 time=1 pexpireat=0
				hash :cap=4 :x=t+600000 | expires t+600000 last+0
				permits b=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "over the capacity (SetCapacity lowered it): the budget is still 1",
			state: qstate{
				hash:    []string{":cap", "1", ":set", "1000", ":h", "2", "b", "3", ":w", "1", ":x", live},
				permits: []string{"a", live, "b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "s"},
			count: count,
			want: `reply 1
				calls publish=0 spublish=1 time=1 pexpireat=0
				hash :cap=1 :h=2 :set=1000 :w=1 :x=t+600000 b=3 | expires t+600000 last+0
				permits b=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "an expired permit, judged: removed, not held",
			state: qstate{
				hash:    []string{":cap", "4", ":x", live},
				permits: []string{"a", dead, "b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "p", "j"},
			count: count,
			want: `reply 0
				calls publish=0 spublish=0 time=1 pexpireat=0
				hash :cap=4 :x=t+600000 | expires t+600000 last+0
				permits b=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "an expired permit, not judged: removed, held",
			state: qstate{
				hash:    []string{":cap", "4", ":x", live},
				permits: []string{"a", dead, "b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "p", "n"},
			count: count,
			want: `reply 1
				calls publish=0 spublish=0 time=0 pexpireat=0
				hash :cap=4 :x=t+600000 | expires t+600000 last+0
				permits b=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a permit not listed, judged: not held, nothing changes",
			state: qstate{
				hash:    []string{":cap", "4", ":w", "1", ":x", live},
				permits: []string{"b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "p"},
			count: count,
			want: `reply 0
				calls publish=0 spublish=0 time=0 pexpireat=0
				hash :cap=4 :w=1 :x=t+600000 | expires t+600000 last+0
				permits b=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name:    "no KEYS[3]: the wake-up goes to the state hash's name and ':w'",
			channel: "none",
			state: qstate{
				hash:    []string{":cap", "4", ":w", "1", ":x", live},
				permits: []string{"a", live, "b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "p", "n"},
			count: count,
			want: `reply 1
				calls publish=1 spublish=0 time=0 pexpireat=0
				hash :cap=4 :w=1 :x=t+600000 | expires t+600000 last+0
				permits b=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published ["3"]`,
		},
		{
			name:    "KEYS[3] another channel: the wake-up goes there only",
			channel: "other",
			state: qstate{
				hash:    []string{":cap", "4", ":w", "1", ":x", live},
				permits: []string{"a", live, "b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "p", "n"},
			count: count,
			want: `reply 1
				calls publish=1 spublish=0 time=0 pexpireat=0
				hash :cap=4 :w=1 :x=t+600000 | expires t+600000 last+0
				permits b=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a permit not listed, not judged: not held, nothing changes",
			state: qstate{
				hash:    []string{":cap", "4", ":w", "1", ":x", live},
				permits: []string{"b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "p", "n"},
			count: count,
			want: `reply 0
				calls publish=0 spublish=0 time=0 pexpireat=0
				hash :cap=4 :w=1 :x=t+600000 | expires t+600000 last+0
				permits b=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a heavy permit takes its weight; a set capacity makes the keys live ':set' ms",
			state: qstate{
				hash:    []string{":cap", "5", ":set", "900000", ":h", "3", "a", "3", "b", "2", ":x", live},
				permits: []string{"a", live, "b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "p"},
			count: count,
			want: `reply 1
				calls publish=0 spublish=0 time=2 pexpireat=2
				hash :cap=5 :h=1 :set=900000 :x=t+600000 b=2 | expires t~+900001 last~+300001
				permits b=t+600000 | expires t~+900001 last~+300001
				queue -
				entries -
				published []`,
		},
		{
			name: "a set capacity shorter than the keys' expiry leaves it",
			state: qstate{
				hash:    []string{":cap", "5", ":set", "500000", ":x", live},
				permits: []string{"a", live, "b", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "p"},
			count: count,
			want: `reply 1
				calls publish=0 spublish=0 time=1 pexpireat=0
				hash :cap=5 :set=500000 :x=t+600000 | expires t+600000 last+0
				permits b=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "the last permit with a set capacity: the hash keeps ':cap' and ':set', ':set' ms",
			state: qstate{
				hash:    []string{":cap", "5", ":set", "900000", ":h", "2", "a", "3", ":w", "1", ":x", live},
				permits: []string{"a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "p"},
			count: count,
			want: `reply 1
				calls publish=1 spublish=0 time=1 pexpireat=0
				hash :cap=5 :set=900000 | expires t~+900000
				permits -
				queue -
				entries -
				published ["5"]`,
		},
		{
			name: "the last permit: both keys go",
			state: qstate{
				hash:    []string{":cap", "5", ":h", "2", "a", "3", ":x", live},
				permits: []string{"a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			args:  []string{"a", "p"},
			count: count,
			want: `reply 1
				calls publish=0 spublish=0 time=1 pexpireat=0
				hash -
				permits -
				queue -
				entries -
				published []`,
		},
		{
			name: "no state hash: not held, the listed permit left",
			state: qstate{
				permits: []string{"a", live},
				expire:  map[int]string{1: live},
			},
			args:  []string{"a", "p", "n"},
			count: count,
			want: `reply 0
				calls publish=0 spublish=0 time=0 pexpireat=0
				hash -
				permits a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
	})
}

// TestQueueRefreshReadsHashWithoutWeight: semaphore_queue_refresh tells a
// waiter to look for itself when nothing is held, which it knows by the
// state hash's ':cap' (present whenever the hash is), not by ':h', which a
// hash of weight-one permits lacks (TestQueueRefreshScriptPaths writes
// ':h' 0 in every state). Both ways: full, nobody is told; with a permit
// free and a head that fits it, the first waiter is. And two bounds of the
// same check: ':h' counts only while a permit is listed (a leftover one
// with the set deleted frees the whole capacity), and a dead head is
// dropped by a pass only when permits are free (none free: nobody told).
func TestQueueRefreshReadsHashWithoutWeight(t *testing.T) {
	q := newQueueScript(t)
	for _, c := range []struct {
		name  string
		state qstate
		args  []string // after the lease; nil: w1 and w2, weight 1
		want  string
	}{
		{
			name: "a leftover ':h' with no permit listed counts nothing: a head of the whole capacity is told",
			state: qstate{
				hash:    []string{":cap", "2", ":h", "1", ":x", live},
				queue:   []string{"w1", "1"},
				entries: []string{"w1", live + " 2"},
				expire:  map[int]string{0: live, 3: live, 4: live},
			},
			args: []string{"1", "w1", "2"},
			want: `reply [2]
				hash :cap=2 :h=1 :x=t+600000 | expires t+600000
				permits -
				queue w1=1 | expires t+600000 last~+540000
				entries w1=t~+60000 2 | expires t+600000 last~+540000
				published []`,
		},
		{
			name: "no permit free and a dead head: nobody is told",
			state: qstate{
				hash:    []string{":cap", "2", ":x", live},
				permits: []string{"a", live, "b", live},
				queue:   []string{"d", "1", "w2", "2"},
				entries: []string{"d", dead + " 1", "w2", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			args: []string{"1", "w2", "1"},
			want: `reply [1]
				hash :cap=2 :x=t+600000 | expires t+600000 last+0
				permits a=t+600000 b=t+600000 | expires t+600000 last+0
				queue d=1 w2=2 | expires t+600000 last~+540000
				entries d=t-100000 1 w2=t~+60000 1 | expires t+600000 last~+540000
				published []`,
		},
		{
			name: "every permit live and none free",
			state: qstate{
				hash:    []string{":cap", "2", ":x", live},
				permits: []string{"a", live, "b", live},
				queue:   []string{"w1", "1", "w2", "2"},
				entries: []string{"w1", live + " 1", "w2", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			want: `reply [1 1]
				hash :cap=2 :x=t+600000 | expires t+600000 last+0
				permits a=t+600000 b=t+600000 | expires t+600000 last+0
				queue w1=1 w2=2 | expires t+600000 last~+540000
				entries w1=t~+60000 1 w2=t~+60000 1 | expires t+600000 last~+540000
				published []`,
		},
		{
			name: "a permit free and a head that fits it",
			state: qstate{
				hash:    []string{":cap", "3", ":x", live},
				permits: []string{"a", live, "b", live},
				queue:   []string{"w1", "1", "w2", "2"},
				entries: []string{"w1", live + " 1", "w2", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			want: `reply [2 1]
				hash :cap=3 :x=t+600000 | expires t+600000 last+0
				permits a=t+600000 b=t+600000 | expires t+600000 last+0
				queue w1=1 w2=2 | expires t+600000 last~+540000
				entries w1=t~+60000 1 w2=t~+60000 1 | expires t+600000 last~+540000
				published []`,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			qc := q.start(t, c.state)
			keys := []string{qc.keys[0], qc.keys[1], qc.keys[3], qc.keys[4]}
			args := c.args
			if args == nil {
				args = []string{"1", "w1", "1", "1", "w2", "1"}
			}
			got := q.execAny(t, "semaphore_queue_refresh", keys, append([]string{"60000"}, args...), nil)
			got += qc.dump(t)
			slack := serverMs(t, q.e) - qc.base + 1
			want := trimState(c.want)
			if !matchState(got, want, slack) {
				t.Errorf("refresh (times within %d ms):\n%s\nwant\n%s", slack, got, want)
			}
		})
	}
}

// TestReleaseSetsKeysSetMsFromItsClock: a release that leaves permits
// listed under a set capacity moves both keys' expiry to its own TIME +
// ':set' + 1 ms when they would expire sooner (the + 1: PTTL counts from a
// time up to 1 ms before the script's). On a real server that TIME cannot
// be read to the millisecond; on miniredis, whose clock stands still, the
// TTLs after the release are exact.
func TestReleaseSetsKeysSetMsFromItsClock(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	mr.SetTime(at)
	client := redistest.Client(t, mr.Addr())
	sc, err := scriptcache.New(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	release, err := sc.Script("semaphore_release")
	if err != nil {
		t.Fatal(err)
	}
	hash, permits := "{s}", "{s}:e"
	end := strconv.FormatInt(at.UnixMilli()+600_000, 10)
	for _, cmd := range [][]string{
		{"HSET", hash, ":cap", "5", ":set", "900000", ":x", end},
		{"ZADD", permits, end, "a", end, "b"},
		{"PEXPIREAT", hash, end},
		{"PEXPIREAT", permits, end},
	} {
		if err := client.Do(ctx, client.B().Arbitrary(cmd[0]).Keys(cmd[1]).Args(cmd[2:]...).Build()).Error(); err != nil {
			t.Fatalf("%q: %v", cmd, err)
		}
	}
	if got, err := release.Exec(ctx, []string{hash, permits, "{s}:w"}, []string{"a", "p"}).AsInt64(); err != nil || got != 1 {
		t.Fatalf("release = %d, %v; want 1", got, err)
	}
	for _, k := range []string{hash, permits} {
		if ttl := mr.TTL(k); ttl != 900001*time.Millisecond {
			t.Errorf("TTL of %s after the release = %v, want exactly 900.001s (':set' + 1 ms from the script's TIME)", k, ttl)
		}
	}
}
