package lease

import (
	"sync"

	"github.com/sluicekit/sluice/internal/keyspace"
)

// Slots keeps one Group per Redis Cluster slot, made when first asked for,
// all renewing with the same function: a batch renewal is one script call,
// and the keys of one call must share a slot. On a single server every key
// gets the same group.
type Slots struct {
	k       *Keeper
	renew   RenewBatch
	cluster bool

	one *Group // the group of every key when not on a cluster

	mu     sync.Mutex
	groups map[uint16]*Group // guarded by mu
}

// NewSlots returns per-slot groups whose leases renew calls; cluster says
// whether keys are spread over cluster slots.
func (k *Keeper) NewSlots(cluster bool, renew RenewBatch) *Slots {
	s := &Slots{k: k, renew: renew, cluster: cluster, groups: make(map[uint16]*Group)}
	if !cluster {
		s.one = k.NewGroup(renew)
	}
	return s
}

// Group returns the group of key's slot.
func (s *Slots) Group(key string) *Group {
	if !s.cluster {
		return s.one // no lock: every Mutex made asks
	}
	slot := keyspace.Slot(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.groups[slot]
	if g == nil {
		g = s.k.NewGroup(s.renew)
		s.groups[slot] = g
	}
	return g
}
