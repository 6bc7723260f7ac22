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
func (l *Locker) NewMultiMutex(names []string, opts ...MutexOption) (*MultiMutex, error) {
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
	opts = append([]MutexOption{WithOwner(uuid.NewString())}, opts...)
	mm := &MultiMutex{}
	for _, m := range ms {
		mu, err := l.NewMutex(m.name, opts...)
		if err != nil {
			return nil, err
		}
		mu.prim = scriptcache.PrimitiveMultiMutex // its events name each member
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
// # Loss
//
// Lost's channel closes as soon as any member's hold is lost; from then on
// the set no longer excludes anyone on that name. Unlock still releases the
// members that remain.
//
// Its methods are safe for concurrent use; Lock on a MultiMutex that holds
// nests in every member.
type MultiMutex struct {
	ms []*Mutex // in the canonical order

	mu    sync.Mutex // guards watch
	watch *lossWatch // merges the members' Lost channels; nil if none
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
// If a member taken early is lost before the last one is taken, Lock gives
// the set back and returns an error wrapping ErrNotObtained and the loss.
func (mm *MultiMutex) Lock(ctx context.Context) error {
	return mm.acquire(ctx, (*Mutex).Lock)
}

// TryLock makes one attempt at each name in order and returns an error
// wrapping ErrNotObtained, holding none of them, at the first that is held
// by another owner.
func (mm *MultiMutex) TryLock(ctx context.Context) error {
	return mm.acquire(ctx, (*Mutex).TryLock)
}

func (mm *MultiMutex) acquire(ctx context.Context, lock func(*Mutex, context.Context) error) error {
	for i, m := range mm.ms {
		if err := lock(m, ctx); err != nil {
			mm.unwind(ctx, mm.ms[:i])
			return err
		}
	}
	for _, m := range mm.ms {
		select {
		case <-m.Lost():
			err := m.Err()
			mm.unwind(ctx, mm.ms)
			if err == nil {
				err = fmt.Errorf("%w: %q", ErrLost, m.Name())
			}
			return fmt.Errorf("%w: %w", ErrNotObtained, err)
		default:
		}
	}
	return nil
}

// unwind gives back one hold of each of taken, in reverse order, even if
// ctx has ended. A member whose Unlock fails (the connection, not
// ErrNotHeld) must not stay counted and renewed after Lock reported
// failure: its hold is dropped here, and the server's lease ends what
// Redis still keeps of it.
func (mm *MultiMutex) unwind(ctx context.Context, taken []*Mutex) {
	ctx = context.WithoutCancel(ctx)
	for i := len(taken) - 1; i >= 0; i-- {
		if err := taken[i].Unlock(ctx); err != nil && !errors.Is(err, ErrNotHeld) {
			taken[i].dropHold(err)
		}
	}
	mm.stopWatchIfFree()
}

// Unlock gives back one hold of every member, in reverse order. It returns
// the members' errors joined: one wrapping ErrNotHeld for each member not
// held (after a loss it also wraps the loss, as Mutex.Unlock does).
// Members whose Unlock failed otherwise stay counted, and calling Unlock
// again releases them; members already released then report ErrNotHeld.
func (mm *MultiMutex) Unlock(ctx context.Context) error {
	var errs []error
	for i := len(mm.ms) - 1; i >= 0; i-- {
		if err := mm.ms[i].Unlock(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	mm.stopWatchIfFree()
	return errors.Join(errs...)
}

// stopWatchIfFree ends the loss watcher once no member holds anything.
// It checks under mm.mu, as Lost collects the members' channels, so a Lost
// racing with the Unlock either sees the members released or leaves a
// watcher that this call ends.
func (mm *MultiMutex) stopWatchIfFree() {
	mm.mu.Lock()
	for _, m := range mm.ms {
		if m.Holds() > 0 {
			mm.mu.Unlock()
			return
		}
	}
	w := mm.watch
	mm.watch = nil
	mm.mu.Unlock()
	if w != nil {
		w.end()
	}
}

// Lost returns a channel that is closed when the hold of any member is
// lost. If the set is not held (some member holds nothing) it returns a
// closed channel. The first call for a hold starts a goroutine that waits
// for the members' Lost channels; it ends at the loss, at the Unlock that
// frees the set, or when the Locker is closed.
func (mm *MultiMutex) Lost() <-chan struct{} {
	mm.mu.Lock()
	defer mm.mu.Unlock()
	in := make([]<-chan struct{}, len(mm.ms))
	for i, m := range mm.ms {
		in[i] = m.Lost()
		select {
		case <-in[i]:
			return closedChan
		default:
		}
	}
	if w := mm.watch; w != nil {
		if slices.Equal(w.in, in) {
			return w.out
		}
		// A watcher of an earlier hold: end it (its goroutine exits at
		// once, its channels having closed or being stopped now).
		w.end()
	}
	mm.watch = newLossWatch(in)
	return mm.watch.out
}

// Err returns why a member's last hold was lost (wrapping ErrLost), or
// nil; with several, the first in lock order.
func (mm *MultiMutex) Err() error {
	for _, m := range mm.ms {
		if err := m.Err(); err != nil {
			return err
		}
	}
	return nil
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

// Holds returns how many holds the set has: the fewest of any member.
func (mm *MultiMutex) Holds() int64 {
	n := mm.ms[0].Holds()
	for _, m := range mm.ms[1:] {
		n = min(n, m.Holds())
	}
	return n
}
