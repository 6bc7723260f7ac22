package chaos

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// A hold is one outermost hold of a resource as the API reported it: from
// the return of the acquisition to the call of the release (or, for Do,
// from fn's start to its return). Times come from the process's monotonic
// clock, which orders every event the harness sees.
type hold struct {
	id     int
	kind   string // "mutex", "set" (a MultiMutex member), "write", "read", "permit"
	res    string // the resource: a lock name or a semaphore name
	owner  string // holds of one owner (a Mutex value) never conflict
	node   int
	weight int64    // permits; 1 for locks
	token  int64    // fencing token, 0 where there is none
	note   string   // fair or plain, for reports
	set    []string // a MultiMutex member's: every name of the set, whose losses are the set's

	call, start, end time.Time // acquisition called, returned; release called
	ended            bool

	lost func() bool // reports whether the holder's loss signal is closed

	told    bool   // the holder was told of a loss (signal, Err, release error)
	toldHow string // how, for the report
	// owed: an operator removed this hold behind its back; the holder must
	// be told by the time its hold ends.
	owed    bool
	owedWhy string
}

// event is one line of a holder's story, kept for failure reports.
type event struct {
	at   time.Time
	hold int
	what string
}

// history records holds and checks the exclusion rules as holds start, so
// that a violation is found at the moment it happens (when a holder's loss
// signal can still be read as it was).
type history struct {
	epoch time.Time

	mu        sync.Mutex
	nextID    int
	active    map[string][]*hold // by resource
	done      []*hold
	events    []event
	capacity  map[string]int64 // semaphore capacities
	ops       []opEvent        // operator actions, by resource ("" for all)
	faults    []faultSpan      // network and server faults
	viol      []string
	incidents []incident
	waits     []wait
	partials  []*hold // MultiMutex Locks that may have held a name (liveness)
}

// An opEvent is an operator action: it may take effect on the server at
// any time from at (before it was sent) to end (once it was done; zero
// while in progress). A FLUSHALL of a cluster reaches its masters one after
// another, so holds granted after at may still be removed by it.
type opEvent struct {
	at, end time.Time // the action was sent from at, and done by end (zero: not yet)
	res     string    // "" touches every resource
	what    string
}

// since reports whether o may have taken effect at or after t.
func (o opEvent) since(t time.Time) bool { return o.end.IsZero() || !o.end.Before(t) }

type faultSpan struct {
	from, to time.Time
	what     string
	// res is the resource an operator fault hit ("" for a fault of the
	// network, the server or every resource).
	res string
}

func newHistory() *history {
	return &history{epoch: time.Now(), active: map[string][]*hold{}, capacity: map[string]int64{}}
}

func (h *history) since(t time.Time) string {
	return fmt.Sprintf("%.3fs", t.Sub(h.epoch).Seconds())
}

func (h *history) violation(format string, args ...any) {
	h.mu.Lock()
	h.violationLocked(format, args...)
	h.mu.Unlock()
}

func (h *history) violationLocked(format string, args ...any) {
	msg := fmt.Sprintf("at %s: ", h.since(time.Now())) + fmt.Sprintf(format, args...)
	h.viol = append(h.viol, msg)
}

// operator records an action that removes holds behind their holders'
// backs. It is called before the action is sent and returns a function to
// call once it has been done (not if it failed): every hold of res (every hold, for "")
// in progress all that while is owed a loss signal by the end of the
// hold. A hold that started or ended meanwhile may have come before or
// after the action on the server; begin's incidents cover those.
func (h *history) operator(res, what string) (done func()) {
	h.mu.Lock()
	now := time.Now()
	i := len(h.ops)
	h.ops = append(h.ops, opEvent{at: now, res: res, what: what})
	var before []*hold
	for r, hs := range h.active {
		if res == "" || r == res {
			before = append(before, hs...)
		}
	}
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.ops[i].end = time.Now()
		for _, x := range before {
			if !x.ended {
				x.owed = true
				x.owedWhy = what + " at " + h.since(now)
			}
		}
	}
}

// fault records a fault in force from from to to, hitting res only ("":
// everything).
func (h *history) fault(from, to time.Time, what, res string) {
	h.mu.Lock()
	h.faults = append(h.faults, faultSpan{from, to, what, res})
	h.mu.Unlock()
}

// setLossExplainedLocked is lossExplainedLocked for x's resource, or for
// any name of x's set: a member's loss is the whole set's.
func (h *history) setLossExplainedLocked(x *hold, to time.Time) bool {
	if h.lossExplainedLocked(x.res, x.call, to) {
		return true
	}
	for _, res := range x.set {
		if h.lossExplainedLocked(res, x.call, to) {
			return true
		}
	}
	return false
}

// lossExplainedLocked reports whether a fault that can make res's holds
// lost was in force at some time in [from, to]: one of the network, the
// server or every resource, or an operator's action on res. Called with
// h.mu held.
func (h *history) lossExplainedLocked(res string, from, to time.Time) bool {
	for _, f := range h.faults {
		if (f.res == "" || f.res == res) && !f.from.After(to) && !f.to.Before(from) {
			return true
		}
	}
	return false
}

// faultNear reports whether a fault was in force within slack of [from, to].
func (h *history) faultNear(from, to time.Time, slack time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, f := range h.faults {
		if !f.from.After(to.Add(slack)) && !f.to.Before(from.Add(-slack)) {
			return true
		}
	}
	return false
}

// operatorSinceLocked reports whether an operator action on res (or on
// every resource) may have landed at or after t: it was not done before t.
// Called with h.mu held.
func (h *history) operatorSinceLocked(res string, t time.Time) bool {
	for _, o := range h.ops {
		if (o.res == "" || o.res == res) && o.since(t) {
			return true
		}
	}
	return false
}

// begin records a hold that just started and checks it against the holds
// of its resource still in progress. Conflicting holds at once (two
// writers, a writer and a reader, more permits than the capacity) are
// allowed only where holders were told of a loss, or where an operator
// may have removed holds: those whose acquisition was called before an
// operator action on the resource ("excusable") may have been granted
// before it and removed by it. Such an incident is settled at the end:
// enough of its excusable holds must have been told by the time they
// ended to explain the excess.
func (h *history) begin(x *hold) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nextID++
	x.id = h.nextID
	if x.lost != nil && x.lost() {
		x.told, x.toldHow = true, "loss signal closed at start"
	}
	h.events = append(h.events, event{at: x.start, hold: x.id, what: fmt.Sprintf("%s %s start: %s, node %d owner %s token %d weight %d (called %s)",
		x.kind, x.res, x.note, x.node, x.owner, x.token, x.weight, h.since(x.call))})
	live := h.active[x.res]
	h.active[x.res] = append(live, x)
	if x.told {
		return
	}
	group := []*hold{x} // untold holds that conflict with x, and x
	for _, o := range live {
		if o.owner == x.owner {
			continue
		}
		if !o.told && o.lost != nil && o.lost() {
			o.told, o.toldHow = true, "loss signal closed by "+h.since(x.start)
		}
		if o.told || (x.kind == "read" && o.kind == "read") {
			continue
		}
		group = append(group, o)
	}
	// How much of the group must be gone: permits over the capacity, or
	// all but one exclusive holder.
	var excess int64
	if x.kind == "permit" {
		var w int64
		for _, o := range group {
			w += o.weight
		}
		excess = w - h.capacity[x.res]
	} else {
		excess = int64(len(group) - 1)
	}
	if excess <= 0 {
		return
	}
	var maybe []*hold
	var room int64
	for _, o := range group {
		if o.owed || h.operatorSinceLocked(x.res, o.call) {
			maybe = append(maybe, o)
			room += o.weight
		}
	}
	if room < excess {
		if x.kind == "permit" {
			h.violationLocked("semaphore %s over capacity %d: hold #%d (weight %d) started while holders not told of a loss held %d",
				x.res, h.capacity[x.res], x.id, x.weight, excess+h.capacity[x.res]-x.weight)
		} else {
			h.violationLocked("exclusion: %s hold #%d of %q started while %d conflicting holds not told of a loss held it",
				x.kind, x.id, x.res, len(group)-1)
		}
		h.noteInvolvedLocked(group...)
		return
	}
	h.incidents = append(h.incidents, incident{x: x, maybe: maybe, excess: excess})
}

// An incident is a conflict that an operator's action may explain: at
// least excess weight of maybe must have been told of a loss by the end.
type incident struct {
	x      *hold
	maybe  []*hold
	excess int64
}

// settle checks the incidents once every hold has ended.
func (h *history) settle() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, in := range h.incidents {
		var told int64
		for _, o := range in.maybe {
			if o.told {
				told += o.weight
			}
		}
		if told < in.excess {
			h.violationLocked("lost hold never reported: %s hold #%d of %q started in conflict with holds an operator may have removed, but only %d of the %d weight that must have been removed reported a loss",
				in.x.kind, in.x.id, in.x.res, told, in.excess)
			h.noteInvolvedLocked(append([]*hold{in.x}, in.maybe...)...)
		}
	}
}

// releasing records that x's holder is releasing it (or its Do's fn
// returned): its hold interval ends now, and later holds no longer
// conflict with it.
func (h *history) releasing(x *hold, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if x.ended {
		return
	}
	x.end, x.ended = at, true
	live := h.active[x.res]
	if i := slices.Index(live, x); i >= 0 {
		h.active[x.res] = slices.Delete(live, i, i+1)
	}
}

// tell records that x's holder was told of a loss while it held x. Other
// holders' begin reads told under h.mu, so it is written under it too.
func (h *history) tell(x *hold, how string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !x.told {
		x.told, x.toldHow = true, how
	}
}

// end records what the release of x reported: told says whether it (or
// the holder's state before it) reported a loss, how says how. A hold an
// operator removed must have been told by now.
func (h *history) end(x *hold, told bool, how string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !x.told && told {
		x.told, x.toldHow = true, how
	}
	h.events = append(h.events, event{at: time.Now(), hold: x.id, what: fmt.Sprintf("%s %s end: told=%v %s", x.kind, x.res, x.told, how)})
	if x.told && !x.owed && x.toldHow != "" && !h.setLossExplainedLocked(x, time.Now()) {
		// A loss nothing explains: a false loss is no safety violation,
		// but it is a bug (a batch renewal that failed for another's
		// key, say), and it makes holders give up work for nothing.
		h.violationLocked("loss with no fault to explain it: %s hold #%d of %q (node %d) was told (%s)",
			x.kind, x.id, x.res, x.node, x.toldHow)
		h.noteInvolvedLocked(x)
	}
	if x.owed && !x.told {
		h.violationLocked("lost hold never reported: %s hold #%d of %q (node %d) was removed (%s) and its holder was not told (%s)",
			x.kind, x.id, x.res, x.node, x.owedWhy, how)
		h.noteInvolvedLocked(x)
	}
	h.done = append(h.done, x)
}

// nestedAfterLoss reports a nested Lock that joined a hold already known
// lost: the README promises ErrLost at once, and losses never erased.
func (h *history) nestedAfterLoss(x *hold) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.violationLocked("nested Lock of %s hold #%d of %q returned nil after its loss signal had closed", x.kind, x.id, x.res)
	h.noteInvolvedLocked(x)
}

// noteLastHolds adds to the last violation the last holds of every
// resource named (in braces) in keys.
func (h *history) noteLastHolds(keys string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var xs []*hold
	for _, x := range h.done {
		if strings.Contains(keys, "{"+x.res+"}") {
			xs = append(xs, x)
		}
	}
	slices.SortFunc(xs, func(a, b *hold) int { return a.end.Compare(b.end) })
	h.noteInvolvedLocked(xs[max(0, len(xs)-4):]...)
}

// noteInvolvedLocked adds the last events of the given holds to the
// violations, so that a failure report shows what each holder saw.
func (h *history) noteInvolvedLocked(xs ...*hold) {
	var b strings.Builder
	for _, x := range xs {
		n := 0
		for i := len(h.events) - 1; i >= 0 && n < 6; i-- {
			if h.events[i].hold == x.id {
				fmt.Fprintf(&b, "\n      #%d %s %s", x.id, h.since(h.events[i].at), h.events[i].what)
				n++
			}
		}
	}
	h.viol[len(h.viol)-1] += b.String()
}

// checkTokens checks that fencing tokens grow in the order holds were
// granted: a hold whose acquisition returned before another's was called
// has the smaller token.
func (h *history) checkTokens() {
	h.mu.Lock()
	defer h.mu.Unlock()
	by := map[string][]*hold{}
	for _, x := range h.done {
		if x.token > 0 {
			by[x.res] = append(by[x.res], x)
		}
	}
	for res, hs := range by {
		slices.SortFunc(hs, func(a, b *hold) int { return a.start.Compare(b.start) })
		for i, a := range hs {
			for _, b := range hs[i+1:] {
				if a.owner == b.owner && a.token == b.token {
					continue
				}
				if a.start.Before(b.call) && a.token >= b.token {
					h.violationLocked("fencing token: hold #%d of %q (token %d, granted by %s) and #%d (token %d, called at %s)",
						a.id, res, a.token, h.since(a.start), b.id, b.token, h.since(b.call))
					h.noteInvolvedLocked(a, b)
				}
			}
		}
	}
}

// holdsBy counts the finished holds by kind.
func (h *history) holdsBy() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := map[string]int{}
	for _, x := range h.done {
		n[x.kind]++
	}
	return n
}
