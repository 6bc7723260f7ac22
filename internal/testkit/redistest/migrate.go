package redistest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Owner returns the master that owns slot, as node 0 of the cluster sees
// it (or, if that one does not answer, the first node that does).
func (c *Cluster) Owner(slot int) (*Server, error) {
	var lastErr error
	for _, n := range c.Nodes {
		out, err := n.Do("CLUSTER", "NODES")
		if err != nil {
			lastErr = err
			continue
		}
		addr := slotOwner(out, slot)
		for _, s := range c.Nodes {
			if s.Addr() == addr {
				return s, nil
			}
		}
		return nil, fmt.Errorf("redistest: no node owns slot %d: %s", slot, out)
	}
	return nil, lastErr
}

// slotOwner returns the address of the master that owns slot in the
// output of CLUSTER NODES ("" if none does). Slots being imported or
// migrated ("[...]") are listed apart and do not count.
func slotOwner(nodes string, slot int) string {
	for line := range strings.SplitSeq(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.Contains(f[2], "master") {
			continue
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue
			}
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			l, err1 := strconv.Atoi(lo)
			h, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil && l <= slot && slot <= h {
				addr, _, _ := strings.Cut(f[1], "@")
				return addr
			}
		}
	}
	return ""
}

// MigrateSlot moves slot, keys and all, from its owner to master to, as
// redis-cli --cluster reshard does: SETSLOT IMPORTING on to, MIGRATING on
// the owner, then MIGRATE of its keys, batch keys at a time, and at last
// SETSLOT NODE on to, on the owner and on every other master. Before each
// batch it calls between (if not nil), so that the caller's clients meet
// ASK and TRYAGAIN while the slot's keys are split between the two. Keys
// keep their TTLs; none is left behind (the owner refuses SETSLOT NODE
// while it holds a key of the slot, and the keys are then migrated
// again).
func (c *Cluster) MigrateSlot(slot int, to *Server, batch int, between func()) error {
	from, err := c.Owner(slot)
	if err != nil {
		return err
	}
	if from == to {
		return errors.New("redistest: migrate slot: to already owns it")
	}
	fromID, err := do(from, "CLUSTER", "MYID")
	if err != nil {
		return err
	}
	toID, err := do(to, "CLUSTER", "MYID")
	if err != nil {
		return err
	}
	s := strconv.Itoa(slot)
	if _, err := do(to, "CLUSTER", "SETSLOT", s, "IMPORTING", fromID); err != nil {
		return fmt.Errorf("redistest: setslot importing: %w", err)
	}
	if _, err := do(from, "CLUSTER", "SETSLOT", s, "MIGRATING", toID); err != nil {
		return fmt.Errorf("redistest: setslot migrating: %w", err)
	}
	for attempt := 0; ; attempt++ {
		if err := migrateKeys(from, to, s, batch, between); err != nil {
			return err
		}
		if _, err := do(to, "CLUSTER", "SETSLOT", s, "NODE", toID); err != nil {
			return fmt.Errorf("redistest: setslot node on %s: %w", to.Addr(), err)
		}
		// A config epoch above every other node's, so that gossip from the
		// old owner (still claiming the slot until its own SETSLOT below)
		// cannot win the slot back; a node that loses a slot that way
		// drops its keys (seen on Valkey 8 under load).
		if _, err := do(to, "CLUSTER", "BUMPEPOCH"); err != nil {
			return fmt.Errorf("redistest: bumpepoch on %s: %w", to.Addr(), err)
		}
		_, err := do(from, "CLUSTER", "SETSLOT", s, "NODE", toID)
		if err == nil {
			break
		}
		if attempt == 10 || !strings.Contains(err.Error(), "keys") {
			return fmt.Errorf("redistest: setslot node on %s: %w", from.Addr(), err)
		}
	}
	for _, n := range c.Nodes {
		if n == from || n == to {
			continue
		}
		if _, err := do(n, "CLUSTER", "SETSLOT", s, "NODE", toID); err != nil {
			return fmt.Errorf("redistest: setslot node on %s: %w", n.Addr(), err)
		}
	}
	return nil
}

// migrateTimeout is how long MigrateSlot retries a step that met a
// server that did not answer (stopped, restarting, a dial timed out on a
// loaded machine): a migration left half done answers ASK and TRYAGAIN
// for its slot for ever.
const migrateTimeout = 30 * time.Second

// do is s.Do, retried for up to migrateTimeout while it fails as a server
// that does not answer does.
func do(s *Server, args ...string) (string, error) {
	deadline := time.Now().Add(migrateTimeout)
	for {
		out, err := s.Do(args...)
		if err == nil || !transient(err) || time.Now().After(deadline) {
			return out, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// transient reports whether err is a failure to reach or hear from a
// server, or a server's reply that says it is busy with something that
// passes (MIGRATE's IOERR when its target did not answer).
func transient(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	for _, p := range []string{"IOERR", "CLUSTERDOWN", "LOADING"} {
		if strings.HasPrefix(err.Error(), p) {
			return true
		}
	}
	return false
}

// migrateKeys sends the keys of slot on from to to, batch at a time, until
// from has none left.
func migrateKeys(from, to *Server, slot string, batch int, between func()) error {
	host, port, _ := strings.Cut(to.Addr(), ":")
	for {
		out, err := do(from, "CLUSTER", "GETKEYSINSLOT", slot, strconv.Itoa(batch))
		if err != nil {
			return fmt.Errorf("redistest: getkeysinslot: %w", err)
		}
		keys := strings.Fields(out)
		if len(keys) == 0 {
			return nil
		}
		if between != nil {
			between()
		}
		args := append([]string{"MIGRATE", host, port, "", "0", "5000", "KEYS"}, keys...)
		if _, err := do(from, args...); err != nil && !strings.Contains(err.Error(), "NOKEY") {
			return fmt.Errorf("redistest: migrate %v: %w", keys, err)
		}
	}
}

// WaitOK waits until every node reports cluster_state:ok, as after a node
// stopped for a while comes back (if it was stopped past the node
// timeout, the others marked it failed and refuse every command until
// they clear that).
func (c *Cluster) WaitOK(timeout time.Duration) error {
	var info string
	if !WaitFor(context.Background(), timeout, func() bool {
		for _, n := range c.Nodes {
			var err error
			if info, err = n.Do("CLUSTER", "INFO"); err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
		}
		return true
	}) {
		return fmt.Errorf("redistest: cluster not ok after %v: %s", timeout, info)
	}
	return nil
}

// StartKeyMigration marks the slot of key as being migrated from its owner
// to another master (CLUSTER SETSLOT IMPORTING, then MIGRATING) and moves
// no key. While it lasts, a script on the owner may touch only the keys
// the owner holds: a key the script deleted earlier in the same call is
// refused ("Script attempted to access a non local key"), after the call's
// earlier writes were made. end marks the slot stable again on both; the
// test's end calls it too.
func (c *Cluster) StartKeyMigration(t testing.TB, key string) (end func()) {
	t.Helper()
	out, err := c.Nodes[0].Do("CLUSTER", "KEYSLOT", key)
	if err != nil {
		t.Fatal(err)
	}
	slot := strings.TrimSpace(out)
	n, err := strconv.Atoi(slot)
	if err != nil {
		t.Fatalf("redistest: keyslot %q: %v", out, err)
	}
	from, err := c.Owner(n)
	if err != nil {
		t.Fatal(err)
	}
	to := c.Nodes[0]
	if to == from {
		to = c.Nodes[1]
	}
	ids := make([]string, 2)
	for i, s := range []*Server{from, to} {
		id, err := s.Do("CLUSTER", "MYID")
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = strings.TrimSpace(id)
	}
	var once sync.Once
	end = func() {
		once.Do(func() {
			for _, s := range []*Server{from, to} {
				if _, err := s.Do("CLUSTER", "SETSLOT", slot, "STABLE"); err != nil {
					t.Errorf("redistest: setslot stable on %s: %v", s.Addr(), err)
				}
			}
		})
	}
	t.Cleanup(end)
	if _, err := to.Do("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[0]); err != nil {
		t.Fatalf("redistest: setslot importing: %v", err)
	}
	if _, err := from.Do("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[1]); err != nil {
		t.Fatalf("redistest: setslot migrating: %v", err)
	}
	return end
}
