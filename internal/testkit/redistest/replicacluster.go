package redistest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ReplicaCluster is a Redis Cluster of two masters, A (slots 0 to 8191)
// with one replica and B (8192 to 16383) without, for tests that move a
// slot from a master with a replica to one without (MoveSlot), before the
// client under test has heard of it.
type ReplicaCluster struct {
	A, B, Replica *Server
	ids           map[*Server]string // cluster node ids
}

// Nodes returns A, B and the replica.
func (c *ReplicaCluster) Nodes() []*Server { return []*Server{c.A, c.B, c.Replica} }

// Addrs returns the addresses of A, B and the replica.
func (c *ReplicaCluster) Addrs() []string {
	return []string{c.A.Addr(), c.B.Addr(), c.Replica.Addr()}
}

// Stop stops every node.
func (c *ReplicaCluster) Stop() {
	for _, n := range c.Nodes() {
		if n != nil {
			n.Stop()
		}
	}
}

// NewReplicaCluster starts a ReplicaCluster owned by t, stopped when t
// ends.
func NewReplicaCluster(t testing.TB) *ReplicaCluster {
	t.Helper()
	Skip(t)
	c, err := StartReplicaCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// StartReplicaCluster starts A, B and A's replica, and waits until every
// node reports cluster_state:ok and knows the other two, and the replica's
// link to A is up, so that WAIT on A counts it.
func StartReplicaCluster() (*ReplicaCluster, error) {
	c := &ReplicaCluster{ids: make(map[*Server]string)}
	for _, dst := range []**Server{&c.A, &c.B, &c.Replica} {
		s, err := StartServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000")
		if err != nil {
			c.Stop()
			return nil, err
		}
		*dst = s
		id, err := s.Do("CLUSTER", "MYID")
		if err != nil {
			c.Stop()
			return nil, fmt.Errorf("redistest: cluster myid: %w", err)
		}
		c.ids[s] = id
	}
	fail := func(err error) (*ReplicaCluster, error) {
		c.Stop()
		return nil, err
	}
	if _, err := c.A.Do("CLUSTER", "ADDSLOTSRANGE", "0", "8191"); err != nil {
		return fail(fmt.Errorf("redistest: addslots: %w", err))
	}
	if _, err := c.B.Do("CLUSTER", "ADDSLOTSRANGE", "8192", "16383"); err != nil {
		return fail(fmt.Errorf("redistest: addslots: %w", err))
	}
	for _, s := range []*Server{c.B, c.Replica} {
		if _, err := s.Do("CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(c.A.Port)); err != nil {
			return fail(fmt.Errorf("redistest: meet: %w", err))
		}
	}
	// The replica can follow A only once it knows A.
	ctx := context.Background()
	if !WaitFor(ctx, 30*time.Second, func() bool {
		nodes, err := c.Replica.Do("CLUSTER", "NODES")
		return err == nil && strings.Contains(nodes, c.ids[c.A])
	}) {
		return fail(errors.New("redistest: the replica did not learn of A within 30 s"))
	}
	if _, err := c.Replica.Do("CLUSTER", "REPLICATE", c.ids[c.A]); err != nil {
		return fail(fmt.Errorf("redistest: replicate: %w", err))
	}
	var info string
	if !WaitFor(ctx, 30*time.Second, func() bool {
		for _, s := range c.Nodes() {
			var err error
			info, err = s.Do("CLUSTER", "INFO")
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3") {
				return false
			}
		}
		repl, err := c.Replica.Do("INFO", "replication")
		if err != nil || !strings.Contains(repl, "master_link_status:up") {
			info = repl
			return false
		}
		repl, err = c.A.Do("INFO", "replication")
		info = repl
		return err == nil && strings.Contains(repl, "connected_slaves:1") && strings.Contains(repl, "state=online")
	}) {
		return fail(fmt.Errorf("redistest: replica cluster not ready after 30 s: %s", info))
	}
	return c, nil
}

// MoveSlot gives slot to master to (A or B) as CLUSTER SETSLOT slot NODE
// does at the end of a migration, on to first and then on the other
// master, and waits until every node, the replica too, sends a command
// for the slot to to. The slot must hold no keys on its current owner.
// Clients are not told: one that knew the old owner learns of the move
// from a MOVED reply (or its own refresh).
func (c *ReplicaCluster) MoveSlot(slot int, to *Server) error {
	from := c.A
	if to == c.A {
		from = c.B
	}
	s := strconv.Itoa(slot)
	for _, n := range []*Server{to, from} {
		if _, err := n.Do("CLUSTER", "SETSLOT", s, "NODE", c.ids[to]); err != nil {
			return fmt.Errorf("redistest: setslot on %s: %w", n.Addr(), err)
		}
	}
	// A new epoch for to, so that its claim wins on every node by gossip,
	// the replica's included.
	if _, err := to.Do("CLUSTER", "BUMPEPOCH"); err != nil {
		return fmt.Errorf("redistest: bumpepoch: %w", err)
	}
	var owners []string
	if !WaitFor(context.Background(), 30*time.Second, func() bool {
		owners = owners[:0]
		ok := true
		for _, n := range c.Nodes() {
			owner := c.ownerSeenBy(n, slot)
			owners = append(owners, n.Addr()+" sees "+owner)
			ok = ok && owner == to.Addr()
		}
		return ok
	}) {
		return fmt.Errorf("redistest: slot %d not moved to %s on every node after 30 s: %s", slot, to.Addr(), strings.Join(owners, ", "))
	}
	return nil
}

// ownerSeenBy returns the address of the master that n says owns slot,
// from CLUSTER NODES ("" if none does).
func (c *ReplicaCluster) ownerSeenBy(n *Server, slot int) string {
	out, err := n.Do("CLUSTER", "NODES")
	if err != nil {
		return err.Error()
	}
	return slotOwner(out, slot)
}

// StartMigration marks slot as being migrated to master to (A or B), as
// CLUSTER SETSLOT slot IMPORTING and MIGRATING do at the start of a
// migration: from then on its current owner answers a command for a key it
// does not hold with ASK, naming to. No key is moved.
func (c *ReplicaCluster) StartMigration(slot int, to *Server) error {
	from := c.A
	if to == c.A {
		from = c.B
	}
	s := strconv.Itoa(slot)
	if _, err := to.Do("CLUSTER", "SETSLOT", s, "IMPORTING", c.ids[from]); err != nil {
		return fmt.Errorf("redistest: setslot importing: %w", err)
	}
	if _, err := from.Do("CLUSTER", "SETSLOT", s, "MIGRATING", c.ids[to]); err != nil {
		return fmt.Errorf("redistest: setslot migrating: %w", err)
	}
	return nil
}
