package semaphore

import (
	"context"
	"fmt"
	"strconv"

	"github.com/sluicekit/sluice/internal/lease"
)

// renewPermits is the watchdog's renewal of items (*Permit, all with the
// watchdog lease, in one group) in one call. Each semaphore's keys are
// sent once, with the permits of it in the call pointing at them.
func (m *Manager) renewPermits(ctx context.Context, items []any, errs []error) error {
	keys := batchKeys{which: permitKeys, keys: make([]string, 0, 8)}
	args := make([]string, 1+2*len(items))
	args[0] = m.leaseMs
	for i, it := range items {
		p := it.(*Permit)
		args[1+2*i], args[2+2*i] = keys.number(p.s), p.id
	}
	vals, err := m.renewBatch.Exec(ctx, keys.keys, args).ToArray()
	if err != nil {
		return err
	}
	if vals.Len() != len(items) {
		return fmt.Errorf("semaphore: renewal of %d permits answered %d", len(items), vals.Len())
	}
	for i := range len(items) {
		switch ok, err := vals.At(i).AsInt64(); {
		case err != nil:
			errs[i] = err
		case ok == 0:
			errs[i] = errRenewGone
		case ok < 0:
			errs[i] = lease.ErrWrongType
		}
	}
	return nil
}

// batchKeys builds the KEYS of one batched call over semaphores of one
// slot (semaphore_renew_batch, semaphore_queue_refresh): each semaphore's
// keys are sent once, and its items in ARGV name it by its number.
type batchKeys struct {
	which []int             // the positions in Semaphore.keys sent for each semaphore
	keys  []string          // as sent
	index map[string]string // permits hash -> its number
	prev  *Semaphore        // the last one numbered, and its number
	j     string
}

// The keys semaphore_renew_batch and semaphore_queue_refresh take for each
// semaphore: permits hash and expiry set, and those with the queue and its
// entries.
var (
	permitKeys = []int{0, 1}
	queueKeys  = []int{0, 1, 3, 4}
)

// number returns s's number in the call (1-based), adding its keys when s
// first comes.
func (b *batchKeys) number(s *Semaphore) string {
	if s == b.prev {
		return b.j // items of one semaphore often come together: no lookup
	}
	j, ok := b.index[s.keys[0]]
	if !ok {
		for _, w := range b.which {
			b.keys = append(b.keys, s.keys[w])
		}
		j = strconv.Itoa(len(b.keys) / len(b.which))
		if b.index == nil {
			b.index = make(map[string]string)
		}
		b.index[s.keys[0]] = j
	}
	b.prev, b.j = s, j
	return j
}

// errRenewGone is the loss reason when the watchdog finds a permit gone.
var errRenewGone = fmt.Errorf("%w: expired or deleted", lease.ErrGone)
