package chaos

import (
	"strings"
	"testing"
	"time"
)

// TestLostAtStart checks the oracle of late grants: a hold whose loss
// signal had closed when the harness began it is a late grant taken as a
// hold, unless the holder's Valid said true right after the acquisition
// returned (the lease ran out in the moment between).
func TestLostAtStart(t *testing.T) {
	tests := []struct {
		name      string
		valid     bool
		violation bool
	}{
		{name: "not valid at the return", valid: false, violation: true},
		{name: "valid at the return", valid: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory(2 * time.Second)
			lost := make(chan struct{})
			close(lost)
			call := time.Now().Add(-time.Second)
			x := &hold{kind: "mutex", res: "le", owner: "n2le0.7", node: 2, weight: 1, note: "plain lane",
				call: call, start: call.Add(111 * time.Millisecond), valid: tt.valid, lostCh: lost, lease: 120 * time.Millisecond}
			h.begin(x)
			x.expect = "left to expire" // as abandonLane says
			h.end(x, true, "left to expire")
			h.settle()
			if (len(h.viol) > 0) != tt.violation || len(h.viol) > 0 && !strings.Contains(h.viol[0], "late grant taken as a hold") {
				t.Errorf("violations %q, want one: %v", h.viol, tt.violation)
			}
		})
	}
}

// TestCapacityAfterWipe checks the capacity the oracle allows after a
// SetCapacity and an operator's wipe of the semaphore's keys (FLUSHALL)
// whose calls overlapped: either may have landed last, so the callers'
// capacity (3) may be in force after both, and a weight of 3 is no
// violation. Seen on soak seeds whose CLIENT PAUSE ended as FLUSHALL was
// sent: a SetCapacity(1) held up by the pause landed before the FLUSHALL
// and returned after it, and the oracle, taking the calls in the order
// they returned, judged the grants after them against 1. A SetCapacity
// sent once the wipe was done surely came last: its capacity is the one in
// force.
func TestCapacityAfterWipe(t *testing.T) {
	tests := []struct {
		name      string
		overlap   bool
		violation bool
	}{
		{name: "set in flight over the wipe", overlap: true},
		{name: "set after the wipe", violation: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory(2 * time.Second)
			h.capacity["lcs"] = 3
			sent := time.Now()
			done := h.operator("", "FLUSHALL")
			if tt.overlap {
				h.setCapacity("lcs", 0, sent, time.Now(), 1, false)
				done()
			} else {
				done()
				at := time.Now()
				h.setCapacity("lcs", 0, at, at.Add(time.Millisecond), 1, false)
			}
			base := time.Now().Add(100 * time.Millisecond)
			o := &hold{kind: "permit", res: "lcs", owner: "o", node: 0, weight: 1, call: base, start: base.Add(time.Millisecond)}
			x := &hold{kind: "permit", res: "lcs", owner: "x", node: 1, weight: 2, call: base.Add(2 * time.Millisecond), start: base.Add(3 * time.Millisecond)}
			for _, y := range []*hold{o, x} {
				h.begin(y)
			}
			for _, y := range []*hold{o, x} {
				h.releasing(y, base.Add(10*time.Millisecond))
				h.end(y, false, "Unlock: <nil>")
			}
			h.settle()
			if (len(h.viol) > 0) != tt.violation || len(h.viol) > 0 && !strings.Contains(h.viol[0], "over capacity 1") {
				t.Errorf("violations %q, want one: %v", h.viol, tt.violation)
			}
		})
	}
}

// TestLaterOperatorExcusesNothing checks that an operator's action sent
// after a permit was granted over the capacity does not excuse it: the
// holds it removed (and whose holders it told) were counted when the
// excess was granted. The end of the run weighs the conflict again with
// every action known, and used to count any action not done before the
// older hold's call, even one sent after the conflict.
func TestLaterOperatorExcusesNothing(t *testing.T) {
	h := newHistory(2 * time.Second)
	h.capacity["lps"] = 3
	now := time.Now()
	o := &hold{kind: "permit", res: "lps", owner: "o", node: 0, weight: 3, call: now.Add(-2 * time.Second), start: now.Add(-1900 * time.Millisecond)}
	x := &hold{kind: "permit", res: "lps", owner: "x", node: 1, weight: 1, call: now.Add(-time.Second), start: now.Add(-900 * time.Millisecond)}
	h.begin(o)
	h.begin(x)
	h.releasing(x, now.Add(-800*time.Millisecond))
	h.end(x, false, "Unlock: <nil>")
	done := h.operator("", "FLUSHALL") // o is still held: it removes o
	done()
	h.tell(o, "loss signal closed")
	h.releasing(o, time.Now())
	h.end(o, true, "Unlock: lost")
	h.settle()
	if len(h.viol) != 1 || !strings.Contains(h.viol[0], "over capacity 3") {
		t.Errorf("violations %q, want one: over capacity 3", h.viol)
	}
}

// TestToldLateInStall checks the bound on how late a holder may hear of a
// loss an operator (here a takeover) caused: a quarter lease past the
// watchdog's reach is a violation, unless the process stalled that long
// meanwhile (its watchdog could not run).
func TestToldLateInStall(t *testing.T) {
	tests := []struct {
		name      string
		stall     time.Duration
		violation bool
	}{
		{name: "no stall", violation: true},
		{name: "a stall of 4.5s", stall: 4500 * time.Millisecond},
		{name: "a stall of 1s", stall: time.Second, violation: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory(2 * time.Second)
			t0 := time.Now().Add(-10 * time.Second)
			x := &hold{kind: "mutex", res: "lt", owner: "T1", node: 1, weight: 1, call: t0, start: t0.Add(7 * time.Millisecond)}
			h.begin(x)
			h.mu.Lock()
			x.owed, x.owedWhy, x.owedAt = true, "taken over", t0.Add(500*time.Millisecond)
			if tt.stall > 0 {
				h.stalls = append(h.stalls, stall{at: x.owedAt.Add(100*time.Millisecond + tt.stall), d: tt.stall})
			}
			x.tellLocked("Unlock after the takeover", x.owedAt.Add(4634*time.Millisecond))
			h.mu.Unlock()
			h.releasing(x, x.toldAt)
			h.end(x, true, "Unlock after the takeover")
			if (len(h.viol) > 0) != tt.violation || len(h.viol) > 0 && !strings.Contains(h.viol[0], "lost hold reported late") {
				t.Errorf("violations %q, want one: %v", h.viol, tt.violation)
			}
		})
	}
}

// TestConflictBegunOutOfOrder checks the window of capacities a group of
// permits is judged against when its holds were begun out of the order
// their acquisitions returned (a holder stalled between the return and
// begin): the group's last grant may be that of a hold that returned
// after the one begun last, so a capacity raised by then counts.
func TestConflictBegunOutOfOrder(t *testing.T) {
	tests := []struct {
		name      string
		raise     bool
		violation bool
	}{
		{name: "raised before the later return", raise: true},
		{name: "not raised", violation: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory(2 * time.Second)
			h.capacity["lcs"] = 3
			t0 := time.Now().Add(-10 * time.Second)
			h.setCapacity("lcs", 1, t0, t0.Add(20*time.Millisecond), 3, false)
			if tt.raise {
				h.setCapacity("lcs", 0, t0.Add(1170*time.Millisecond), t0.Add(1175*time.Millisecond), 5, false)
			}
			// a returned first (1.006 s), b later (1.186 s, after the
			// raise), but b was begun first.
			a := &hold{kind: "permit", res: "lcs", owner: "a", node: 0, weight: 2, call: t0.Add(time.Second), start: t0.Add(1006 * time.Millisecond)}
			b := &hold{kind: "permit", res: "lcs", owner: "b", node: 1, weight: 3, call: t0.Add(700 * time.Millisecond), start: t0.Add(1186 * time.Millisecond)}
			h.begin(b)
			h.begin(a)
			for _, y := range []*hold{b, a} {
				h.releasing(y, t0.Add(1300*time.Millisecond))
				h.end(y, false, "Unlock: <nil>")
			}
			h.settle()
			if (len(h.viol) > 0) != tt.violation || len(h.viol) > 0 && !strings.Contains(h.viol[0], "over capacity 3") {
				t.Errorf("violations %q, want one: %v", h.viol, tt.violation)
			}
		})
	}
}

// TestLossWithNoFaultInStall checks that a loss no fault explains is a
// violation unless the process stalled for a quarter lease or more in the
// lease before it was told (a process paused past its lease is promised
// nothing), and only stalls in that lease count.
func TestLossWithNoFaultInStall(t *testing.T) {
	tests := []struct {
		name      string
		stall     time.Duration
		before    time.Duration // how long before the tell the stall ended
		violation bool
	}{
		{name: "no stall", violation: true},
		{name: "a stall of 400ms", stall: 400 * time.Millisecond, before: 100 * time.Millisecond, violation: true},
		{name: "a stall of 600ms", stall: 600 * time.Millisecond, before: 100 * time.Millisecond},
		{name: "a stall of 600ms a lease earlier", stall: 600 * time.Millisecond, before: 3 * time.Second, violation: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory(2 * time.Second)
			t0 := time.Now().Add(-10 * time.Second)
			x := &hold{kind: "permit", res: "lps", owner: "P1", node: 1, weight: 1, call: t0, start: t0.Add(7 * time.Millisecond)}
			h.begin(x)
			h.mu.Lock()
			told := t0.Add(5 * time.Second)
			if tt.stall > 0 {
				h.stalls = append(h.stalls, stall{at: told.Add(-tt.before), d: tt.stall})
			}
			x.tellLocked("loss signal closed", told)
			h.mu.Unlock()
			h.releasing(x, told)
			h.end(x, true, "Err set before Unlock")
			if (len(h.viol) > 0) != tt.violation || len(h.viol) > 0 && !strings.Contains(h.viol[0], "loss with no fault") {
				t.Errorf("violations %q, want one: %v", h.viol, tt.violation)
			}
		})
	}
}

// TestValidityExcusedOnlyByEarlierOperator checks checkValidity's excuse:
// a lock whose Valid said true after a conflicting grant is excused by an
// operator action only if the action may have landed before that grant:
// one sent before the lock's own grant returned may have removed it just
// after. An action sent after the grant (here a ForceUnlock once both
// holds ended) removed nothing the grant was counted against, so the
// conflict is a violation (before, any later action excused it).
func TestValidityExcusedOnlyByEarlierOperator(t *testing.T) {
	tests := []struct {
		name string
		// early: the action is sent while the lock's acquisition is in
		// flight (true), or once both holds ended (false).
		early     bool
		violation bool
	}{
		{name: "action in flight with the grant", early: true},
		{name: "action after both holds", violation: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory(2 * time.Second)
			w := &world{cfg: Config{Lease: 2 * time.Second}, hist: h, ln: &laneState{}}
			// The holds' times are set around the actions' (taken from
			// the clock): the grant just after the early one, the late
			// one after both holds.
			base := time.Now().Add(-500 * time.Millisecond)
			x := &hold{kind: "mutex", res: "lv", owner: "x", node: 0, weight: 1, call: base.Add(-time.Second)}
			if tt.early {
				h.operator("lv", "ForceUnlock")()
				base = time.Now()
			}
			x.start = base.Add(time.Millisecond)
			h.begin(x)
			o := &hold{kind: "mutex", res: "lv", owner: "o", node: 1, weight: 1, call: x.start.Add(time.Millisecond), start: x.start.Add(2 * time.Millisecond)}
			h.begin(o)
			w.ln.valids = append(w.ln.valids, validity{[]*hold{x}, o.start.Add(time.Millisecond)})
			for _, y := range []*hold{x, o} {
				h.releasing(y, o.start.Add(2*time.Millisecond))
				h.end(y, false, "Unlock: <nil>")
			}
			if !tt.early {
				h.operator("lv", "ForceUnlock")()
			}
			w.checkValidity()
			var got []string
			for _, v := range h.viol {
				if strings.Contains(v, ": Valid: ") {
					got = append(got, v)
				}
			}
			if (len(got) > 0) != tt.violation {
				t.Errorf("Valid violations %q, want one: %v", got, tt.violation)
			}
		})
	}
}

// TestPastFixedLease checks when a release that found a fixed-lease hold
// gone is the lease's own doing: only if it returned at or after the
// earliest time the server could end the lease (its call's send plus the
// lease). Before that, "not held" is a loss to explain; a watchdog's hold
// (no fixed lease known) is never excused this way.
func TestPastFixedLease(t *testing.T) {
	call := time.Now()
	fixed := &hold{lease: 250 * time.Millisecond, leaseEarliestEnd: call.Add(250 * time.Millisecond)}
	watchdog := &hold{}
	tests := []struct {
		name string
		x    *hold
		ret  time.Time
		want bool
	}{
		{"fixed, returned before the lease could end", fixed, call.Add(249 * time.Millisecond), false},
		{"fixed, returned as it could end", fixed, call.Add(250 * time.Millisecond), true},
		{"fixed, returned after", fixed, call.Add(360 * time.Millisecond), true},
		{"watchdog", watchdog, call.Add(time.Hour), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.x.pastFixedLease(tt.ret); got != tt.want {
				t.Errorf("pastFixedLease = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestForcedWriterBesideLaterReaders checks how a conflict of a write hold
// with readers is settled when an operator's ForceUnlock may explain it:
// by which holds it leaves untold, not how many. Soak seed ...788: a
// writer's Lock was granted, an operator force-unlocked the lock, readers
// were let in, and only then did the writer's reply arrive through a slow
// link; the writer was told at its Unlock and the readers, rightly, never.
// Readers left together are no conflict; a writer left beside a reader,
// or two writers, are.
func TestForcedWriterBesideLaterReaders(t *testing.T) {
	tests := []struct {
		name      string
		otherKind string // the third hold of the group: "read" or "write"
		toldX     bool   // the writer x was told of a loss
		toldR     bool   // the first reader was told of a loss
		violation bool
	}{
		{name: "writer told, readers left", otherKind: "read", toldX: true},
		{name: "nobody told", otherKind: "read", violation: true},
		{name: "one reader told, the writer left beside the other", otherKind: "read", toldR: true, violation: true},
		{name: "writer told, a reader left beside another writer", otherKind: "write", toldX: true, violation: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory(2 * time.Second)
			t0 := time.Now().Add(-10 * time.Second)
			// The writer and the first reader are called before the
			// ForceUnlock; the second hold after it, then begun before x.
			x := &hold{kind: "write", res: "rwf", owner: "n1", node: 1, weight: 1, call: t0}
			r := &hold{kind: "read", res: "rwf", owner: "n0", node: 0, weight: 1, call: t0.Add(-100 * time.Millisecond)}
			h.mu.Lock()
			h.ops = append(h.ops, opEvent{at: t0.Add(500 * time.Millisecond), end: t0.Add(501 * time.Millisecond), res: "rwf", what: "ForceUnlock"})
			h.mu.Unlock()
			o := &hold{kind: tt.otherKind, res: "rwf", owner: "n2", node: 2, weight: 1, call: t0.Add(600 * time.Millisecond), start: t0.Add(650 * time.Millisecond)}
			r.start = t0.Add(690 * time.Millisecond)
			x.start = t0.Add(870 * time.Millisecond)
			h.begin(o)
			h.begin(r)
			h.begin(x)
			end := func(y *hold, told bool, at time.Time) {
				h.releasing(y, at)
				if told {
					h.end(y, true, "Unlock: not held")
				} else {
					h.end(y, false, "Unlock: <nil>")
				}
			}
			end(o, false, t0.Add(880*time.Millisecond))
			end(r, tt.toldR, t0.Add(890*time.Millisecond))
			end(x, tt.toldX, t0.Add(1500*time.Millisecond))
			h.settle()
			var got []string
			for _, v := range h.viol {
				if strings.Contains(v, "lost hold never reported") || strings.Contains(v, "exclusion") {
					got = append(got, v)
				}
			}
			if (len(got) > 0) != tt.violation {
				t.Errorf("violations %q, want one: %v", h.viol, tt.violation)
			}
		})
	}
}

// TestConflictToldAtStartBesideOperator checks a conflict that both an
// operator's action and a lease running out could explain: a hold whose
// holder was told of its loss about when the next hold began (its lease
// ended on the server, and the next Lock took the lock) is gone by then,
// whether or not an earlier FLUSHALL may have removed the newer hold too.
// Soak seed ...858 (cluster): a FLUSHALL came during x's Lock; o, a hold
// of 149 ms taken after it, ran out, x was granted, and o's holder was
// told 15 ms after x began. Told 300 ms after, with no stall, it is a
// conflict that no operator explains.
func TestConflictToldAtStartBesideOperator(t *testing.T) {
	tests := []struct {
		name      string
		toldAfter time.Duration // o told this long after x began
		violation bool
	}{
		{name: "told as x began", toldAfter: 15 * time.Millisecond},
		{name: "told long after", toldAfter: 300 * time.Millisecond, violation: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory(2 * time.Second)
			t0 := time.Now().Add(-10 * time.Second)
			x := &hold{kind: "mutex", res: "lm", owner: "n1lm0.14", node: 1, weight: 1, call: t0, lease: 1280 * time.Millisecond}
			h.mu.Lock()
			h.ops = append(h.ops, opEvent{at: t0.Add(1200 * time.Millisecond), end: t0.Add(1210 * time.Millisecond), what: "FLUSHALL"})
			h.mu.Unlock()
			o := &hold{kind: "mutex", res: "lm", owner: "n2lm1.14", node: 2, weight: 1, call: t0.Add(1317 * time.Millisecond),
				start: t0.Add(1346 * time.Millisecond), lease: 149 * time.Millisecond}
			x.start = t0.Add(1503 * time.Millisecond)
			h.begin(o)
			h.begin(x)
			h.tell(o, "left to expire")
			h.mu.Lock()
			o.toldAt = x.start.Add(tt.toldAfter)
			h.mu.Unlock()
			h.releasing(o, o.toldAt)
			h.end(o, true, "left to expire: lease expired")
			h.releasing(x, x.start.Add(400*time.Millisecond))
			h.end(x, false, "Unlock: <nil>")
			h.settle()
			var got []string
			for _, v := range h.viol {
				if strings.Contains(v, "lost hold never reported") || strings.Contains(v, "exclusion") {
					got = append(got, v)
				}
			}
			if (len(got) > 0) != tt.violation {
				t.Errorf("violations %q, want one: %v", h.viol, tt.violation)
			}
		})
	}
}
