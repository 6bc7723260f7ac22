package mutex

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"

	"github.com/google/uuid"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/scriptcache"
)

// MaxMultiNames is the most names one MultiMutex may lock.
const MaxMultiNames = 64

// NewMultiMutex returns a MultiMutex that locks all the given names
// together. The names must be distinct and valid lock names; there must be
// 1 to MaxMultiNames of them. The options apply to every member; without
// WithOwner the members share one random owner id. It does not talk to
// Redis.
func (l *Locker) NewMultiMutex(names []string, opts ...LockOption) (*MultiMutex, error) {
	if len(names) == 0 || len(names) > MaxMultiNames {
		return nil, fmt.Errorf("%w: a multi-lock needs 1 to %d names, got %d", ErrInvalidOptions, MaxMultiNames, len(names))
	}
	type member struct {
		name string
		slot uint16
	}
	ms := make([]member, len(names))
	seen := make(map[string]bool, len(names))
	for i, name := range names {
		if err := keyspace.CheckName(name); err != nil {
			return nil, fmt.Errorf("%w: name %d of the set: %w", ErrInvalidName, i, err)
		}
		if seen[name] {
			return nil, fmt.Errorf("%w: %q appears twice in the set", ErrInvalidName, name)
		}
		seen[name] = true
		ms[i] = member{name, keyspace.Slot(keyspace.Key(l.opts.Prefix, name, ""))}
	}
	// The canonical order every process uses: see MultiMutex.
	slices.SortFunc(ms, func(a, b member) int {
		return cmp.Or(cmp.Compare(a.slot, b.slot), cmp.Compare(a.name, b.name))
	})
	opts = append([]LockOption{WithOwner(uuid.NewString())}, opts...)
	mm := &MultiMutex{op: make(chan struct{}, 1)}
	for _, m := range ms {
		mu, err := l.NewMutex(m.name, opts...)
		if err != nil {
			return nil, err
		}
		mu.own().prim = scriptcache.PrimitiveMultiMutex // its events name each member
		mm.ms = append(mm.ms, mu)
	}
	return mm, nil
}

// MultiMutex locks several names all or nothing: Lock returns nil only
// when every name is held, and otherwise holds none of them. Its members
// are ordinary locks: a Mutex of one of the names excludes, and is
// excluded by, a MultiMutex that includes it.
//
// # Ordering and atomicity
//
// Lock takes the names one at a time in a canonical order, by cluster hash
// slot and then by name, the same in every process; it waits on each name
// as Mutex.Lock does while holding the ones before it. Two processes
// locking overlapping sets, whatever order they listed the names in, thus
// always contend first for the earliest name they share, and the one that
// gets it can take the rest: no cycle of waits, no deadlock. (A process
// that also holds some of the names through other Mutexes, or other
// MultiMutexes it has not released, can still deadlock, as with any
// locks.) If ctx ends or an attempt fails part way, Lock releases what it
// took, in reverse order, before returning.
//
// The set is not taken in one atomic step: no script could see keys in
// several cluster slots, so the same one-name-at-a-time scheme is used on a
// single server too. Others may meanwhile see some of the names held by a
// MultiMutex whose Lock has not returned (and may yet give them back), but
// never can two holders of overlapping sets both be inside: each name is an
// ordinary lock. Each name costs a round trip.
//
// # Holds
//
// Lock on a MultiMutex that holds nests in every member, so the members
// always count as many holds as the set; Unlock gives one back from each.
// The set's Lock, TryLock and Unlock run one at a time: a Lock of a set
// that holds nothing, waiting for a name, holds up the set's other Locks
// (a TryLock fails at once instead).
//
// # Loss
//
// Lost's channel closes as soon as any member's hold is lost; from then on
// the set no longer excludes anyone on that name, and the set is lost as a
// whole, however many holds it had: Holds is 0, Err says why, and Lock and
// TryLock return that loss (wrapping ErrLost) without touching Redis. The
// next Unlock gives back everything the members still hold, the lost
// member's leftovers included, and returns an error wrapping ErrNotHeld
// and the loss; after it the set can be locked afresh. Until that Unlock
// the other members stay held (and renewed), as their names are still
// locked by this set.
//
// Its methods are safe for concurrent use.
type MultiMutex struct {
	ms []*Mutex // in the canonical order

	// op is held by one Lock, TryLock or Unlock at a time (a channel, so
	// that waiting for it can end with ctx), so that the members' hold
	// counts move together.
	op chan struct{}

	mu    sync.Mutex // guards the fields below; never held across a call
	holds int64      // the set's holds; each member has as many unless lost, or an Unlock failed part way
	// lost are the members' Lost channels of the current set hold, taken
	// when it was acquired; nil when the set holds nothing.
	lost  []<-chan struct{}
	err   error      // why the current (or last) set hold was lost
	watch *lossWatch // merges lost for Lost; nil if nobody asked
}

// lossWatch is one goroutine waiting for the first of several Lost
// channels to close.
type lossWatch struct {
	in   []<-chan struct{}
	out  chan struct{} // closed when one of in closes
	stop chan struct{} // closed to end the goroutine early
	done chan struct{} // closed when the goroutine has ended
}

func newLossWatch(in []<-chan struct{}) *lossWatch {
	w := &lossWatch{in: in, out: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	cases := make([]reflect.SelectCase, 0, len(in)+1)
	for _, c := range in {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)})
	}
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.stop)})
	go func() {
		defer close(w.done)
		if i, _, _ := reflect.Select(cases); i < len(in) {
			close(w.out)
		}
	}()
	return w
}

// end stops the goroutine if it still runs and waits for it.
func (w *lossWatch) end() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// Names returns the names in the order they are locked.
func (mm *MultiMutex) Names() []string {
	out := make([]string, len(mm.ms))
	for i, m := range mm.ms {
		out[i] = m.Name()
	}
	return out
}

// Owner returns the owner id of the members.
func (mm *MultiMutex) Owner() string { return mm.ms[0].Owner() }

// Lock acquires every name of the set, waiting as long as ctx allows. On
// failure it holds none of the names it took and returns the error of the
// member that failed (wrapping ErrNotObtained and ctx.Err() if ctx ended).
// What it took is given back even if ctx has ended, with calls that stop
// after a lease (by then Redis has let it expire). If a member taken early
// is lost before the last one is taken, Lock gives the set back and
// returns an error wrapping ErrNotObtained and the loss.
// On a set that holds, Lock nests in every member, never waiting; if the
// set's hold is lost it returns the loss (wrapping ErrLost) and takes
// nothing.
func (mm *MultiMutex) Lock(ctx context.Context) error {
	return mm.acquire(ctx, (*Mutex).Lock, false)
}

// TryLock makes one attempt at each name in order and returns an error
// wrapping ErrNotObtained, holding none of them, at the first that is held
// by another owner, or while another Lock of this set is taking it. On a
// set that holds, it nests as Lock does.
func (mm *MultiMutex) TryLock(ctx context.Context) error {
	return mm.acquire(ctx, (*Mutex).TryLock, true)
}

func (mm *MultiMutex) acquire(ctx context.Context, lock func(*Mutex, context.Context) error, try bool) error {
	if !mm.tryEnter() {
		mm.mu.Lock()
		h := mm.holds
		mm.mu.Unlock()
		if try && h == 0 {
			// Another Lock of this set is under way, maybe waiting for a
			// name: a TryLock does not wait for it. (With the set held,
			// the Lock only nests, and a TryLock nests after it.)
			return fmt.Errorf("%w: %s %w", ErrNotObtained, mm.label(), errHeld)
		}
		if err := mm.enter(ctx); err != nil {
			return notObtained(mm.label(), err)
		}
	}
	defer mm.leave()
	mm.mu.Lock()
	h := mm.holds
	mm.mu.Unlock()
	if h > 0 {
		return mm.nest(ctx, h)
	}
	for i, m := range mm.ms {
		if err := lock(m, ctx); err != nil {
			mm.unwind(ctx, mm.ms[:i])
			return err
		}
	}
	lost := make([]<-chan struct{}, len(mm.ms))
	for i, m := range mm.ms {
		lost[i] = m.Lost()
		select {
		case <-lost[i]:
			err := lossBy(lost[i], m.Err, m.Name())
			mm.unwind(ctx, mm.ms)
			return fmt.Errorf("%w: %w", ErrNotObtained, inner(err))
		default:
		}
	}
	mm.mu.Lock()
	w := mm.watch
	mm.holds, mm.lost, mm.err, mm.watch = 1, lost, nil, nil
	mm.mu.Unlock()
	if w != nil {
		w.end()
	}
	return nil
}

// nest adds one hold to a set that has h. A nested Lock joins only a live
// hold: if a member is lost, the set is, and nest returns the loss without
// a call. Each member nests with one attempt (TryLock), which Redis refuses
// if that member's acquisition is gone; nothing is left added on failure.
// Called with op held.
func (mm *MultiMutex) nest(ctx context.Context, h int64) error {
	if err := mm.joinable(h); err != nil {
		return err
	}
	for _, m := range mm.ms {
		if err := m.TryLock(ctx); err != nil {
			mm.settle(ctx, h)
			if lerr := mm.Err(); lerr != nil {
				return lerr
			}
			return err
		}
	}
	if err := mm.joinable(h + 1); err != nil {
		// A member was lost meanwhile (after its nested attempt, or
		// before it, which then started a new hold).
		mm.settle(ctx, h)
		return err
	}
	mm.mu.Lock()
	mm.holds = h + 1
	mm.mu.Unlock()
	return nil
}

// joinable returns nil if every member of the set has its hold of the
// set's current acquisition, h holds each; else the set's loss (wrapping
// ErrLost), or an error wrapping ErrNotObtained if an Unlock failed part
// way and must be called again first.
func (mm *MultiMutex) joinable(h int64) error {
	if err := mm.Err(); err != nil {
		return err
	}
	for _, m := range mm.ms {
		if m.Holds() != h {
			return fmt.Errorf("%w: %s: an Unlock failed part way; call Unlock again", ErrNotObtained, mm.label())
		}
	}
	return nil
}

// settle brings the members back to h holds each after a nested Lock that
// failed, or to none for a member whose hold of the set's acquisition was
// lost (one a nested attempt started afresh). A member whose Unlock fails
// must not stay counted beyond what the set says: its hold is dropped as
// unwind does. Called with op held.
func (mm *MultiMutex) settle(ctx context.Context, h int64) {
	ctx, cancel := mm.giveBackContext(ctx)
	defer cancel()
	mm.mu.Lock()
	lost := mm.lost
	mm.mu.Unlock()
	for i := len(mm.ms) - 1; i >= 0; i-- {
		m, want := mm.ms[i], h
		if isClosed(lost[i]) {
			want = 0
		}
		for m.Holds() > want {
			if err := m.Unlock(ctx); err != nil {
				if !errors.Is(err, ErrNotHeld) {
					m.dropHold(err)
				}
				break
			}
		}
	}
}

// unwind gives back one hold of each of taken, in reverse order, even if
// ctx has ended. A member whose Unlock fails (the connection, not
// ErrNotHeld) must not stay counted and renewed after Lock reported
// failure: its hold is dropped here, and the server's lease ends what
// Redis still keeps of it.
func (mm *MultiMutex) unwind(ctx context.Context, taken []*Mutex) {
	ctx, cancel := mm.giveBackContext(ctx)
	defer cancel()
	for i := len(taken) - 1; i >= 0; i-- {
		if err := taken[i].Unlock(ctx); err != nil && !errors.Is(err, ErrNotHeld) {
			taken[i].dropHold(err)
		}
	}
}

// giveBackContext is ctx for settle's and unwind's Unlocks: not ended by
// ctx's end (the holds must go back even when the caller gave up), and
// ended a lease on. By then Redis has let what they give back expire, and
// a call with no end could wait for ever: a release met by TRYAGAIN is
// sent again for as long as its context lasts, and a slot left half
// migrated answers it so without end.
func (mm *MultiMutex) giveBackContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), mm.ms[0].set.lease)
}

// tryEnter takes op if it is free, and reports whether it did.
func (mm *MultiMutex) tryEnter() bool {
	select {
	case mm.op <- struct{}{}:
		return true
	default:
		return false
	}
}

// enter takes op, unless ctx ends first.
func (mm *MultiMutex) enter(ctx context.Context) error {
	if mm.tryEnter() {
		return nil
	}
	select {
	case mm.op <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (mm *MultiMutex) leave() { <-mm.op }

// label names the set in errors.
func (mm *MultiMutex) label() string { return fmt.Sprintf("set %q", mm.Names()) }

// isClosed reports whether c is closed; a nil c is not.
func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return c != nil
	default:
		return false
	}
}

// Unlock gives back one hold of every member, in reverse order. It returns
// the members' errors joined; if the set holds nothing it returns an error
// wrapping ErrNotHeld (and the loss, after one). After a loss (see
// MultiMutex) it gives back everything the members still hold, the lost
// member's leftovers included, and returns an error wrapping ErrNotHeld and
// the loss. Members whose Unlock failed otherwise (the connection) stay
// counted, and calling Unlock again releases them, and only them.
func (mm *MultiMutex) Unlock(ctx context.Context) error {
	return errors.Join(mm.unlock(ctx)...)
}

// unlock is Unlock; it returns the errors one by one.
func (mm *MultiMutex) unlock(ctx context.Context) []error {
	mm.mu.Lock()
	h := mm.holds
	mm.mu.Unlock()
	if h == 0 {
		return []error{mm.notHeld()}
	}
	if err := mm.enter(ctx); err != nil {
		return []error{fmt.Errorf("mutex: unlock %s: %w", mm.label(), inner(err))}
	}
	defer mm.leave()
	mm.mu.Lock()
	h, lost := mm.holds, mm.lost
	mm.mu.Unlock()
	if h == 0 {
		return []error{mm.notHeld()}
	}
	wasLost := mm.Err()
	target := h - 1
	if wasLost != nil {
		target = 0 // give back everything
	}
	var errs []error
	for i := len(mm.ms) - 1; i >= 0; i-- {
		m := mm.ms[i]
		if isClosed(lost[i]) {
			// Lost: the member's Unlock gives back what Redis may still
			// keep of its hold, and reports the loss.
			if err := m.Unlock(ctx); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		for m.Holds() > target {
			if err := m.Unlock(ctx); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	if wasLost != nil && !errors.Is(errors.Join(errs...), ErrLost) {
		errs = append(errs, fmt.Errorf("%w: %w", ErrNotHeld, inner(wasLost)))
	}
	// The set is down to target once every member is (a member lost has
	// nothing left): else an Unlock failed, and the next one goes on.
	for i, m := range mm.ms {
		if !isClosed(lost[i]) && m.Holds() > target {
			return errs
		}
	}
	mm.mu.Lock()
	mm.holds = target
	var w *lossWatch
	if target == 0 {
		mm.lost, w, mm.watch = nil, mm.watch, nil
	}
	mm.mu.Unlock()
	if w != nil {
		w.end()
	}
	return errs
}

// notHeld is Unlock's error when the set holds nothing.
func (mm *MultiMutex) notHeld() error {
	if err := mm.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotHeld, inner(err))
	}
	return fmt.Errorf("%w: %s", ErrNotHeld, mm.label())
}

// Lost returns a channel that is closed when the hold of any member is
// lost. If the set is not held it returns a closed channel. The first call
// for a hold starts a goroutine that waits for the members' Lost channels;
// it ends at the loss, at the Unlock that frees the set, or when the Locker
// is closed.
func (mm *MultiMutex) Lost() <-chan struct{} {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	if mm.holds == 0 || mm.lossLocked() != nil {
		return closedChan
	}
	if mm.watch == nil {
		mm.watch = newLossWatch(mm.lost)
	}
	return mm.watch.out
}

// Err returns why the set's current or last hold was lost (wrapping
// ErrLost: the first member lost, in lock order, and why), or nil.
func (mm *MultiMutex) Err() error {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	return mm.lossLocked()
}

// lossLocked is Err; it keeps the first loss it finds, so that it outlives
// the member's next hold. Called with mm.mu held.
func (mm *MultiMutex) lossLocked() error {
	if mm.err == nil {
		for i, c := range mm.lost {
			if isClosed(c) {
				mm.err = lossBy(c, mm.ms[i].Err, mm.ms[i].Name())
				break
			}
		}
	}
	return mm.err
}

// Tokens returns the fencing tokens of the members' current holds, in the
// order of Names (0 for a member not held).
func (mm *MultiMutex) Tokens() []int64 {
	out := make([]int64, len(mm.ms))
	for i, m := range mm.ms {
		out[i] = m.Token()
	}
	return out
}

// Holds returns how many holds the set has: 0 if it holds nothing or its
// hold was lost.
func (mm *MultiMutex) Holds() int64 {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	if mm.lossLocked() != nil {
		return 0
	}
	return mm.holds
}
