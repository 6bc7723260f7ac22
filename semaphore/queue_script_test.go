package semaphore_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// The fair semaphore's queue script (lua/semaphore_queue.lua), run by hand
// on states written key by key, and the whole state read back after each
// call: the five keys (fields, members, scores, expiries), the reply, and
// what the call published. Each case states what the header promises for
// one path of the script, so that any change of any field, score, expiry,
// reply or message on that path shows, not only the ones a test was
// written for (issue 32: most mutants of this script survived a fresh
// sample). Most promises come in pairs: what must be refused and what must
// be allowed, at the bound.
//
// Times: a state is written relative to the server's clock when it is set
// up (base); "t+N" in a state or an expectation is base + N ms, and a
// number written "~N" (t~+N for a time) is N give or take the time the
// setup and the call took (the script's own TIME is a little later than
// base). Expiries far from now (a minute, ten minutes) keep every decision
// of the script clear of that slack.

// qstate is what the five keys of one fair semaphore hold before a call.
// Each list is of pairs; a value "t+N" is a time (see above).
type qstate struct {
	hash    []string       // state hash: field, value
	permits []string       // permits sorted set: id, expiry
	queue   []string       // queue: id, arrival number
	entries []string       // queue entries: id, "expiry weight" (or ':b', "id passes")
	expire  map[int]string // key index (0: hash .. 4: entries) -> its expiry time
	str     map[int]string // key index -> a string value (another type than the script's)
}

// qcall is one call of the script: ARGV[1..6].
type qcall struct {
	mode, capacity, n, id, ms string
	pub                       string // ARGV[6]: "s" for SPUBLISH; "" means "p"
}

// queueScript runs semaphore_queue on one server of its own (calls are
// counted in its commandstats), each case on a semaphore of its own.
type queueScript struct {
	srv    *redistest.Server
	e      *env
	script *scriptcache.Script
}

func newQueueScript(t *testing.T) *queueScript {
	t.Helper()
	srv := redistest.NewServer(t)
	e := newEnv(t, []string{srv.Addr()}, semaphore.Options{Fair: true})
	return &queueScript{srv: srv, e: e, script: script(t, e, "semaphore_queue")}
}

var (
	timeRE   = regexp.MustCompile(`t([+-]\d+)`)
	stampRE  = regexp.MustCompile(`\b\d{13}\b`)
	approxRE = regexp.MustCompile(`~([+-]?\d+)`)
)

// qcase is one semaphore of a queueScript.
type qcase struct {
	q     *queueScript
	keys  []string
	base  int64
	heard func() []string
}

func (q *queueScript) start(t *testing.T, st qstate) *qcase {
	t.Helper()
	ctx := context.Background()
	e := q.e
	name := uniqueName(t)
	c := &qcase{q: q, keys: []string{e.key(name, ""), e.key(name, ":e"), e.key(name, ":w"), e.key(name, ":q"), e.key(name, ":qe")}}
	c.heard = listenBudget(t, q.srv.Addr(), c.keys[2])
	c.base = serverMs(t, e)
	at := func(v string) string {
		return timeRE.ReplaceAllStringFunc(v, func(s string) string {
			n, _ := strconv.ParseInt(s[1:], 10, 64)
			return strconv.FormatInt(c.base+n, 10)
		})
	}
	do := func(cmd string, key string, pairs []string, swap bool) {
		if len(pairs) == 0 {
			return
		}
		args := make([]string, 0, len(pairs))
		for i := 0; i < len(pairs); i += 2 {
			a, b := pairs[i], at(pairs[i+1])
			if swap {
				a, b = b, a
			}
			args = append(args, a, b)
		}
		if err := e.client.Do(ctx, e.client.B().Arbitrary(cmd).Keys(key).Args(args...).Build()).Error(); err != nil {
			t.Fatalf("%s %s %q: %v", cmd, key, args, err)
		}
	}
	for k, v := range st.str {
		if err := e.client.Do(ctx, e.client.B().Set().Key(c.keys[k]).Value(v).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	do("HSET", c.keys[0], st.hash, false)
	do("ZADD", c.keys[1], st.permits, true)
	do("ZADD", c.keys[3], st.queue, true)
	do("HSET", c.keys[4], st.entries, false)
	for k, v := range st.expire {
		if err := e.client.Do(ctx, e.client.B().Arbitrary("PEXPIREAT").Keys(c.keys[k]).Args(at(v)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// call runs the script and returns the state after it (see dump), with the
// calls of the commands listed in count that the script made, and the
// slack of its times.
func (c *qcase) call(t *testing.T, a qcall, count ...string) (string, int64) {
	t.Helper()
	if a.pub == "" {
		a.pub = "p"
	}
	out := c.q.exec(t, c.q.script, c.keys, []string{a.mode, a.capacity, a.n, a.id, a.ms, a.pub}, count)
	return out + c.dump(t), serverMs(t, c.q.e) - c.base + 1
}

// exec runs s and writes its reply, and the calls of the commands listed
// in count that it made.
func (q *queueScript) exec(t *testing.T, s *scriptcache.Script, keys, args, count []string) string {
	t.Helper()
	before := commandCalls(t, q.srv)
	r, err := s.Exec(context.Background(), keys, args).AsIntSlice()
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	after := commandCalls(t, q.srv)
	var b strings.Builder
	fmt.Fprintf(&b, "reply %v\n", r)
	if len(count) > 0 {
		b.WriteString("calls")
		for _, cmd := range count {
			fmt.Fprintf(&b, " %s=%d", cmd, after[cmd]-before[cmd])
		}
		b.WriteString("\n")
	}
	return b.String()
}

// dump reads the five keys and the messages published since the last
// look, one line each; times are written t+N from base. Each key's expiry
// is also written as "last+N": N ms after the latest permit (for the
// state hash and the permits) or queue entry (for the queue keys). A
// PEXPIREAT at a time the script computed from the same TIME reading as
// the permit makes N exact, where a time from base is only good to the
// slack; a PEXPIRE counts from the server's own clock, up to 1 ms off the
// script's TIME, so those are written ~N.
func (c *qcase) dump(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	client := c.q.e.client
	type key struct {
		name    string
		i       int // index in c.keys
		content []string
		at      int64 // PEXPIRETIME
	}
	keys := []*key{{name: "hash", i: 0}, {name: "permits", i: 1}, {name: "queue", i: 3}, {name: "entries", i: 4}}
	var lastPermit, lastEntry int64
	for _, k := range keys {
		name := c.keys[k.i]
		if v, err := client.Do(ctx, client.B().Get().Key(name).Build()).ToString(); err == nil {
			k.content = []string{"string", v}
			continue
		}
		switch k.i {
		case 0, 4:
			m, err := client.Do(ctx, client.B().Hgetall().Key(name).Build()).AsStrMap()
			if err != nil {
				t.Fatal(err)
			}
			for f, v := range m {
				k.content = append(k.content, f+"="+v)
				if exp, _, ok := strings.Cut(v, " "); ok && k.i == 4 && f != ":b" {
					n, _ := strconv.ParseInt(exp, 10, 64)
					lastEntry = max(lastEntry, n)
				}
			}
			slices.Sort(k.content)
		default:
			zs, err := client.Do(ctx, client.B().Zrange().Key(name).Min("0").Max("-1").Withscores().Build()).AsZScores()
			if err != nil {
				t.Fatal(err)
			}
			for _, z := range zs {
				k.content = append(k.content, z.Member+"="+strconv.FormatInt(int64(z.Score), 10))
				if k.i == 1 {
					lastPermit = max(lastPermit, int64(z.Score))
				}
			}
		}
		at, err := client.Do(ctx, client.B().Pexpiretime().Key(name).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		k.at = at
	}
	var b strings.Builder
	for _, k := range keys {
		switch {
		case len(k.content) == 0:
			fmt.Fprintf(&b, "%s -\n", k.name)
			continue
		case k.content[0] == "string":
			fmt.Fprintf(&b, "%s %s\n", k.name, strings.Join(k.content, " "))
			continue
		case k.at < 0:
			fmt.Fprintf(&b, "%s %s | expires none\n", k.name, strings.Join(k.content, " "))
			continue
		}
		fmt.Fprintf(&b, "%s %s | expires %d", k.name, strings.Join(k.content, " "), k.at)
		last := lastPermit
		if k.i >= 3 {
			last = lastEntry
		}
		if last > 0 {
			fmt.Fprintf(&b, " last%+d", k.at-last)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "published %q\n", c.heard())
	return stampRE.ReplaceAllStringFunc(b.String(), func(s string) string {
		n, _ := strconv.ParseInt(s, 10, 64)
		return fmt.Sprintf("t%+d", n-c.base)
	})
}

// matchState reports whether got is want, where each ~N of want stands
// for a number within slack of N.
func matchState(got, want string, slack int64) bool {
	var pattern strings.Builder
	pattern.WriteString("^")
	last := 0
	for _, ix := range approxRE.FindAllStringIndex(want, -1) {
		pattern.WriteString(regexp.QuoteMeta(want[last:ix[0]]))
		pattern.WriteString(`([+-]?\d+)`)
		last = ix[1]
	}
	pattern.WriteString(regexp.QuoteMeta(want[last:]) + "$")
	m := regexp.MustCompile(pattern.String()).FindStringSubmatch(got)
	if m == nil {
		return false
	}
	for i, a := range approxRE.FindAllStringSubmatch(want, -1) {
		w, _ := strconv.ParseInt(a[1], 10, 64)
		g, _ := strconv.ParseInt(m[i+1], 10, 64)
		if g < w-slack || g > w+slack {
			return false
		}
	}
	return true
}

func trimState(s string) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		lines = append(lines, strings.TrimSpace(l))
	}
	return strings.Join(lines, "\n") + "\n"
}

// A held permit of a minute, a live waiter's entry, and a dead one (its
// waiter stopped refreshing it), as the cases below write them.
const (
	live = "t+600000"
	dead = "t-100000"
)

func TestQueueScriptPaths(t *testing.T) {
	q := newQueueScript(t)
	for _, c := range []struct {
		name  string
		state qstate
		call  qcall
		count []string // commands whose calls the case counts
		want  string
	}{
		// Acquire: the quick grant, with nobody queued.
		{
			name:  "quick grant on an idle semaphore",
			call:  qcall{mode: "a", capacity: "3", n: "2", id: "p", ms: "60000"},
			count: []string{"zrangebyscore", "zrange"},
			want: `reply [1 2 3 0]
				calls zrangebyscore=0 zrange=0
				hash :cap=3 :h=1 p=2 | expires t~+63751 last+3751
				permits p=t~+60000 | expires t~+63751 last+3751
				queue -
				entries -
				published []`,
		},
		{
			name: "quick grant leaves an expired permit listed",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "0"},
				permits: []string{"gone", dead, "other", live},
				expire:  map[int]string{0: live, 1: live},
			},
			call:  qcall{mode: "a", capacity: "3", n: "1", id: "p", ms: "60000"},
			count: []string{"zrangebyscore"},
			want: `reply [1 3 3 0]
				calls zrangebyscore=0
				hash :cap=3 :h=0 | expires t+600000 last+0
				permits gone=t-100000 p=t~+60000 other=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a grant that does not fit as things are reclaims first, then announces the rest free",
			state: qstate{
				hash:    []string{":cap", "4", ":h", "1", "gone", "2"},
				permits: []string{"gone", dead, "other", live},
				expire:  map[int]string{0: live, 1: live},
			},
			call:  qcall{mode: "t", capacity: "4", n: "2", id: "p", ms: "60000"},
			count: []string{"zrangebyscore"},
			want: `reply [1 3 4 0]
				calls zrangebyscore=1
				hash :cap=4 :h=1 p=2 | expires t+600000 last+0
				permits p=t~+60000 other=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published ["1"]`,
		},
		{
			name: "a grant that fills the capacity exactly after a reclaim announces nothing",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "1", "gone", "2"},
				permits: []string{"gone", dead, "other", live},
				expire:  map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "t", capacity: "3", n: "2", id: "p", ms: "60000"},
			want: `reply [1 3 3 0]
				hash :cap=3 :h=1 p=2 | expires t+600000 last+0
				permits p=t~+60000 other=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a refused call reclaims expired permits too, and says how long until the next expiry",
			state: qstate{
				hash:    []string{":cap", "2", ":h", "0"},
				permits: []string{"gone", dead, "other", "t+30000", "third", live},
				expire:  map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "t", capacity: "2", n: "2", id: "p", ms: "60000"},
			want: `reply [0 2 2 ~30000]
				hash :cap=2 :h=0 | expires t+600000 last+0
				permits other=t+30000 third=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a state hash gone takes the permits set with it: they are counted nowhere",
			state: qstate{
				permits: []string{"stale", live},
				expire:  map[int]string{1: live},
			},
			call: qcall{mode: "t", capacity: "1", n: "1", id: "p", ms: "60000"},
			want: `reply [1 1 1 0]
				hash :cap=1 :h=0 | expires t~+63751 last+3751
				permits p=t~+60000 | expires t~+63751 last+3751
				queue -
				entries -
				published []`,
		},
		{
			name: "the weight in use is the permits plus ':h': a heavy permit leaves room for what fits",
			state: qstate{
				hash:    []string{":cap", "5", ":h", "2", "heavy", "3"},
				permits: []string{"heavy", live},
				expire:  map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "t", capacity: "5", n: "2", id: "p", ms: "60000"},
			want: `reply [1 5 5 0]
				hash :cap=5 :h=3 heavy=3 p=2 | expires t+600000 last+0
				permits p=t~+60000 heavy=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "the weight in use is the permits plus ':h': more than fits is refused",
			state: qstate{
				hash:    []string{":cap", "5", ":h", "2", "heavy", "3"},
				permits: []string{"heavy", live},
				expire:  map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "t", capacity: "5", n: "3", id: "p", ms: "60000"},
			want: `reply [0 3 5 ~600000]
				hash :cap=5 :h=2 heavy=3 | expires t+600000 last+0
				permits heavy=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "the 16 oldest expired permits are reclaimed, no more",
			state: qstate{
				hash: []string{":cap", "18", ":h", "0"},
				permits: []string{"d00", "t-200000", "d01", "t-199000", "d02", "t-198000", "d03", "t-197000",
					"d04", "t-196000", "d05", "t-195000", "d06", "t-194000", "d07", "t-193000",
					"d08", "t-192000", "d09", "t-191000", "d10", "t-190000", "d11", "t-189000",
					"d12", "t-188000", "d13", "t-187000", "d14", "t-186000", "d15", "t-185000",
					"d16", "t-184000", "other", live},
				expire: map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "t", capacity: "18", n: "1", id: "p", ms: "60000"},
			want: `reply [1 3 18 0]
				hash :cap=18 :h=0 | expires t+600000 last+0
				permits d16=t-184000 p=t~+60000 other=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published ["15"]`,
		},
		{
			name: "with a capacity set, a caller of another capacity that fits is granted without the reclaim",
			state: qstate{
				hash:    []string{":cap", "3", ":set", "900000", ":h", "0"},
				permits: []string{"gone", dead, "a", live},
				expire:  map[int]string{0: "t+900000", 1: "t+900000"},
			},
			call:  qcall{mode: "a", capacity: "5", n: "1", id: "p", ms: "60000"},
			count: []string{"zrangebyscore"},
			want: `reply [1 3 3 0]
				calls zrangebyscore=0
				hash :cap=3 :h=0 :set=900000 | expires t~+903751 last~+303751
				permits gone=t-100000 p=t~+60000 a=t+600000 | expires t~+903751 last~+303751
				queue -
				entries -
				published []`,
		},
		{
			name: "a weight left in ':h' with no permit listed is counted nowhere",
			state: qstate{
				hash:   []string{":cap", "3", ":h", "2"},
				expire: map[int]string{0: live},
			},
			call: qcall{mode: "t", capacity: "3", n: "3", id: "p", ms: "60000"},
			want: `reply [1 3 3 0]
				hash :cap=3 :h=2 p=3 | expires t~+63751 last+3751
				permits p=t~+60000 | expires t~+63751 last+3751
				queue -
				entries -
				published []`,
		},
		{
			name: "with nothing listed, the caller's capacity replaces the stored one, and it is granted without the reclaim",
			state: qstate{
				hash:   []string{":cap", "3", ":h", "0"},
				expire: map[int]string{0: live},
			},
			call:  qcall{mode: "a", capacity: "5", n: "4", id: "p", ms: "60000"},
			count: []string{"zrangebyscore"},
			want: `reply [1 4 5 0]
				calls zrangebyscore=0
				hash :cap=5 :h=3 p=4 | expires t~+63751 last+3751
				permits p=t~+60000 | expires t~+63751 last+3751
				queue -
				entries -
				published []`,
		},
		{
			name: "a refused call that leaves expired permits listed says there is no wait",
			state: qstate{
				hash: []string{":cap", "17", ":h", "0"},
				permits: []string{"d00", "t-200000", "d01", "t-199000", "d02", "t-198000", "d03", "t-197000",
					"d04", "t-196000", "d05", "t-195000", "d06", "t-194000", "d07", "t-193000",
					"d08", "t-192000", "d09", "t-191000", "d10", "t-190000", "d11", "t-189000",
					"d12", "t-188000", "d13", "t-187000", "d14", "t-186000", "d15", "t-185000",
					"d16", "t-184000"},
				expire: map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "t", capacity: "17", n: "17", id: "p", ms: "60000"},
			want: `reply [0 1 17 0]
				hash :cap=17 :h=0 | expires t+600000 last+784000
				permits d16=t-184000 | expires t+600000 last+784000
				queue -
				entries -
				published []`,
		},
		{
			name: "a refused call that reclaims leaves a set capacity's retention as it is: it is no grant, renewal or release",
			state: qstate{
				hash:    []string{":cap", "2", ":set", "900000", ":h", "0"},
				permits: []string{"gone", dead, "a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			call:  qcall{mode: "t", capacity: "2", n: "2", id: "p", ms: "60000"},
			count: []string{"pexpireat"},
			want: `reply [0 1 2 ~600000]
				calls pexpireat=0
				hash :cap=2 :h=0 :set=900000 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		// Acquire: refusals.
		{
			name: "another capacity while permits are held is refused, and the caller leaves the queue",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "0"},
				permits: []string{"other", "t+30000"},
				queue:   []string{"p", "1", "w", "2"},
				entries: []string{"p", live + " 1", "w", live + " 3"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call: qcall{mode: "a", capacity: "4", n: "1", id: "p", ms: "60000"},
			want: `reply [-1 1 3 ~30000]
				hash :cap=3 :h=0 | expires t+600000 last+570000
				permits other=t+30000 | expires t+600000 last+570000
				queue w=2 | expires t+600000 last+0
				entries :b=w 0 w=t+600000 3 | expires t+600000 last+0
				published []`,
		},
		{
			name: "another capacity refused, with a permit free and nothing reclaimed, announces nothing",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "0"},
				permits: []string{"other", "t+30000"},
				expire:  map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "t", capacity: "2", n: "1", id: "p", ms: "60000"},
			want: `reply [-1 1 3 ~30000]
				hash :cap=3 :h=0 | expires t+600000 last+570000
				permits other=t+30000 | expires t+600000 last+570000
				queue -
				entries -
				published []`,
		},
		{
			name: "another capacity is refused even when the call reclaims, which announces the permits freed",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "0"},
				permits: []string{"gone", dead, "other", "t+30000"},
				queue:   []string{"p", "1"},
				entries: []string{"p", live + " 1", ":b", "p 2"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call: qcall{mode: "a", capacity: "4", n: "1", id: "p", ms: "60000"},
			want: `reply [-1 1 3 ~30000]
				hash :cap=3 :h=0 | expires t+600000 last+570000
				permits other=t+30000 | expires t+600000 last+570000
				queue -
				entries -
				published ["2"]`,
		},
		{
			name: "with every permit expired, the caller's capacity applies",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "0"},
				permits: []string{"gone", dead},
				expire:  map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "a", capacity: "4", n: "4", id: "p", ms: "60000"},
			want: `reply [1 4 4 0]
				hash :cap=4 :h=3 p=4 | expires t~+63751 last+3751
				permits p=t~+60000 | expires t~+63751 last+3751
				queue -
				entries -
				published []`,
		},
		{
			name: "a capacity set applies to a caller of another capacity, with nothing held",
			state: qstate{
				hash:   []string{":cap", "3", ":set", "900000"},
				expire: map[int]string{0: live},
			},
			call: qcall{mode: "a", capacity: "5", n: "3", id: "p", ms: "60000"},
			want: `reply [1 3 3 0]
				hash :cap=3 :h=2 :set=900000 p=3 | expires t~+903751 last+843751
				permits p=t~+60000 | expires t~+903751 last+843751
				queue -
				entries -
				published []`,
		},
		{
			name: "a capacity set refuses more than itself; the grant pass still runs",
			state: qstate{
				hash:    []string{":cap", "3", ":set", "900000"},
				queue:   []string{"p", "1", "w", "2"},
				entries: []string{"p", live + " 4", "w", live + " 1"},
				expire:  map[int]string{0: live, 3: live, 4: live},
			},
			call: qcall{mode: "a", capacity: "5", n: "4", id: "p", ms: "60000"},
			want: `reply [-2 1 3 ~600000]
				hash :cap=3 :h=0 :set=900000 | expires t~+937501 last~+337501
				permits w=t+600000 | expires t~+937501 last~+337501
				queue -
				entries -
				published ["g w 1"]`,
		},
		{
			name: "more than the capacity is refused; the call's reclaim serves the queue and announces what stays free",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "0"},
				permits: []string{"gone", dead, "other", "t+30000"},
				queue:   []string{"w", "1"},
				entries: []string{"w", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call: qcall{mode: "a", capacity: "3", n: "4", id: "p", ms: "60000"},
			want: `reply [-2 2 3 ~30000]
				hash :cap=3 :h=0 | expires t~+637501 last~+37501
				permits other=t+30000 w=t+600000 | expires t~+637501 last~+37501
				queue -
				entries -
				published ["g w 1" "1"]`,
		},
		{
			name: "more than the capacity on an idle semaphore is refused, with no permit to wait for",
			call: qcall{mode: "a", capacity: "2", n: "3", id: "p", ms: "60000"},
			want: `reply [-2 0 2 -1]
				hash -
				permits -
				queue -
				entries -
				published []`,
		},
		{
			name: "as much as the capacity is allowed",
			state: qstate{
				hash:    []string{":cap", "2", ":h", "0"},
				permits: []string{"gone", dead},
				expire:  map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "t", capacity: "2", n: "2", id: "p", ms: "60000"},
			want: `reply [1 2 2 0]
				hash :cap=2 :h=1 p=2 | expires t~+63751 last+3751
				permits p=t~+60000 | expires t~+63751 last+3751
				queue -
				entries -
				published []`,
		},
		// Acquire: an id that holds a permit already.
		{
			name: "an id that holds a live permit is renewed, counted once, and leaves the queue",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "1", "p", "2"},
				permits: []string{"p", "t+30000"},
				queue:   []string{"p", "1", "w", "2"},
				entries: []string{"p", live + " 2", "w", live + " 2"},
				expire:  map[int]string{0: "t+40000", 1: "t+40000", 3: live, 4: live},
			},
			call:  qcall{mode: "a", capacity: "3", n: "2", id: "p", ms: "60000"},
			count: []string{"zrangebyscore"},
			want: `reply [1 2 3 0]
				calls zrangebyscore=1
				hash :cap=3 :h=1 p=2 | expires t~+63751 last+3751
				permits p=t~+60000 | expires t~+63751 last+3751
				queue w=2 | expires t+600000 last+0
				entries :b=w 0 w=t+600000 2 | expires t+600000 last+0
				published []`,
		},
		{
			name: "a renewal moves the keys' expiry only later",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "0"},
				permits: []string{"p", "t+30000", "other", live},
				expire:  map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "t", capacity: "3", n: "1", id: "p", ms: "60000"},
			want: `reply [1 2 3 0]
				hash :cap=3 :h=0 | expires t+600000 last+0
				permits p=t~+60000 other=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "an id whose permit expired is granted anew, its old weight reclaimed once and announced as freed",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "0"},
				permits: []string{"p", dead, "other", live},
				expire:  map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "t", capacity: "3", n: "1", id: "p", ms: "60000"},
			want: `reply [1 2 3 0]
				hash :cap=3 :h=0 | expires t+600000 last+0
				permits p=t~+60000 other=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published ["1"]`,
		},
		{
			name: "an id whose permit expired behind 16 older ones is reclaimed too",
			state: qstate{
				hash: []string{":cap", "18", ":h", "1", "p", "2"},
				permits: []string{"d00", "t-200000", "d01", "t-199000", "d02", "t-198000", "d03", "t-197000",
					"d04", "t-196000", "d05", "t-195000", "d06", "t-194000", "d07", "t-193000",
					"d08", "t-192000", "d09", "t-191000", "d10", "t-190000", "d11", "t-189000",
					"d12", "t-188000", "d13", "t-187000", "d14", "t-186000", "d15", "t-185000",
					"p", "t-184000", "other", live},
				expire: map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "t", capacity: "18", n: "1", id: "p", ms: "60000"},
			want: `reply [1 2 18 0]
				hash :cap=18 :h=0 | expires t+600000 last+0
				permits p=t~+60000 other=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published ["16"]`,
		},
		{
			name: "a renewal that reclaims runs the pass for the queue and announces what stays free",
			state: qstate{
				hash:    []string{":cap", "4", ":h", "1", "gone", "2"},
				permits: []string{"gone", dead, "p", "t+30000", "a", live},
				queue:   []string{"w", "1"},
				entries: []string{"w", live + " 1"},
				expire:  map[int]string{0: "t+700000", 1: "t+700000", 3: live, 4: live},
			},
			call: qcall{mode: "a", capacity: "4", n: "1", id: "p", ms: "60000"},
			want: `reply [1 3 4 0]
				hash :cap=4 :h=0 | expires t+700000 last+100000
				permits p=t~+60000 a=t+600000 w=t+600000 | expires t+700000 last+100000
				queue -
				entries -
				published ["g w 1" "1"]`,
		},
		// Acquire: the queue.
		{
			name: "a caller that does not fit joins the end of the queue; its keys live a lease and a sixteenth",
			state: qstate{
				hash:    []string{":cap", "2", ":h", "0"},
				permits: []string{"a", live, "b", "t+30000"},
				queue:   []string{"w", "7"},
				entries: []string{"w", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: "t+20000", 4: "t+20000"},
			},
			call: qcall{mode: "a", capacity: "2", n: "2", id: "p", ms: "60000"},
			want: `reply [0 2 2 ~30000]
				hash :cap=2 :h=0 | expires t+600000 last+0
				permits b=t+30000 a=t+600000 | expires t+600000 last+0
				queue w=7 p=8 | expires t~+63750 last~-536250
				entries p=t~+60000 2 w=t+600000 1 | expires t~+63750 last~-536250
				published []`,
		},
		{
			name: "a waiter's refresh keeps its place and never shortens the queue keys' life",
			state: qstate{
				hash:    []string{":cap", "2", ":h", "0"},
				permits: []string{"a", live, "b", live},
				queue:   []string{"p", "3", "w", "7"},
				entries: []string{"p", "t+1000 2", "w", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call: qcall{mode: "a", capacity: "2", n: "2", id: "p", ms: "60000"},
			want: `reply [0 2 2 ~600000]
				hash :cap=2 :h=0 | expires t+600000 last+0
				permits a=t+600000 b=t+600000 | expires t+600000 last+0
				queue p=3 w=7 | expires t+600000 last+0
				entries p=t~+60000 2 w=t+600000 1 | expires t+600000 last+0
				published []`,
		},
		{
			name: "a caller that fits waits behind the queue (FIFO) and may pass a blocked head",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "0"},
				permits: []string{"a", live},
				queue:   []string{"head", "1"},
				entries: []string{"head", live + " 3"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call: qcall{mode: "a", capacity: "3", n: "1", id: "p", ms: "60000"},
			want: `reply [1 2 3 0]
				hash :cap=3 :h=0 | expires t+600000 last+0
				permits p=t~+60000 a=t+600000 | expires t+600000 last+0
				queue head=1 | expires t+600000 last+0
				entries :b=head 1 head=t+600000 3 | expires t+600000 last+0
				published []`,
		},
		{
			name: "a head passed 15 times may be passed once more",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "0"},
				permits: []string{"a", live},
				queue:   []string{"head", "1"},
				entries: []string{"head", live + " 3", ":b", "head 15"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call: qcall{mode: "t", capacity: "3", n: "1", id: "p", ms: "60000"},
			want: `reply [1 2 3 0]
				hash :cap=3 :h=0 | expires t+600000 last+0
				permits p=t~+60000 a=t+600000 | expires t+600000 last+0
				queue head=1 | expires t+600000 last+0
				entries :b=head 16 head=t+600000 3 | expires t+600000 last+0
				published []`,
		},
		{
			name: "a head passed 16 times is passed no more; a TryAcquire leaves no entry",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "0"},
				permits: []string{"a", live},
				queue:   []string{"head", "1"},
				entries: []string{"head", live + " 3", ":b", "head 16"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call: qcall{mode: "t", capacity: "3", n: "1", id: "p", ms: "60000"},
			want: `reply [0 1 3 ~600000]
				hash :cap=3 :h=0 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue head=1 | expires t+600000 last+0
				entries :b=head 16 head=t+600000 3 | expires t+600000 last+0
				published []`,
		},
		{
			name: "the passes counted are of the head named in ':b' only",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "0"},
				permits: []string{"a", live},
				queue:   []string{"head", "1"},
				entries: []string{"head", live + " 3", ":b", "gone 16"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call: qcall{mode: "t", capacity: "3", n: "1", id: "p", ms: "60000"},
			want: `reply [1 2 3 0]
				hash :cap=3 :h=0 | expires t+600000 last+0
				permits p=t~+60000 a=t+600000 | expires t+600000 last+0
				queue head=1 | expires t+600000 last+0
				entries :b=head 1 head=t+600000 3 | expires t+600000 last+0
				published []`,
		},
		{
			name: "a TryAcquire not granted, alone in the queue, leaves no queue keys",
			state: qstate{
				hash:    []string{":cap", "1", ":h", "0"},
				permits: []string{"a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "t", capacity: "1", n: "1", id: "p", ms: "60000"},
			want: `reply [0 1 1 ~600000]
				hash :cap=1 :h=0 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		// Release, and the grant pass it runs.
		{
			name: "a release of a heavy permit grants the queue in order while it fits; each grant expires with its entry",
			state: qstate{
				hash:    []string{":cap", "4", ":h", "2", "p", "3", "other", "1"},
				permits: []string{"p", "t+300000", "other", "t+300000"},
				queue:   []string{"w1", "1", "w2", "2", "w3", "3"},
				entries: []string{"w1", "t+500000 2", "w2", "t+700000 1", "w3", live + " 1"},
				expire:  map[int]string{0: "t+300000", 1: "t+300000", 3: live, 4: live},
			},
			call: qcall{mode: "r", capacity: "4", id: "p"},
			want: `reply [1 4]
				hash :cap=4 :h=1 other=1 w1=2 | expires t~+743751 last~+43751
				permits other=t+300000 w1=t+500000 w2=t+700000 | expires t~+743751 last~+43751
				queue w3=3 | expires t+600000 last+0
				entries w3=t+600000 1 | expires t+600000 last+0
				published ["g w1 2" "g w2 1"]`,
		},
		{
			name: "a release grants what fits and announces the rest free; the queue emptied goes, ':b' with it",
			state: qstate{
				hash:    []string{":cap", "4", ":h", "2", "p", "3"},
				permits: []string{"p", live},
				queue:   []string{"w1", "1"},
				entries: []string{"w1", live + " 2", ":b", "w1 3"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call: qcall{mode: "r", capacity: "4", id: "p"},
			want: `reply [1 2]
				hash :cap=4 :h=1 w1=2 | expires t~+637501 last~+37501
				permits w1=t+600000 | expires t~+637501 last~+37501
				queue -
				entries -
				published ["g w1 2" "2"]`,
		},
		{
			name: "a pass stops at a blocked head that has been passed 16 times, and announces nothing",
			state: qstate{
				hash:    []string{":cap", "4", ":h", "0"},
				permits: []string{"p", live, "a", live},
				queue:   []string{"head", "1", "w", "2"},
				entries: []string{"head", live + " 4", "w", live + " 1", ":b", "head 16"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call: qcall{mode: "r", capacity: "4", id: "p"},
			want: `reply [1 1]
				hash :cap=4 :h=0 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue head=1 w=2 | expires t+600000 last+0
				entries :b=head 16 head=t+600000 4 w=t+600000 1 | expires t+600000 last+0
				published []`,
		},
		{
			name: "a pass drops dead entries, skips one heavier than the capacity, and grants behind them",
			state: qstate{
				hash:    []string{":cap", "2", ":h", "0"},
				permits: []string{"p", live},
				queue:   []string{"gone", "1", "nothing", "2", "huge", "3", "junk", "4", "w", "5"},
				entries: []string{"gone", dead + " 1", "huge", live + " 3", "junk", "x 1", "w", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call:  qcall{mode: "r", capacity: "2", id: "p"},
			count: []string{"exists"},
			want: `reply [1 1]
				calls exists=0
				hash :cap=2 :h=0 | expires t~+637501 last~+37501
				permits w=t+600000 | expires t~+637501 last~+37501
				queue huge=3 | expires t+600000 last+0
				entries huge=t+600000 3 | expires t+600000 last+0
				published ["g w 1" "1"]`,
		},
		{
			name: "a pass reads only as many entries as the permits free could go to, plus one",
			state: qstate{
				hash:    []string{":cap", "1", ":h", "0"},
				permits: []string{"p", live},
				queue:   []string{"w1", "1", "w2", "2", "w3", "3", "w4", "4"},
				entries: []string{"w1", live + " 1", "w2", live + " 1", "w3", live + " 1", "w4", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call:  qcall{mode: "r", capacity: "1", id: "p"},
			count: []string{"zrange", "exists", "publish"},
			want: `reply [1 1]
				calls zrange=1 exists=0 publish=1
				hash :cap=1 :h=0 | expires t~+637501 last~+37501
				permits w1=t+600000 | expires t~+637501 last~+37501
				queue w2=2 w3=3 w4=4 | expires t+600000 last+0
				entries w2=t+600000 1 w3=t+600000 1 w4=t+600000 1 | expires t+600000 last+0
				published ["g w1 1"]`,
		},
		{
			name: "a release of an expired permit frees it without saying it was held; an empty queue costs one read",
			state: qstate{
				hash:    []string{":cap", "3", ":h", "1", "p", "2"},
				permits: []string{"p", dead, "a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			call:  qcall{mode: "r", capacity: "3", id: "p"},
			count: []string{"zrange", "exists"},
			want: `reply [0 1]
				calls zrange=1 exists=0
				hash :cap=3 :h=0 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published ["2"]`,
		},
		{
			name: "a release by a waiter takes its entry out and leaves the others' and ':b'",
			state: qstate{
				hash:    []string{":cap", "1", ":h", "0"},
				permits: []string{"a", live},
				queue:   []string{"p", "1", "w", "2"},
				entries: []string{"p", live + " 1", "w", live + " 1", ":b", "w 3"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call:  qcall{mode: "r", capacity: "1", id: "p"},
			count: []string{"hset", "pexpireat"},
			want: `reply [0 1]
				calls hset=0 pexpireat=0
				hash :cap=1 :h=0 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue w=2 | expires t+600000 last+0
				entries :b=w 3 w=t+600000 1 | expires t+600000 last+0
				published []`,
		},
		{
			name: "a release by the last waiter deletes both queue keys",
			state: qstate{
				hash:    []string{":cap", "1", ":h", "0"},
				permits: []string{"a", live},
				queue:   []string{"p", "1"},
				entries: []string{"p", live + " 1", ":b", "p 3"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call: qcall{mode: "r", capacity: "1", id: "p"},
			want: `reply [0 1]
				hash :cap=1 :h=0 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue -
				entries -
				published []`,
		},
		{
			name: "a release of what is neither held nor queued writes nothing, not even a kept capacity's life; its pass announces the permits free",
			state: qstate{
				hash:    []string{":cap", "3", ":set", "900000"},
				queue:   []string{"w", "1"},
				entries: []string{"w", live + " 4", ":b", "w 0"},
				expire:  map[int]string{0: "t+50000", 3: live, 4: live},
			},
			call: qcall{mode: "r", capacity: "3", id: "p"},
			want: `reply [0 0]
				hash :cap=3 :set=900000 | expires t+50000
				permits -
				queue w=1 | expires t+600000 last+0
				entries :b=w 0 w=t+600000 4 | expires t+600000 last+0
				published ["3"]`,
		},
		{
			name: "the last release keeps a set capacity for its retention, and nothing else",
			state: qstate{
				hash:    []string{":cap", "3", ":set", "900000", ":h", "1", "p", "2"},
				permits: []string{"p", live},
				expire:  map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "r", capacity: "3", id: "p"},
			want: `reply [1 0]
				hash :cap=3 :set=900000 | expires t~+900000
				permits -
				queue -
				entries -
				published ["3"]`,
		},
		{
			name: "a release with a set capacity and permits left makes the keys live its retention",
			state: qstate{
				hash:    []string{":cap", "3", ":set", "900000", ":h", "0"},
				permits: []string{"p", live, "a", live},
				expire:  map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "r", capacity: "3", id: "p"},
			want: `reply [1 1]
				hash :cap=3 :h=0 :set=900000 | expires t~+900001 last~+300001
				permits a=t+600000 | expires t~+900001 last~+300001
				queue -
				entries -
				published ["2"]`,
		},
		{
			name: "a release with a set capacity leaves a longer life as it is",
			state: qstate{
				hash:    []string{":cap", "3", ":set", "900000", ":h", "0"},
				permits: []string{"p", live, "a", live},
				expire:  map[int]string{0: "t+1000000", 1: "t+1000000"},
			},
			call:  qcall{mode: "r", capacity: "3", id: "p"},
			count: []string{"pexpireat"},
			want: `reply [1 1]
				calls pexpireat=0
				hash :cap=3 :h=0 :set=900000 | expires t+1000000 last+400000
				permits a=t+600000 | expires t+1000000 last+400000
				queue -
				entries -
				published ["2"]`,
		},
		{
			name: "a release publishes with SPUBLISH when asked",
			state: qstate{
				hash:    []string{":cap", "2", ":h", "0"},
				permits: []string{"p", live},
				queue:   []string{"w", "1"},
				entries: []string{"w", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call:  qcall{mode: "r", capacity: "2", id: "p", pub: "s"},
			count: []string{"spublish", "publish"},
			want: `reply [1 1]
				calls spublish=2 publish=0
				hash :cap=2 :h=0 | expires t~+637501 last~+37501
				permits w=t+600000 | expires t~+637501 last~+37501
				queue -
				entries -
				published []`,
		},
		{
			name: "a pass counts the grants that pass a blocked head, not those before it",
			state: qstate{
				hash:    []string{":cap", "4", ":h", "2", "p", "3"},
				permits: []string{"p", live, "a", live},
				queue:   []string{"w0", "1", "head", "2", "w1", "3", "w2", "4"},
				entries: []string{"w0", live + " 1", "head", live + " 4", "w1", live + " 1", "w2", live + " 1"},
				expire:  map[int]string{0: "t+700000", 1: "t+700000", 3: live, 4: live},
			},
			call: qcall{mode: "r", capacity: "4", id: "p"},
			want: `reply [1 4]
				hash :cap=4 :h=0 | expires t+700000 last+100000
				permits a=t+600000 w0=t+600000 w1=t+600000 w2=t+600000 | expires t+700000 last+100000
				queue head=2 | expires t+600000 last+0
				entries :b=head 2 head=t+600000 4 | expires t+600000 last+0
				published ["g w0 1" "g w1 1" "g w2 1"]`,
		},
		{
			name: "a pass lets lighter entries pass a blocked head until its 16th pass, then stops reading",
			state: qstate{
				hash:    []string{":cap", "4", ":h", "2", "p", "3"},
				permits: []string{"p", live, "a", live},
				queue:   []string{"head", "1", "w1", "2", "w2", "3", "d", "4", "w3", "5"},
				entries: []string{"head", live + " 4", "w1", live + " 1", "w2", live + " 1", "d", dead + " 1", "w3", live + " 1", ":b", "head 14"},
				expire:  map[int]string{0: "t+700000", 1: "t+700000", 3: live, 4: live},
			},
			call:  qcall{mode: "r", capacity: "4", id: "p"},
			count: []string{"zrange"},
			want: `reply [1 3]
				calls zrange=1
				hash :cap=4 :h=0 | expires t+700000 last+100000
				permits a=t+600000 w1=t+600000 w2=t+600000 | expires t+700000 last+100000
				queue head=1 d=4 w3=5 | expires t+600000 last+0
				entries :b=head 16 d=t-100000 1 head=t+600000 4 w3=t+600000 1 | expires t+600000 last+0
				published ["g w1 1" "g w2 1"]`,
		},
		{
			name: "a pass reads on past dead entries when the first read does not use the permits up",
			state: qstate{
				hash:    []string{":cap", "2", ":h", "1", "p", "2"},
				permits: []string{"p", live},
				queue:   []string{"x", "1", "d1", "2", "d2", "3", "w", "4", "v", "5"},
				entries: []string{"x", live + " 1", "d1", dead + " 1", "d2", dead + " 1", "w", live + " 1", "v", live + " 1"},
				expire:  map[int]string{0: "t+700000", 1: "t+700000", 3: live, 4: live},
			},
			call:  qcall{mode: "r", capacity: "2", id: "p"},
			count: []string{"zrange", "exists"},
			want: `reply [1 2]
				calls zrange=2 exists=0
				hash :cap=2 :h=0 | expires t~+637501 last~+37501
				permits w=t+600000 x=t+600000 | expires t~+637501 last~+37501
				queue v=5 | expires t+600000 last+0
				entries v=t+600000 1 | expires t+600000 last+0
				published ["g x 1" "g w 1"]`,
		},
		{
			name: "a caller granted by its own pass gets no message; a queue emptied goes",
			state: qstate{
				hash:    []string{":cap", "2", ":h", "0"},
				permits: []string{"a", live},
				queue:   []string{"d", "1"},
				entries: []string{"d", dead + " 1", ":b", "d 4"},
				expire:  map[int]string{0: "t+700000", 1: "t+700000", 3: live, 4: live},
			},
			call:  qcall{mode: "a", capacity: "2", n: "1", id: "p", ms: "60000"},
			count: []string{"exists"},
			want: `reply [1 2 2 0]
				calls exists=3
				hash :cap=2 :h=0 | expires t+700000 last+100000
				permits p=t~+60000 a=t+600000 | expires t+700000 last+100000
				queue -
				entries -
				published []`,
		},
		{
			name: "the last release, with no capacity set, leaves no key",
			state: qstate{
				hash:    []string{":cap", "2", ":h", "1", "p", "2"},
				permits: []string{"p", live},
				expire:  map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "r", capacity: "2", id: "p"},
			want: `reply [1 0]
				hash -
				permits -
				queue -
				entries -
				published ["2"]`,
		},
		// SetCapacity.
		{
			name: "SetCapacity raises the capacity, grants the queue and keeps the keys its retention",
			state: qstate{
				hash:    []string{":cap", "1", ":h", "0"},
				permits: []string{"a", live},
				queue:   []string{"w1", "1", "w2", "2"},
				entries: []string{"w1", live + " 2", "w2", live + " 2"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call: qcall{mode: "c", capacity: "3", ms: "900000"},
			want: `reply [3 3]
				hash :cap=3 :h=1 :set=900000 w1=2 | expires t~+937501 last~+337501
				permits a=t+600000 w1=t+600000 | expires t~+937501 last~+337501
				queue w2=2 | expires t+600000 last+0
				entries w2=t+600000 2 | expires t+600000 last+0
				published ["g w1 2"]`,
		},
		{
			name: "SetCapacity below the weight held revokes nothing and grants nothing",
			state: qstate{
				hash:    []string{":cap", "4", ":h", "2", "a", "3"},
				permits: []string{"a", live},
				queue:   []string{"w", "1"},
				entries: []string{"w", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			},
			call: qcall{mode: "c", capacity: "2", ms: "900000"},
			want: `reply [3 2]
				hash :cap=2 :h=2 :set=900000 a=3 | expires t~+900001 last~+300001
				permits a=t+600000 | expires t~+900001 last~+300001
				queue w=1 | expires t+600000 last+0
				entries w=t+600000 1 | expires t+600000 last+0
				published []`,
		},
		{
			name: "SetCapacity on an idle semaphore keeps the capacity alone, and announces it",
			state: qstate{
				hash:    []string{":cap", "4", ":h", "0"},
				permits: []string{"gone", dead},
				expire:  map[int]string{0: live, 1: live},
			},
			call: qcall{mode: "c", capacity: "2", ms: "900000"},
			want: `reply [0 2]
				hash :cap=2 :set=900000 | expires t~+900000
				permits -
				queue -
				entries -
				published ["2"]`,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			qc := q.start(t, c.state)
			got, slack := qc.call(t, c.call, c.count...)
			want := trimState(c.want)
			if !matchState(got, want, slack) {
				t.Errorf("after %+v (times within %d ms):\n%s\nwant\n%s", c.call, slack, got, want)
			}
		})
	}
}

// TestQueueRefreshScriptPaths: the batched refresh of fair waiters
// (lua/semaphore_queue_refresh.lua), run by hand as TestQueueScriptPaths
// runs semaphore_queue: each answer (0 not queued, 1 refreshed, 2 its own
// call is needed) both ways at its bound, the entries it rewrites and the
// queue keys' expiry, and that it grants, drops and reclaims nothing.
func TestQueueRefreshScriptPaths(t *testing.T) {
	q := newQueueScript(t)
	refresh := script(t, q.e, "semaphore_queue_refresh")
	for _, c := range []struct {
		name   string
		states []qstate
		args   []string // after the lease (60000): j, id, weight, ...
		count  []string
		want   string
	}{
		{
			name: "a waiter's entry gets a lease from now, the queue keys a lease and a sixteenth",
			states: []qstate{{
				hash:    []string{":cap", "1", ":h", "0"},
				permits: []string{"a", live},
				queue:   []string{"w", "1"},
				entries: []string{"w", "t+1000 1"},
				expire:  map[int]string{0: live, 1: live, 3: "t+20000", 4: "t+20000"},
			}},
			args: []string{"1", "w", "1"},
			want: `reply [1]
				hash :cap=1 :h=0 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue w=1 | expires t~+63750 last~+3750
				entries w=t~+60000 1 | expires t~+63750 last~+3750
				published []`,
		},
		{
			name: "queue keys that live longer than a lease keep their expiry; a dead entry is refreshed, not dropped",
			states: []qstate{{
				hash:    []string{":cap", "1", ":h", "0"},
				permits: []string{"a", live},
				queue:   []string{"w", "1", "v", "2"},
				entries: []string{"w", dead + " 1", "v", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: "t+61000", 4: "t+61000"},
			}},
			args:  []string{"1", "w", "1", "1", "v", "1"},
			count: []string{"pexpire", "pttl", "zrem", "hdel", "zadd"},
			want: `reply [1 1]
				calls pexpire=0 pttl=2 zrem=0 hdel=0 zadd=0
				hash :cap=1 :h=0 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue w=1 v=2 | expires t+61000 last~+1000
				entries v=t~+60000 1 w=t~+60000 1 | expires t+61000 last~+1000
				published []`,
		},
		{
			name: "a waiter no longer queued is answered 0 and gets no entry",
			states: []qstate{{
				hash:    []string{":cap", "1", ":h", "0"},
				permits: []string{"a", live, "x", live},
				queue:   []string{"w", "1"},
				entries: []string{"w", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: "t+20000", 4: "t+20000"},
			}},
			args: []string{"1", "x", "1"},
			want: `reply [0]
				hash :cap=1 :h=0 | expires t+600000 last+0
				permits a=t+600000 x=t+600000 | expires t+600000 last+0
				queue w=1 | expires t+20000 last-580000
				entries w=t+600000 1 | expires t+20000 last-580000
				published []`,
		},
		{
			name: "a weight above the capacity is told; at the capacity, it waits",
			states: []qstate{{
				hash:    []string{":cap", "3", ":h", "0"},
				permits: []string{"a", live},
				queue:   []string{"w3", "1", "w4", "2"},
				entries: []string{"w3", live + " 3", "w4", live + " 4"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			}},
			args: []string{"1", "w3", "3", "1", "w4", "4"},
			want: `reply [1 2]
				hash :cap=3 :h=0 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue w3=1 w4=2 | expires t+600000 last~+540000
				entries w3=t~+60000 3 w4=t~+60000 4 | expires t+600000 last~+540000
				published []`,
		},
		{
			name: "nothing held: the first waiter is told, once",
			states: []qstate{{
				queue:   []string{"w1", "1", "w2", "2"},
				entries: []string{"w1", live + " 5", "w2", live + " 9"},
				expire:  map[int]string{3: live, 4: live},
			}},
			args: []string{"1", "w1", "5", "1", "w2", "9"},
			want: `reply [2 1]
				hash -
				permits -
				queue w1=1 w2=2 | expires t+600000 last~+540000
				entries w1=t~+60000 5 w2=t~+60000 9 | expires t+600000 last~+540000
				published []`,
		},
		{
			name: "an expired permit: the first waiter is told, once, and nothing is reclaimed",
			states: []qstate{{
				hash:    []string{":cap", "2", ":h", "0"},
				permits: []string{"gone", dead, "a", live},
				queue:   []string{"w1", "1", "w2", "2"},
				entries: []string{"w1", live + " 1", "w2", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			}},
			args: []string{"1", "w1", "1", "1", "w2", "1"},
			want: `reply [2 1]
				hash :cap=2 :h=0 | expires t+600000 last+0
				permits gone=t-100000 a=t+600000 | expires t+600000 last+0
				queue w1=1 w2=2 | expires t+600000 last~+540000
				entries w1=t~+60000 1 w2=t~+60000 1 | expires t+600000 last~+540000
				published []`,
		},
		{
			name: "every permit live and none free: nobody is told",
			states: []qstate{{
				hash:    []string{":cap", "2", ":h", "0"},
				permits: []string{"b", live, "a", live},
				queue:   []string{"w1", "1", "w2", "2"},
				entries: []string{"w1", live + " 1", "w2", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			}},
			args: []string{"1", "w1", "1", "1", "w2", "1"},
			want: `reply [1 1]
				hash :cap=2 :h=0 | expires t+600000 last+0
				permits a=t+600000 b=t+600000 | expires t+600000 last+0
				queue w1=1 w2=2 | expires t+600000 last~+540000
				entries w1=t~+60000 1 w2=t~+60000 1 | expires t+600000 last~+540000
				published []`,
		},
		{
			name: "permits free (':h' counted) and a head that fits them: told",
			states: []qstate{{
				hash:    []string{":cap", "5", ":h", "2", "a", "3"},
				permits: []string{"a", live},
				queue:   []string{"w1", "1", "w2", "2"},
				entries: []string{"w1", live + " 2", "w2", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			}},
			args: []string{"1", "w1", "2", "1", "w2", "1"},
			want: `reply [2 1]
				hash :cap=5 :h=2 a=3 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue w1=1 w2=2 | expires t+600000 last~+540000
				entries w1=t~+60000 2 w2=t~+60000 1 | expires t+600000 last~+540000
				published []`,
		},
		{
			name: "permits free (':h' counted) and a head that does not fit them: nobody is told",
			states: []qstate{{
				hash:    []string{":cap", "5", ":h", "2", "a", "3"},
				permits: []string{"a", live},
				queue:   []string{"w1", "1", "w2", "2"},
				entries: []string{"w1", live + " 3", "w2", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			}},
			args: []string{"1", "w1", "3", "1", "w2", "1"},
			want: `reply [1 1]
				hash :cap=5 :h=2 a=3 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue w1=1 w2=2 | expires t+600000 last~+540000
				entries w1=t~+60000 3 w2=t~+60000 1 | expires t+600000 last~+540000
				published []`,
		},
		{
			name: "permits free and a dead head that does not fit them: the waiter behind it is told",
			states: []qstate{{
				hash:    []string{":cap", "2", ":h", "0"},
				permits: []string{"a", live},
				queue:   []string{"d", "1", "w", "2"},
				entries: []string{"d", dead + " 2", "w", live + " 2"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			}},
			args: []string{"1", "w", "2"},
			want: `reply [2]
				hash :cap=2 :h=0 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue d=1 w=2 | expires t+600000 last~+540000
				entries d=t-100000 2 w=t~+60000 2 | expires t+600000 last~+540000
				published []`,
		},
		{
			name: "permits free and a head without an entry: the waiter behind it is told",
			states: []qstate{{
				hash:    []string{":cap", "2", ":h", "0"},
				permits: []string{"a", live},
				queue:   []string{"d", "1", "w", "2"},
				entries: []string{"w", live + " 2"},
				expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
			}},
			args: []string{"1", "w", "2"},
			want: `reply [2]
				hash :cap=2 :h=0 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue d=1 w=2 | expires t+600000 last~+540000
				entries w=t~+60000 2 | expires t+600000 last~+540000
				published []`,
		},
		{
			name: "a state hash of another type answers its waiters 0; the other semaphore's are refreshed",
			states: []qstate{
				{
					str:     map[int]string{0: "x"},
					queue:   []string{"w", "1"},
					entries: []string{"w", live + " 1"},
					expire:  map[int]string{3: live, 4: live},
				},
				{
					hash:    []string{":cap", "1", ":h", "0"},
					permits: []string{"a", live},
					queue:   []string{"v", "1"},
					entries: []string{"v", live + " 1"},
					expire:  map[int]string{0: live, 1: live, 3: live, 4: live},
				},
			},
			args: []string{"1", "w", "1", "2", "v", "1"},
			want: `reply [0 1]
				hash string x
				permits -
				queue w=1 | expires t+600000 last~+540000
				entries w=t~+60000 1 | expires t+600000 last~+540000
				published []
				hash :cap=1 :h=0 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue v=1 | expires t+600000 last~+540000
				entries v=t~+60000 1 | expires t+600000 last~+540000
				published []`,
		},
		{
			name: "a permits set of another type answers its waiters 0",
			states: []qstate{{
				hash:    []string{":cap", "1", ":h", "0"},
				str:     map[int]string{1: "x"},
				queue:   []string{"w", "1"},
				entries: []string{"w", live + " 1"},
				expire:  map[int]string{3: live, 4: live},
			}},
			args: []string{"1", "w", "1"},
			want: `reply [0]
				hash :cap=1 :h=0 | expires none
				permits string x
				queue w=1 | expires t+600000 last~+540000
				entries w=t~+60000 1 | expires t+600000 last~+540000
				published []`,
		},
		{
			name: "a queue of another type answers its waiter 0 and touches nothing",
			states: []qstate{{
				hash:    []string{":cap", "1", ":h", "0"},
				permits: []string{"a", live},
				str:     map[int]string{3: "x"},
				entries: []string{"w", live + " 1"},
				expire:  map[int]string{0: live, 1: live, 4: live},
			}},
			args: []string{"1", "w", "1"},
			want: `reply [0]
				hash :cap=1 :h=0 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue string x
				entries w=t+600000 1 | expires t+600000 last+0
				published []`,
		},
		{
			name: "each semaphore of a call that needs a pass has its first waiter told",
			states: []qstate{
				{
					queue:   []string{"w1", "1", "w2", "2"},
					entries: []string{"w1", live + " 1", "w2", live + " 1"},
					expire:  map[int]string{3: live, 4: live},
				},
				{
					hash:    []string{":cap", "2", ":h", "0"},
					permits: []string{"a", live},
					queue:   []string{"v", "1"},
					entries: []string{"v", live + " 1"},
					expire:  map[int]string{0: live, 1: live, 3: "t+20000", 4: "t+20000"},
				},
			},
			args:  []string{"1", "w1", "1", "2", "v", "1", "1", "w2", "1"},
			count: []string{"pexpire"},
			want: `reply [2 2 1]
				calls pexpire=2
				hash -
				permits -
				queue w1=1 w2=2 | expires t+600000 last~+540000
				entries w1=t~+60000 1 w2=t~+60000 1 | expires t+600000 last~+540000
				published []
				hash :cap=2 :h=0 | expires t+600000 last+0
				permits a=t+600000 | expires t+600000 last+0
				queue v=1 | expires t~+63750 last~+3750
				entries v=t~+60000 1 | expires t~+63750 last~+3750
				published []`,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var keys []string
			var qcs []*qcase
			for _, st := range c.states {
				qc := q.start(t, st)
				qcs = append(qcs, qc)
				keys = append(keys, qc.keys[0], qc.keys[1], qc.keys[3], qc.keys[4])
			}
			got := q.exec(t, refresh, keys, append([]string{"60000"}, c.args...), c.count)
			for _, qc := range qcs {
				got += qc.dump(t)
			}
			slack := serverMs(t, q.e) - qcs[0].base + 1
			want := trimState(c.want)
			if !matchState(got, want, slack) {
				t.Errorf("after a refresh of %q (times within %d ms):\n%s\nwant\n%s", c.args, slack, got, want)
			}
		})
	}
}
