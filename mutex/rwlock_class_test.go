package mutex_test

// Tests of what rwmutex_lock promises, as a class (issue 32): its header
// and body read line by line, each path asserted both ways, what must be
// refused and what must be granted, with the exact reply and every key
// the script may write (the state hash, the readers' set, the writers'
// marks). The script is driven directly (TestScriptRWLockClass): the
// states that tell the paths apart (a token ahead of the clock, an
// expired hold whose hash lives, dead read entries, other writers'
// marks, an older attempt of the same value) are written by hand first,
// and RWMutex reports none of the figures.
//
// The paths, each with rows that must and must not take it:
//   - a nested Lock joins the hold only if the same owner holds it now
//     with the token it names: {1, holds + 1, token} and n counts it;
//     otherwise {-1, 0, 0} and nothing changes;
//   - a malformed attempt id is an error; an attempt with a tombstone is
//     refused with the holder's wait (0 if nobody holds) and writes
//     nothing, not even a mark;
//   - a refusal (another owner holds, or a live reader) answers the wait
//     until the blocking lease ends (the last reader's), at least 1; with
//     a mark and a mark id it lists the mark, keeps the marks set and the
//     hash alive for the mark and pushes q to the mark's end if later;
//     without (TryLock) it writes nothing;
//   - an attempt older than the one holding (same nonce, lower sequence
//     number, compared as numbers) is refused without a mark; a newer one,
//     or one of another nonce, supersedes the hold;
//   - read entries whose score is in [-now, now] go, 16 at most; live ones
//     and released ones still kept stay;
//   - the token is the server's TIME in microseconds, or the last plus
//     one when that is larger; the grant writes o, n = 1, f, a, e; c
//     starts a run on a hash without f, lists the replaced hold's token
//     when o is still there, and is kept on a free hash;
//   - a grant takes its own mark out and brings q back to the latest live
//     mark, or deletes it; dead marks go; without its mark in the set, q
//     is left alone;
//   - the hash lives at least the lease, never cut shorter.

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// rwLockState is what a row of TestScriptRWLockClass set up and found.
type rwLockState struct {
	now    int64 // server ms before the set-up (and the call)
	nowUs  int64 // server µs before the set-up
	after  int64 // server µs just after the call
	ahead  int64 // a token well ahead of the server's clock
	reply  []int64
	err    error
	fields map[string]string
	marks  map[string]float64 // writers' marks after the call
	reads  map[string]float64 // read entries after the call
	pttl   map[string]int64   // "h", "m": PTTL after the call
}

func (s *rwLockState) num(field string) int64 {
	n, _ := strconv.ParseInt(s.fields[field], 10, 64)
	return n
}

// zscores returns the members of the sorted set key with their scores.
func zscores(t *testing.T, client rueidis.Client, key string) map[string]float64 {
	t.Helper()
	zs, err := client.Do(context.Background(), client.B().Zrange().Key(key).Min("0").Max("-1").Withscores().Build()).AsZScores()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, z := range zs {
		out[z.Member] = z.Score
	}
	return out
}

func TestScriptRWLockClass(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc, err := scriptcache.New(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	lock, _ := sc.Script("rwmutex_lock")
	itoa := func(n int64) string { return strconv.FormatInt(n, 10) }

	// in checks lo <= got <= hi.
	in := func(t *testing.T, what string, got, lo, hi int64) {
		t.Helper()
		if got < lo || got > hi {
			t.Errorf("%s = %d, want in [%d, %d]", what, got, lo, hi)
		}
	}
	reply := func(t *testing.T, s *rwLockState, code, second, third int64) {
		t.Helper()
		if s.err != nil || len(s.reply) != 3 || s.reply[0] != code || s.reply[1] != second || s.reply[2] != third {
			t.Errorf("reply = %v, %v; want [%d %d %d]", s.reply, s.err, code, second, third)
		}
	}
	// refused checks a refusal whose wait is want ms less the time
	// between the set-up and the call.
	refused := func(t *testing.T, s *rwLockState, want int64) {
		t.Helper()
		if s.err != nil || len(s.reply) != 3 || s.reply[0] != 0 || s.reply[2] != 0 {
			t.Errorf("reply = %v, %v; want a refusal [0 ~%d 0]", s.reply, s.err, want)
			return
		}
		in(t, "the refusal's wait", s.reply[1], max(want-(s.after/1000-s.now), 1), want)
	}
	fieldsAre := func(t *testing.T, s *rwLockState, want map[string]string) {
		t.Helper()
		if len(s.fields) != len(want) {
			t.Errorf("hash = %v, want %v", s.fields, want)
			return
		}
		for k, v := range want {
			if s.fields[k] != v {
				t.Errorf("hash = %v, want %v", s.fields, want)
				return
			}
		}
	}
	noMarks := func(t *testing.T, s *rwLockState) {
		t.Helper()
		if len(s.marks) != 0 {
			t.Errorf("marks = %v, want none", s.marks)
		}
	}
	// granted checks a grant's reply and the hold it wrote: owner,
	// attempt, token, one hold, a lease of 30 s.
	granted := func(t *testing.T, s *rwLockState, owner, attempt string, token int64) {
		t.Helper()
		reply(t, s, 1, 1, token)
		if s.fields["o"] != owner || s.fields["n"] != "1" || s.num("f") != token || s.fields["a"] != attempt {
			t.Errorf("hash after the grant = %v, want o %s, n 1, f %d, a %s", s.fields, owner, token, attempt)
		}
		in(t, "the lease's end e", s.num("e"), s.now+30_000, s.after/1000+30_000)
	}
	// clockToken checks that the token came from the server's clock.
	clockToken := func(t *testing.T, s *rwLockState) int64 {
		t.Helper()
		if len(s.reply) == 3 {
			in(t, "the token", s.reply[2], s.nowUs, s.after)
			return s.reply[2]
		}
		return 0
	}

	type setup struct {
		hash   func(s *rwLockState) map[string]string // nil: none
		hashMs int64                                  // the hash's PTTL (default 60 s)
		reads  func(s *rwLockState) map[string]int64  // read entry -> score
		marks  func(s *rwLockState) map[string]int64  // mark id -> end
		tomb   string                                 // an attempt id with a tombstone
	}
	held := func(owner, attempt string, eRel int64) func(s *rwLockState) map[string]string {
		return func(s *rwLockState) map[string]string {
			return map[string]string{"o": owner, "n": "1", "f": itoa(s.ahead), "a": attempt, "e": itoa(s.now + eRel), "c": itoa(s.ahead - 5)}
		}
	}
	for _, tc := range []struct {
		name  string
		setup setup
		args  func(s *rwLockState) []string // owner, lease, holds, attempt, token, mark ms, mark id
		check func(t *testing.T, s *rwLockState)
	}{
		// Nested.
		{
			name:  "nested joins its hold",
			setup: setup{hash: held("A", "a.1", 30_000)},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "2", "", itoa(s.ahead), "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				reply(t, s, 1, 3, s.ahead)
				if s.fields["n"] != "3" || s.fields["o"] != "A" {
					t.Errorf("hash = %v, want A's hold with n 3", s.fields)
				}
			},
		},
		{
			name:  "nested naming another token",
			setup: setup{hash: held("A", "a.1", 30_000)},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "2", "", itoa(s.ahead - 1), "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				reply(t, s, -1, 0, 0)
				if s.fields["n"] != "1" {
					t.Errorf("n = %q after a refused nested Lock, want 1", s.fields["n"])
				}
			},
		},
		{
			name:  "nested of another owner",
			setup: setup{hash: held("B", "b.1", 30_000)},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "1", "", itoa(s.ahead), "2000", "ma"} },
			check: func(t *testing.T, s *rwLockState) {
				reply(t, s, -1, 0, 0)
				noMarks(t, s)
			},
		},
		{
			name:  "nested after the lease",
			setup: setup{hash: held("A", "a.1", -1)},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "1", "", itoa(s.ahead), "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				reply(t, s, -1, 0, 0)
				if s.fields["n"] != "1" {
					t.Errorf("n = %q after a nested Lock of an expired hold, want 1", s.fields["n"])
				}
			},
		},
		{
			name: "nested with no hash",
			args: func(s *rwLockState) []string { return []string{"A", "30000", "1", "", itoa(s.ahead), "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				reply(t, s, -1, 0, 0)
				fieldsAre(t, s, nil)
			},
		},

		// Attempt ids and tombstones.
		{
			name: "malformed attempt id",
			args: func(s *rwLockState) []string { return []string{"A", "30000", "0", "a1", "", "2000", "ma"} },
			check: func(t *testing.T, s *rwLockState) {
				if s.err == nil || !strings.Contains(s.err.Error(), "malformed attempt id") {
					t.Errorf("reply = %v, %v; want the malformed attempt id error", s.reply, s.err)
				}
				fieldsAre(t, s, nil)
				noMarks(t, s)
			},
		},
		{
			name:  "tombstone, free",
			setup: setup{tomb: "a.1"},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "2000", "ma"} },
			check: func(t *testing.T, s *rwLockState) {
				reply(t, s, 0, 0, 0)
				fieldsAre(t, s, nil)
				noMarks(t, s)
			},
		},
		{
			name:  "tombstone, held",
			setup: setup{tomb: "a.1", hash: held("B", "b.1", 30_000)},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "2000", "ma"} },
			check: func(t *testing.T, s *rwLockState) {
				refused(t, s, 30_000)
				if s.fields["q"] != "" {
					t.Errorf("q = %q after a refused attempt with a tombstone, want none", s.fields["q"])
				}
				noMarks(t, s)
			},
		},
		{
			name:  "tombstone of another attempt",
			setup: setup{tomb: "a.2"},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				granted(t, s, "A", "a.1", clockToken(t, s))
			},
		},

		// Refusals, with and without a mark.
		{
			name:  "refused by a writer, mark",
			setup: setup{hash: held("B", "b.1", 30_000)},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "2000", "ma"} },
			check: func(t *testing.T, s *rwLockState) {
				refused(t, s, 30_000)
				end := int64(s.marks["ma"])
				in(t, "A's mark's end", end, s.now+2000, s.after/1000+2000)
				if len(s.marks) != 1 || s.num("q") != end {
					t.Errorf("marks = %v, q = %q; want A's mark alone and q at its end %d", s.marks, s.fields["q"], end)
				}
				in(t, "the marks' PTTL", s.pttl["m"], 1, 2000)
				in(t, "the hash's PTTL (not cut to the mark)", s.pttl["h"], 50_000, 60_000)
				if s.fields["o"] != "B" || s.num("f") != s.ahead {
					t.Errorf("hash = %v, want B's hold as it was", s.fields)
				}
			},
		},
		{
			// A mark's length with no mark id: the script sets no mark
			// it could not take out again (RWMutex sends a length only
			// with an id; the guard is the script's own).
			name:  "refused by a writer, mark length without an id",
			setup: setup{hash: held("B", "b.1", 30_000)},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "2000", ""} },
			check: func(t *testing.T, s *rwLockState) {
				refused(t, s, 30_000)
				noMarks(t, s)
				if s.fields["q"] != "" {
					t.Errorf("q = %q after a refusal with no mark id, want none", s.fields["q"])
				}
			},
		},
		{
			name:  "refused by a writer, TryLock",
			setup: setup{hash: held("B", "b.1", 30_000)},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				refused(t, s, 30_000)
				noMarks(t, s)
				if s.fields["q"] != "" {
					t.Errorf("q = %q after a TryLock, want none", s.fields["q"])
				}
			},
		},
		{
			name: "refused by a writer, later q kept",
			setup: setup{hash: func(s *rwLockState) map[string]string {
				h := held("B", "b.1", 30_000)(s)
				h["q"] = itoa(s.now + 20_000)
				return h
			}},
			args: func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "2000", "ma"} },
			check: func(t *testing.T, s *rwLockState) {
				refused(t, s, 30_000)
				if s.num("q") != s.now+20_000 {
					t.Errorf("q = %q, want the later mark's end %d kept", s.fields["q"], s.now+20_000)
				}
				if _, ok := s.marks["ma"]; !ok || len(s.marks) != 1 {
					t.Errorf("marks = %v, want A's", s.marks)
				}
			},
		},
		{
			name: "refused by a writer, short hash kept for the mark",
			setup: setup{
				hash:   held("B", "b.1", 900),
				hashMs: 1000,
			},
			args: func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "5000", "ma"} },
			check: func(t *testing.T, s *rwLockState) {
				refused(t, s, 900)
				in(t, "the hash's PTTL (more than the 1 s it had)", s.pttl["h"], 1001, 5000)
				in(t, "the marks' PTTL", s.pttl["m"], 1, 5000)
			},
		},
		{
			name: "refused by a writer, longer marks set kept",
			setup: setup{
				hash:  held("B", "b.1", 30_000),
				marks: func(s *rwLockState) map[string]int64 { return map[string]int64{"mx": s.now + 50_000} },
			},
			args: func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "2000", "ma"} },
			check: func(t *testing.T, s *rwLockState) {
				refused(t, s, 30_000)
				in(t, "the marks' PTTL (not cut to A's mark)", s.pttl["m"], 50_000, 60_000)
				if len(s.marks) != 2 {
					t.Errorf("marks = %v, want X's and A's", s.marks)
				}
			},
		},
		{
			// The first reader's lease, not the last's: a lease that runs
			// out publishes nothing, and the other readers' releases wake
			// the writers only when no live reader is left.
			name: "refused by readers, the first one's wait",
			setup: setup{reads: func(s *rwLockState) map[string]int64 {
				return map[string]int64{"r.1": s.now + 10_000, "r.2": s.now + 20_000}
			}},
			args: func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "2000", "ma"} },
			check: func(t *testing.T, s *rwLockState) {
				refused(t, s, 10_000)
				if len(s.fields) != 1 || s.num("q") != int64(s.marks["ma"]) {
					t.Errorf("hash = %v, marks %v; want only q, at A's mark's end", s.fields, s.marks)
				}
				in(t, "the hash's PTTL", s.pttl["h"], 1, 2000)
				if len(s.reads) != 2 {
					t.Errorf("read entries = %v, want both", s.reads)
				}
			},
		},
		{
			name: "refused by readers, TryLock",
			setup: setup{reads: func(s *rwLockState) map[string]int64 {
				return map[string]int64{"r.1": s.now + 10_000}
			}},
			args: func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				refused(t, s, 10_000)
				fieldsAre(t, s, nil)
				noMarks(t, s)
			},
		},

		// Attempts of the same value.
		{
			name:  "older attempt refused",
			setup: setup{hash: held("A", "n.10", 30_000)},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "0", "n.9", "", "2000", "ma"} },
			check: func(t *testing.T, s *rwLockState) {
				refused(t, s, 30_000)
				noMarks(t, s)
				if s.fields["a"] != "n.10" || s.num("f") != s.ahead {
					t.Errorf("hash = %v, want n.10's hold as it was", s.fields)
				}
			},
		},
		{
			name:  "newer attempt supersedes",
			setup: setup{hash: held("A", "n.9", 30_000)},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "0", "n.10", "", "2000", "ma"} },
			check: func(t *testing.T, s *rwLockState) {
				granted(t, s, "A", "n.10", s.ahead+1)
				if want := itoa(s.ahead-5) + " " + itoa(s.ahead); s.fields["c"] != want {
					t.Errorf("c = %q, want %q (the superseded hold listed)", s.fields["c"], want)
				}
				noMarks(t, s)
			},
		},
		{
			// Not older: the same attempt again (a repeated call)
			// supersedes its own hold.
			name:  "same attempt again supersedes",
			setup: setup{hash: held("A", "n.5", 30_000)},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "0", "n.5", "", "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				granted(t, s, "A", "n.5", s.ahead+1)
				if want := itoa(s.ahead-5) + " " + itoa(s.ahead); s.fields["c"] != want {
					t.Errorf("c = %q, want %q (the superseded hold listed)", s.fields["c"], want)
				}
			},
		},
		{
			name:  "another nonce supersedes",
			setup: setup{hash: held("A", "x.9", 30_000)},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "0", "n.1", "", "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				granted(t, s, "A", "n.1", s.ahead+1)
			},
		},

		// Read entries.
		{
			name: "dead read entries go, 16 at most",
			setup: setup{reads: func(s *rwLockState) map[string]int64 {
				r := map[string]int64{"kept": -(s.now + 5_000)}
				for i := range 17 {
					r["x."+strconv.Itoa(i)] = s.now - 1000 - int64(i)
				}
				r["old"] = -(s.now - 1000)
				return r
			}},
			args: func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				clockToken(t, s)
				if s.err != nil || len(s.reply) != 3 || s.reply[0] != 1 {
					t.Errorf("reply = %v, %v; want granted", s.reply, s.err)
				}
				if _, ok := s.reads["kept"]; !ok || len(s.reads) != 3 {
					t.Errorf("read entries left = %v, want the kept release and two of the 18 dead ones", s.reads)
				}
			},
		},

		// Tokens and the run.
		{
			name: "new hash",
			args: func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				tok := clockToken(t, s)
				granted(t, s, "A", "a.1", tok)
				if len(s.fields) != 6 || s.fields["c"] != itoa(tok) {
					t.Errorf("hash = %v, want o n f a e and c = the token", s.fields)
				}
				in(t, "the hash's PTTL", s.pttl["h"], 20_000, 30_000)
			},
		},
		{
			name: "free hash, token ahead",
			setup: setup{hash: func(s *rwLockState) map[string]string {
				return map[string]string{"f": itoa(s.ahead), "c": itoa(s.ahead-9) + " " + itoa(s.ahead-4), "r": "B " + itoa(s.ahead)}
			}},
			args: func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				granted(t, s, "A", "a.1", s.ahead+1)
				if want := itoa(s.ahead-9) + " " + itoa(s.ahead-4); s.fields["c"] != want {
					t.Errorf("c = %q, want %q kept", s.fields["c"], want)
				}
				in(t, "the hash's PTTL (not cut to the lease)", s.pttl["h"], 50_000, 60_000)
			},
		},
		{
			name: "free hash, token behind",
			setup: setup{hash: func(s *rwLockState) map[string]string {
				return map[string]string{"f": itoa(s.nowUs - 10_000_000), "c": itoa(s.nowUs - 20_000_000)}
			}},
			args: func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				granted(t, s, "A", "a.1", clockToken(t, s))
			},
		},
		{
			name:  "expired hold replaced",
			setup: setup{hash: held("B", "b.1", -1)},
			args:  func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				granted(t, s, "A", "a.1", s.ahead+1)
				if want := itoa(s.ahead-5) + " " + itoa(s.ahead); s.fields["c"] != want {
					t.Errorf("c = %q, want %q (the expired hold listed)", s.fields["c"], want)
				}
			},
		},

		// The grant and the marks.
		{
			name: "grant takes its mark out, q to the latest live one",
			setup: setup{
				hash: func(s *rwLockState) map[string]string {
					return map[string]string{"f": itoa(s.ahead), "c": itoa(s.ahead), "q": itoa(s.now + 9_000)}
				},
				marks: func(s *rwLockState) map[string]int64 {
					return map[string]int64{"ma": s.now + 9_000, "mx": s.now + 5_000, "dead": s.now - 1000}
				},
			},
			args: func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "2000", "ma"} },
			check: func(t *testing.T, s *rwLockState) {
				granted(t, s, "A", "a.1", s.ahead+1)
				if len(s.marks) != 1 || int64(s.marks["mx"]) != s.now+5_000 || s.num("q") != s.now+5_000 {
					t.Errorf("marks = %v, q = %q; want X's mark alone and q at its end %d", s.marks, s.fields["q"], s.now+5_000)
				}
			},
		},
		{
			name: "grant takes the last mark out, q goes",
			setup: setup{
				hash: func(s *rwLockState) map[string]string {
					return map[string]string{"f": itoa(s.ahead), "c": itoa(s.ahead), "q": itoa(s.now + 9_000)}
				},
				marks: func(s *rwLockState) map[string]int64 { return map[string]int64{"ma": s.now + 9_000} },
			},
			args: func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "2000", "ma"} },
			check: func(t *testing.T, s *rwLockState) {
				granted(t, s, "A", "a.1", s.ahead+1)
				noMarks(t, s)
				if _, ok := s.fields["q"]; ok {
					t.Errorf("q = %q after the only mark was taken out, want none", s.fields["q"])
				}
			},
		},
		{
			name: "grant without its mark listed leaves q",
			setup: setup{
				hash: func(s *rwLockState) map[string]string {
					return map[string]string{"f": itoa(s.ahead), "c": itoa(s.ahead), "q": itoa(s.now + 9_000)}
				},
				marks: func(s *rwLockState) map[string]int64 {
					return map[string]int64{"mx": s.now + 9_000, "dead": s.now - 1000}
				},
			},
			args: func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "2000", "ma"} },
			check: func(t *testing.T, s *rwLockState) {
				granted(t, s, "A", "a.1", s.ahead+1)
				if len(s.marks) != 2 || s.num("q") != s.now+9_000 {
					t.Errorf("marks = %v, q = %q; want both marks and q as they were", s.marks, s.fields["q"])
				}
			},
		},
		{
			// Even a mark listed under the empty id stays: a grant with
			// no mark id takes nothing out.
			name: "TryLock grant leaves q",
			setup: setup{
				hash: func(s *rwLockState) map[string]string {
					return map[string]string{"f": itoa(s.ahead), "c": itoa(s.ahead), "q": itoa(s.now + 9_000)}
				},
				marks: func(s *rwLockState) map[string]int64 { return map[string]int64{"": s.now + 9_000} },
			},
			args: func(s *rwLockState) []string { return []string{"A", "30000", "0", "a.1", "", "0", ""} },
			check: func(t *testing.T, s *rwLockState) {
				granted(t, s, "A", "a.1", s.ahead+1)
				if len(s.marks) != 1 || s.num("q") != s.now+9_000 {
					t.Errorf("marks = %v, q = %q; want the mark and q as they were", s.marks, s.fields["q"])
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "rw-lock-class:" + strconv.Itoa(int(serverMicros(t, client)%1e9))
			keys, _, _ := rwScriptKeys(name)
			s := &rwLockState{}
			s.nowUs = serverMicros(t, client)
			s.now = s.nowUs / 1000
			s.ahead = s.nowUs + 1_000_000_000
			do := func(cmd ...string) {
				t.Helper()
				if err := client.Do(ctx, client.B().Arbitrary(cmd[0]).Keys(cmd[1]).Args(cmd[2:]...).Build()).Error(); err != nil {
					t.Fatalf("%v: %v", cmd, err)
				}
			}
			if tc.setup.hash != nil {
				cmd := []string{"HSET", keys[0]}
				for k, v := range tc.setup.hash(s) {
					cmd = append(cmd, k, v)
				}
				do(cmd...)
				ms := tc.setup.hashMs
				if ms == 0 {
					ms = 60_000
				}
				do("PEXPIRE", keys[0], itoa(ms))
			}
			if tc.setup.reads != nil {
				for id, score := range tc.setup.reads(s) {
					do("ZADD", keys[1], itoa(score), id)
				}
			}
			if tc.setup.tomb != "" {
				do("HSET", keys[2], tc.setup.tomb, "1")
			}
			if tc.setup.marks != nil {
				for id, end := range tc.setup.marks(s) {
					do("ZADD", keys[3], itoa(end), id)
				}
				do("PEXPIRE", keys[3], "60000")
			}
			s.reply, s.err = lock.Exec(ctx, keys, tc.args(s)).AsIntSlice()
			s.after = serverMicros(t, client)
			if s.fields, err = client.Do(ctx, client.B().Hgetall().Key(keys[0]).Build()).AsStrMap(); err != nil {
				t.Fatal(err)
			}
			s.marks, s.reads = zscores(t, client, keys[3]), zscores(t, client, keys[1])
			s.pttl = map[string]int64{}
			for suffix, key := range map[string]string{"h": keys[0], "m": keys[3]} {
				if s.pttl[suffix], err = client.Do(ctx, client.B().Pttl().Key(key).Build()).AsInt64(); err != nil {
					t.Fatal(err)
				}
			}
			tc.check(t, s)
		})
	}
}
