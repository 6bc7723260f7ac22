package semaphore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Available returns how many permits are free now (0 while a lowered
// capacity is still exceeded). It reclaims expired permits on the way, so
// their capacity counts as free.
func (s *Semaphore) Available(ctx context.Context) (int64, error) {
	for range 64 {
		r, err := s.call(ctx, "", 0, tryOnce)
		if err != nil {
			if errors.Is(err, ErrCapacityMismatch) {
				return 0, err
			}
			return 0, fmt.Errorf("semaphore: available %q: %w", s.name, inner(err))
		}
		if r.wait != 0 || r.used == 0 {
			return max(r.capacity-r.used, 0), nil
		}
		// More than one batch of expired permits: reclaim the next.
	}
	return 0, fmt.Errorf("semaphore: available %q: too many expired permits to reclaim", s.name)
}

// SetCapacity changes the semaphore's capacity in Redis, for every process
// and whatever capacity their Semaphores were made with, while permits are
// held and for CapacityRetention after the last use (see "Capacity" in the
// package doc). Shrinking never revokes held permits: nothing is granted
// until the weight held is below the new capacity. Growing grants the new
// permits at once to fair waiters and wakes waiting Acquires. n must be in
// [1, MaxCapacity] (ErrInvalidCapacity).
func (s *Semaphore) SetCapacity(ctx context.Context, n int64) error {
	if n < 1 || n > MaxCapacity {
		return fmt.Errorf("%w: %d outside [1, %d]", ErrInvalidCapacity, n, int64(MaxCapacity))
	}
	vs, err := s.m.queue.Exec(ctx, s.keys, []string{"c", strconv.FormatInt(n, 10), "0", "", retentionMs, s.m.pubMode}).ToArray()
	if err != nil {
		return fmt.Errorf("semaphore: set capacity %q: %w", s.name, inner(err))
	}
	if vs.Len() != 2 {
		return fmt.Errorf("semaphore: set capacity %q: unexpected reply of %d values", s.name, vs.Len())
	}
	return nil
}

// Holder is one live permit, as listed by Holders.
type Holder struct {
	// ID is the permit's id (Permit.ID).
	ID string
	// Weight is how many permits it holds.
	Weight int64
	// Remaining is how long its lease has left on the server's clock.
	Remaining time.Duration
	// Owner is the label of the Semaphore that granted it (WithOwner), or
	// "" if it had none.
	Owner string
}

// Holders lists the live permits of the semaphore, earliest expiry first,
// for operators. Expired permits not yet reclaimed are not listed.
func (s *Semaphore) Holders(ctx context.Context) ([]Holder, error) {
	vs, err := s.m.holders.Exec(ctx, s.keys[:2], nil).ToArray()
	if err != nil {
		return nil, fmt.Errorf("semaphore: holders %q: %w", s.name, inner(err))
	}
	if vs.Len()%3 != 0 {
		return nil, fmt.Errorf("semaphore: holders %q: unexpected reply of %d values", s.name, vs.Len())
	}
	out := make([]Holder, 0, vs.Len()/3)
	for i := 0; i < vs.Len(); i += 3 {
		id, err1 := vs.At(i).ToString()
		ws, err2 := vs.At(i + 1).ToString()
		ms, err3 := vs.At(i + 2).AsInt64()
		w, err4 := strconv.ParseInt(ws, 10, 64)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			return nil, fmt.Errorf("semaphore: holders %q: unexpected reply: %w", s.name, err)
		}
		out = append(out, Holder{ID: id, Weight: w, Remaining: time.Duration(ms) * time.Millisecond, Owner: ownerOf(id)})
	}
	return out, nil
}

// Info is what Redis says about a semaphore, as Info reads it.
type Info struct {
	// Capacity is the capacity in force: the one SetCapacity set, else the
	// one the live permits were granted under, else (none is held) this
	// Semaphore's.
	Capacity int64
	// CapacitySet reports whether SetCapacity set it (see "Capacity" in
	// the package doc).
	CapacitySet bool
	// Used is the weight of the live permits. Expired permits not
	// reclaimed yet are left out, the 16 oldest of them exactly; if more
	// than 16 remain (Expired > 16), the weight of the rest still counts.
	Used int64
	// Available is Capacity - Used, or 0 while a lowered capacity is
	// still exceeded.
	Available int64
	// Holders is how many live permits there are (one per Acquire).
	Holders int64
	// Expired is how many permits have expired and not been reclaimed yet
	// (the next acquire in their way, or Available, reclaims them).
	Expired int64
	// Queued is how many fair waiters are in the queue, live or not yet
	// found dead; always 0 on a semaphore nobody waits on fairly.
	Queued int64
}

// Info reads the state of the semaphore from Redis, whoever holds its
// permits, in one read-only call of bounded cost: nothing is reclaimed,
// unlike Available. Unlike Holders it does not list the permits.
func (s *Semaphore) Info(ctx context.Context) (Info, error) {
	vs, err := s.m.info.Exec(ctx, []string{s.keys[0], s.keys[1], s.keys[3]}, nil).ToArray()
	if err == nil && vs.Len() != 6 {
		err = fmt.Errorf("unexpected reply of %d values", vs.Len())
	}
	if err != nil {
		return Info{}, fmt.Errorf("semaphore: info %q: %w", s.name, err)
	}
	var v [6]int64
	for i := range v {
		if v[i], err = vs.At(i).AsInt64(); err != nil {
			return Info{}, fmt.Errorf("semaphore: info %q: unexpected reply: %w", s.name, err)
		}
	}
	in := Info{Capacity: v[0], CapacitySet: v[1] == 1, Used: v[2], Holders: v[3], Expired: v[4], Queued: v[5]}
	if in.Holders == 0 {
		in.Used = 0 // only expired permits are left
		if !in.CapacitySet {
			in.Capacity = 0 // the next Acquire brings its own
		}
	}
	if in.Capacity == 0 {
		in.Capacity = s.capacity
	}
	in.Available = max(in.Capacity-in.Used, 0)
	return in, nil
}
