package mutex_test

// Tests of what rwmutex_abandon promises, as a class (issue 32): its
// header and body read line by line, each path asserted both ways, with
// the reply and every key the script may write (the state hash, the
// readers' set, the tombstones, the writers' marks, their TTLs) and every
// wake-up it publishes, on each channel, plain or sharded. The script is
// driven directly (TestScriptRWAbandonClass): the states that tell the
// paths apart (a stale q, a mark ending at q, a run of 16 listed holds, a
// readers' set shorter than the keep time) are written by hand.
//
// The paths, each with rows that must and must not take it:
//   - a malformed attempt id is an error and writes nothing;
//   - a withdrawal ("m") with no mark id or a mark not listed answers 0
//     and changes nothing; one of a listed mark answers 1, takes it and
//     the dead marks out, and brings q to the latest live mark: readers
//     are woken when q comes sooner or goes while it ran, not when it
//     stays, grows or was over; a hash without q gets none;
//   - a Lock's give-back ("w") leaves a tombstone for that attempt (never
//     shortening the tombstones' life) and withdraws the call's mark, with
//     the same wake-ups, when another attempt holds; when its attempt
//     holds it ends the hold (o n a e go, f stays), lists its token in c
//     (a new run, or after what c lists, 16 at most), keeps the hash for
//     the keep time or until q, and wakes each side once;
//   - an RLock's give-back ("r") leaves a tombstone and takes out its live
//     read entry (1) or nothing (0); the last live reader gone cuts the
//     set's life to the keep time (never lengthening it) and wakes one
//     writer per process.

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// rwAbandonState is what a row of TestScriptRWAbandonClass set up and found.
type rwAbandonState struct {
	now    int64 // server ms before the set-up
	after  int64 // server ms after the call
	reply  int64
	err    error
	fields map[string]string
	marks  map[string]float64
	reads  map[string]float64
	tombs  map[string]string
	pttl   map[string]int64 // "h", "z", "t", "m"
	rd, wr []string         // wake-ups published, "p:" or "s:" and the payload
}

func TestScriptRWAbandonClass(t *testing.T) {
	ctx := context.Background()
	addr := redistest.Single(t).Addr()
	client := redistest.Client(t, addr)
	sc := newScripts(t, client)
	var err error
	abandon, _ := sc.Script("rwmutex_abandon")
	itoa := func(n int64) string { return strconv.FormatInt(n, 10) }
	// One lock for every row (its keys deleted before each): the
	// subscriptions to its two channels are made once.
	_, _, keys := rwScriptKeys(className("rw-abandon-class"))
	hKey, zKey, tKey, mKey := keys[0], keys[1], keys[2], keys[5]
	rdHeard, wrHeard := listenBoth(t, addr, keys[3]), listenBoth(t, addr, keys[4])
	// heard returns the messages f's subscriptions got since the last
	// call, plain ones first ("p:" and the payload), then sharded ("s:").
	seen := map[*func() (plain, sharded []string)][2]int{}
	heard := func(f *func() (plain, sharded []string)) []string {
		p, s := (*f)()
		n := seen[f]
		seen[f] = [2]int{len(p), len(s)}
		var out []string
		for _, m := range p[n[0]:] {
			out = append(out, "p:"+m)
		}
		for _, m := range s[n[1]:] {
			out = append(out, "s:"+m)
		}
		return out
	}

	in := func(t *testing.T, what string, got, lo, hi int64) {
		t.Helper()
		if got < lo || got > hi {
			t.Errorf("%s = %d, want in [%d, %d]", what, got, lo, hi)
		}
	}
	fieldsAre := func(t *testing.T, s *rwAbandonState, want map[string]string) {
		t.Helper()
		if !maps.Equal(s.fields, want) && (len(s.fields) != 0 || len(want) != 0) {
			t.Errorf("hash = %v, want %v", s.fields, want)
		}
	}
	membersAre := func(t *testing.T, what string, got map[string]float64, want ...string) {
		t.Helper()
		names := slices.Sorted(maps.Keys(got))
		slices.Sort(want)
		if !slices.Equal(names, want) && (len(names) != 0 || len(want) != 0) {
			t.Errorf("%s = %v, want %v", what, names, want)
		}
	}
	tombsAre := func(t *testing.T, s *rwAbandonState, want ...string) {
		t.Helper()
		names := slices.Sorted(maps.Keys(s.tombs))
		slices.Sort(want)
		if !slices.Equal(names, want) && (len(names) != 0 || len(want) != 0) {
			t.Errorf("tombstones = %v, want %v", names, want)
			return
		}
		if len(want) > 0 {
			in(t, "the tombstones' PTTL", s.pttl["t"], 1, 30_000)
		}
	}
	woke := func(t *testing.T, s *rwAbandonState, rd, wr []string) {
		t.Helper()
		if !slices.Equal(s.rd, rd) && (len(s.rd) != 0 || len(rd) != 0) {
			t.Errorf("readers' wake-ups = %q, want %q", s.rd, rd)
		}
		if !slices.Equal(s.wr, wr) && (len(s.wr) != 0 || len(wr) != 0) {
			t.Errorf("writers' wake-ups = %q, want %q", s.wr, wr)
		}
	}
	replied := func(t *testing.T, s *rwAbandonState, want int64) {
		t.Helper()
		if s.err != nil || s.reply != want {
			t.Errorf("reply = %d, %v; want %d", s.reply, s.err, want)
		}
	}
	// held is W's write hold by attempt w.1 with token 500 and extra
	// fields.
	held := func(owner, attempt string, extra ...string) func(s *rwAbandonState) map[string]string {
		return func(s *rwAbandonState) map[string]string {
			h := map[string]string{"o": owner, "n": "1", "f": "500", "a": attempt, "e": itoa(s.now + 30_000)}
			for i := 0; i+1 < len(extra); i += 2 {
				h[extra[i]] = extra[i+1]
			}
			return h
		}
	}
	// rel returns a map of now-relative values (ms) from name, offset pairs.
	rel := func(pairs ...any) func(s *rwAbandonState) map[string]int64 {
		return func(s *rwAbandonState) map[string]int64 {
			m := map[string]int64{}
			for i := 0; i+1 < len(pairs); i += 2 {
				m[pairs[i].(string)] = s.now + int64(pairs[i+1].(int))
			}
			return m
		}
	}
	// run returns c's start and n listed tokens, all below f (500).
	run := func(n int) []string {
		out := []string{"100"}
		for i := range n {
			out = append(out, strconv.Itoa(200+i))
		}
		return out
	}
	ended := func(c string) map[string]string { return map[string]string{"f": "500", "c": c} }

	type setup struct {
		hash    func(s *rwAbandonState) map[string]string
		hashMs  int64 // default 60 s
		reads   func(s *rwAbandonState) map[string]int64
		readsMs int64 // default 60 s
		marks   func(s *rwAbandonState) map[string]int64
		tombMs  int64 // a tombstone of x.1 with this PTTL (0: none)
	}
	for _, tc := range []struct {
		name  string
		setup setup
		args  []string // owner, attempt, kind, mode; the keep time (20 s), the tombstone's life (30 s) follow; then the mark id
		mark  string
		check func(t *testing.T, s *rwAbandonState)
	}{
		{
			name:  "malformed attempt id",
			setup: setup{hash: held("W", "w1")},
			args:  []string{"W", "w1", "w", "p"},
			check: func(t *testing.T, s *rwAbandonState) {
				if s.err == nil || !strings.Contains(s.err.Error(), "malformed attempt id") {
					t.Errorf("reply = %d, %v; want the malformed attempt id error", s.reply, s.err)
				}
				fieldsAre(t, s, held("W", "w1")(s))
				tombsAre(t, s)
				woke(t, s, nil, nil)
			},
		},

		// Withdrawals.
		{
			name: "withdrawal without a mark id",
			setup: setup{
				hash: func(s *rwAbandonState) map[string]string {
					return map[string]string{"f": "5", "q": itoa(s.now + 20_000)}
				},
				marks: rel("mw.1", 20_000),
			},
			args: []string{"W", "mw.1", "m", "p"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 0)
				fieldsAre(t, s, map[string]string{"f": "5", "q": itoa(s.now + 20_000)})
				membersAre(t, "marks", s.marks, "mw.1")
				tombsAre(t, s)
				woke(t, s, nil, nil)
			},
		},
		{
			name: "withdrawal of a mark not listed",
			setup: setup{
				hash: func(s *rwAbandonState) map[string]string {
					return map[string]string{"f": "5", "q": itoa(s.now + 20_000)}
				},
				marks: rel("mx.1", 20_000, "dead.1", -1000),
			},
			args: []string{"W", "mw.1", "m", "p"}, mark: "mw.1",
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 0)
				fieldsAre(t, s, map[string]string{"f": "5", "q": itoa(s.now + 20_000)})
				membersAre(t, "marks (the dead one too: nothing was withdrawn)", s.marks, "mx.1", "dead.1")
				woke(t, s, nil, nil)
			},
		},
		{
			name: "withdrawal, another mark ends sooner",
			setup: setup{
				hash: func(s *rwAbandonState) map[string]string {
					return map[string]string{"f": "5", "q": itoa(s.now + 20_000)}
				},
				marks: rel("mw.1", 20_000, "mx.1", 5000, "dead.1", -1000, "dead.2", -2000),
			},
			args: []string{"W", "mw.1", "m", "p"}, mark: "mw.1",
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				fieldsAre(t, s, map[string]string{"f": "5", "q": itoa(s.now + 5000)})
				membersAre(t, "marks", s.marks, "mx.1")
				tombsAre(t, s)
				woke(t, s, []string{"p:1000000"}, nil)
			},
		},
		{
			name: "withdrawal, another mark ends sooner, sharded",
			setup: setup{
				hash: func(s *rwAbandonState) map[string]string {
					return map[string]string{"f": "5", "q": itoa(s.now + 20_000)}
				},
				marks: rel("mw.1", 20_000, "mx.1", 5000),
			},
			args: []string{"W", "mw.1", "m", "s"}, mark: "mw.1",
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				fieldsAre(t, s, map[string]string{"f": "5", "q": itoa(s.now + 5000)})
				woke(t, s, []string{"s:1000000"}, nil)
			},
		},
		{
			// q was behind the marks (written by hand): it catches up,
			// and nobody is let in sooner, so nobody is woken.
			name: "withdrawal, another mark ends after q",
			setup: setup{
				hash:  func(s *rwAbandonState) map[string]string { return map[string]string{"f": "5", "q": itoa(s.now + 5000)} },
				marks: rel("mw.1", 3000, "mx.1", 9000),
			},
			args: []string{"W", "mw.1", "m", "p"}, mark: "mw.1",
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				fieldsAre(t, s, map[string]string{"f": "5", "q": itoa(s.now + 9000)})
				membersAre(t, "marks", s.marks, "mx.1")
				woke(t, s, nil, nil)
			},
		},
		{
			name: "withdrawal, another mark ends at q",
			setup: setup{
				hash:  func(s *rwAbandonState) map[string]string { return map[string]string{"f": "5", "q": itoa(s.now + 9000)} },
				marks: rel("mw.1", 9000, "mx.1", 9000),
			},
			args: []string{"W", "mw.1", "m", "p"}, mark: "mw.1",
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				fieldsAre(t, s, map[string]string{"f": "5", "q": itoa(s.now + 9000)})
				membersAre(t, "marks", s.marks, "mx.1")
				woke(t, s, nil, nil)
			},
		},
		{
			name: "withdrawal, hash without q",
			setup: setup{
				hash:  func(s *rwAbandonState) map[string]string { return map[string]string{"f": "5"} },
				marks: rel("mw.1", 20_000, "mx.1", 5000),
			},
			args: []string{"W", "mw.1", "m", "p"}, mark: "mw.1",
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				fieldsAre(t, s, map[string]string{"f": "5"})
				membersAre(t, "marks", s.marks, "mx.1")
				woke(t, s, nil, nil)
			},
		},
		{
			name: "withdrawal of the last mark, q running",
			setup: setup{
				hash:  func(s *rwAbandonState) map[string]string { return map[string]string{"f": "5", "q": itoa(s.now + 9000)} },
				marks: rel("mw.1", 9000, "dead.1", -1000, "dead.2", -2000),
			},
			args: []string{"W", "mw.1", "m", "p"}, mark: "mw.1",
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				fieldsAre(t, s, map[string]string{"f": "5"})
				membersAre(t, "marks", s.marks)
				woke(t, s, []string{"p:1000000"}, nil)
			},
		},
		{
			name: "withdrawal of the last mark, q over",
			setup: setup{
				hash:  func(s *rwAbandonState) map[string]string { return map[string]string{"f": "5", "q": itoa(s.now - 1000)} },
				marks: rel("mw.1", 9000),
			},
			args: []string{"W", "mw.1", "m", "p"}, mark: "mw.1",
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				fieldsAre(t, s, map[string]string{"f": "5"})
				woke(t, s, nil, nil)
			},
		},
		{
			name:  "withdrawal of the last mark, no hash",
			setup: setup{marks: rel("mw.1", 9000)},
			args:  []string{"W", "mw.1", "m", "p"}, mark: "mw.1",
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				fieldsAre(t, s, nil)
				membersAre(t, "marks", s.marks)
				woke(t, s, nil, nil)
			},
		},

		// A Lock's give-back, its attempt not holding.
		{
			name: "write give-back, another owner holds",
			setup: setup{
				hash:  held("B", "b.1", "q", "q"),
				marks: rel("mw.1", 20_000, "mx.1", 5000),
			},
			args: []string{"W", "w.1", "w", "p"}, mark: "mw.1",
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 0)
				fieldsAre(t, s, held("B", "b.1", "q", itoa(s.now+5000))(s))
				membersAre(t, "marks", s.marks, "mx.1")
				tombsAre(t, s, "w.1")
				in(t, "the hash's PTTL (left alone)", s.pttl["h"], 50_000, 60_000)
				woke(t, s, []string{"p:1000000"}, nil)
			},
		},
		{
			name:  "write give-back, another attempt of the owner holds",
			setup: setup{hash: held("W", "w.2")},
			args:  []string{"W", "w.1", "w", "p"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 0)
				fieldsAre(t, s, held("W", "w.2")(s))
				tombsAre(t, s, "w.1")
				woke(t, s, nil, nil)
			},
		},
		{
			name:  "write give-back, longer tombstones kept",
			setup: setup{tombMs: 60_000},
			args:  []string{"W", "w.1", "w", "p"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 0)
				if _, ok := s.tombs["w.1"]; !ok || len(s.tombs) != 2 {
					t.Errorf("tombstones = %v, want x.1 and w.1", s.tombs)
				}
				in(t, "the tombstones' PTTL (not cut to the lease)", s.pttl["t"], 50_000, 60_000)
			},
		},
		{
			name:  "write give-back, shorter tombstones lengthened",
			setup: setup{tombMs: 1000},
			args:  []string{"W", "w.1", "w", "p"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 0)
				in(t, "the tombstones' PTTL (the lease)", s.pttl["t"], 20_000, 30_000)
			},
		},

		// A Lock's give-back, its attempt holding.
		{
			name:  "write give-back of the hold, no run yet",
			setup: setup{hash: held("W", "w.1")},
			args:  []string{"W", "w.1", "w", "p"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				fieldsAre(t, s, ended("501"))
				tombsAre(t, s, "w.1")
				in(t, "the hash's PTTL (the keep time)", s.pttl["h"], 1, 20_000)
				woke(t, s, []string{"p:1000000"}, []string{"p:1"})
			},
		},
		{
			name:  "write give-back of the hold, sharded",
			setup: setup{hash: held("W", "w.1")},
			args:  []string{"W", "w.1", "w", "s"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				woke(t, s, []string{"s:1000000"}, []string{"s:1"})
			},
		},
		{
			name:  "write give-back of the hold, run listed",
			setup: setup{hash: held("W", "w.1", "c", "100 200")},
			args:  []string{"W", "w.1", "w", "p"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				fieldsAre(t, s, ended("100 200 500"))
			},
		},
		{
			name:  "write give-back of the hold, 15 listed",
			setup: setup{hash: held("W", "w.1", "c", strings.Join(run(15), " "))},
			args:  []string{"W", "w.1", "w", "p"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				fieldsAre(t, s, ended(strings.Join(append(run(15), "500"), " ")))
			},
		},
		{
			// A 17th listed token pushes the oldest out; the run then
			// starts one past it.
			name:  "write give-back of the hold, 16 listed",
			setup: setup{hash: held("W", "w.1", "c", strings.Join(run(16), " "))},
			args:  []string{"W", "w.1", "w", "p"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				fieldsAre(t, s, ended(strings.Join(append(append([]string{"201"}, run(16)[2:]...), "500"), " ")))
			},
		},
		{
			// Its own mark withdrawn, the other's sooner: q comes back to
			// it, and the readers are woken once, by the release.
			name: "write give-back of the hold, own mark and a sooner one",
			setup: setup{
				hash:  held("W", "w.1", "c", "100", "q", "q"),
				marks: rel("mw.1", 50_000, "mx.1", 40_000),
			},
			args: []string{"W", "w.1", "w", "p"}, mark: "mw.1",
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				fieldsAre(t, s, map[string]string{"f": "500", "c": "100 500", "q": itoa(s.now + 40_000)})
				membersAre(t, "marks", s.marks, "mx.1")
				in(t, "the hash's PTTL (until q)", s.pttl["h"], 35_000, 40_000)
				woke(t, s, []string{"p:1000000"}, []string{"p:1"})
			},
		},
		{
			name: "write give-back of the hold, another writer's mark runs",
			setup: setup{
				hash:  held("W", "w.1", "c", "100", "q", "q"),
				marks: rel("mx.1", 40_000),
			},
			args: []string{"W", "w.1", "w", "p"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				fieldsAre(t, s, map[string]string{"f": "500", "c": "100 500", "q": itoa(s.now + 40_000)})
				membersAre(t, "marks", s.marks, "mx.1")
				in(t, "the hash's PTTL (until q)", s.pttl["h"], 35_000, 40_000)
				woke(t, s, []string{"p:1000000"}, []string{"p:1"})
			},
		},

		// An RLock's give-back.
		{
			name:  "read give-back, another reader stays",
			setup: setup{reads: rel("r.1", 30_000, "s.1", 30_000)},
			args:  []string{"R", "r.1", "r", "p"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				membersAre(t, "read entries", s.reads, "s.1")
				in(t, "the readers' set's PTTL (left alone)", s.pttl["z"], 50_000, 60_000)
				tombsAre(t, s, "r.1")
				woke(t, s, nil, nil)
			},
		},
		{
			name:  "read give-back of the last live reader",
			setup: setup{reads: rel("r.1", 30_000, "gone.1", -1000, "q.1", -1)},
			args:  []string{"R", "r.1", "r", "p"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				membersAre(t, "read entries", s.reads, "gone.1", "q.1")
				in(t, "the readers' set's PTTL (the keep time)", s.pttl["z"], 1, 20_000)
				tombsAre(t, s, "r.1")
				woke(t, s, nil, []string{"p:1"})
			},
		},
		{
			name:  "read give-back of the last live reader, sharded",
			setup: setup{reads: rel("r.1", 30_000)},
			args:  []string{"R", "r.1", "r", "s"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				woke(t, s, nil, []string{"s:1"})
			},
		},
		{
			name:  "read give-back of the last live reader, set shorter than the keep time",
			setup: setup{reads: rel("r.1", 30_000, "q.1", -1), readsMs: 5000},
			args:  []string{"R", "r.1", "r", "p"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 1)
				in(t, "the readers' set's PTTL (not lengthened)", s.pttl["z"], 1, 5000)
				woke(t, s, nil, []string{"p:1"})
			},
		},
		{
			name:  "read give-back, no entry",
			setup: setup{reads: rel("s.1", 30_000), hash: held("W", "w.1")},
			args:  []string{"R", "r.1", "r", "p"},
			check: func(t *testing.T, s *rwAbandonState) {
				replied(t, s, 0)
				membersAre(t, "read entries", s.reads, "s.1")
				fieldsAre(t, s, held("W", "w.1")(s))
				tombsAre(t, s, "r.1")
				woke(t, s, nil, nil)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &rwAbandonState{now: serverMicros(t, client) / 1000}
			do := func(cmd ...string) {
				t.Helper()
				if err := client.Do(ctx, client.B().Arbitrary(cmd[0]).Keys(cmd[1]).Args(cmd[2:]...).Build()).Error(); err != nil {
					t.Fatalf("%v: %v", cmd, err)
				}
			}
			do("DEL", hKey, zKey, tKey, mKey)
			orDefault := func(ms int64) string {
				if ms == 0 {
					ms = 60_000
				}
				return itoa(ms)
			}
			if tc.setup.hash != nil {
				cmd := []string{"HSET", hKey}
				for k, v := range tc.setup.hash(s) {
					if k == "q" && v == "q" { // q at the latest mark's end
						v = itoa(slices.Max(slices.Collect(maps.Values(tc.setup.marks(s)))))
					}
					cmd = append(cmd, k, v)
				}
				do(cmd...)
				do("PEXPIRE", hKey, orDefault(tc.setup.hashMs))
			}
			if tc.setup.reads != nil {
				for id, score := range tc.setup.reads(s) {
					if id == "q.1" { // released a moment ago, kept 5 s
						score = -(s.now + 5000)
					}
					do("ZADD", zKey, itoa(score), id)
				}
				do("PEXPIRE", zKey, orDefault(tc.setup.readsMs))
			}
			if tc.setup.marks != nil {
				for id, end := range tc.setup.marks(s) {
					do("ZADD", mKey, itoa(end), id)
				}
				do("PEXPIRE", mKey, "60000")
			}
			if tc.setup.tombMs != 0 {
				do("HSET", tKey, "x.1", "1")
				do("PEXPIRE", tKey, itoa(tc.setup.tombMs))
			}
			s.reply, s.err = abandon.Exec(ctx, keys, append(slices.Clone(tc.args), "20000", "30000", tc.mark)).AsInt64()
			s.after = serverMicros(t, client) / 1000
			if s.fields, err = client.Do(ctx, client.B().Hgetall().Key(hKey).Build()).AsStrMap(); err != nil {
				t.Fatal(err)
			}
			if s.tombs, err = client.Do(ctx, client.B().Hgetall().Key(tKey).Build()).AsStrMap(); err != nil {
				t.Fatal(err)
			}
			s.marks, s.reads = zscores(t, client, mKey), zscores(t, client, zKey)
			s.pttl = map[string]int64{}
			for suffix, key := range map[string]string{"h": hKey, "z": zKey, "t": tKey, "m": mKey} {
				if s.pttl[suffix], err = client.Do(ctx, client.B().Pttl().Key(key).Build()).AsInt64(); err != nil {
					t.Fatal(err)
				}
			}
			s.rd, s.wr = heard(&rdHeard), heard(&wrHeard)
			tc.check(t, s)
		})
	}
}
