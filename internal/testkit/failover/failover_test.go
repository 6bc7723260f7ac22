// Package failover_test measures what a Redis failover does to granted locks:
// a primary with one replica, the primary killed (kill -9) and the replica
// promoted. Redis replicates asynchronously, so a grant the primary made but
// had not yet sent to the replica is gone after the failover and can be
// granted again: a doubled grant. The tests count them with and without
// the ReplicaAcks option of mutex and semaphore (WAIT after the acquire
// script).
package failover_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// pair is a primary and a replica of it.
type pair struct {
	primary, replica *redistest.Server
}

func startPair(t *testing.T) pair {
	t.Helper()
	// No 5 s wait before the first (diskless) sync.
	p := redistest.NewServer(t, "--repl-diskless-sync-delay", "0")
	r := redistest.NewServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(p.Port))
	if !redistest.WaitFor(context.Background(), 10*time.Second, func() bool {
		info, _ := r.Do("INFO", "replication")
		pinfo, _ := p.Do("INFO", "replication")
		return strings.Contains(info, "master_link_status:up") && strings.Contains(pinfo, "state=online")
	}) {
		t.Fatal("replica did not sync with the primary")
	}
	// A replica that has just synced may take a moment before it answers
	// the primary's GETACK: wait until a write is acknowledged.
	c := redistest.Client(t, p.Addr())
	ctx := context.Background()
	if !redistest.WaitFor(ctx, 10*time.Second, func() bool {
		res := c.DoMulti(ctx, c.B().Set().Key("probe").Value("1").Build(), c.B().Wait().Numreplicas(1).Timeout(1000).Build())
		n, err := res[1].AsInt64()
		return err == nil && n == 1
	}) {
		t.Fatal("replica does not acknowledge writes")
	}
	c.Do(ctx, c.B().Del().Key("probe").Build())
	return pair{p, r}
}

// failover kills the primary and promotes the replica.
func (p pair) failover(t *testing.T) {
	t.Helper()
	p.primary.Kill()
	if _, err := p.replica.Do("REPLICAOF", "NO", "ONE"); err != nil {
		t.Fatal(err)
	}
}

// scriptCache connects to addr (closed when t ends) and loads the scripts.
func scriptCache(t *testing.T, addr string) *scriptcache.Cache {
	t.Helper()
	sc, err := scriptcache.New(context.Background(), redistest.Client(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func locker(t *testing.T, addr string, opts mutex.Options) *mutex.Locker {
	t.Helper()
	l, err := mutex.NewLocker(scriptCache(t, addr), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// doubled counts the names that a fresh owner can lock on the promoted
// replica although a client was told it held them.
func doubled(t *testing.T, replica *redistest.Server, held []string) int {
	t.Helper()
	l := locker(t, replica.Addr(), mutex.Options{})
	n := 0
	for _, name := range held {
		m, _ := l.NewMutex(name)
		if err := m.TryLock(context.Background()); err == nil {
			n++
		} else if !errors.Is(err, mutex.ErrNotObtained) {
			t.Fatalf("TryLock on the promoted replica: %v", err)
		}
	}
	return n
}

// TestFailoverWithLaggingReplica makes the lag certain: the replica is
// paused and cut off while locks are granted, so none of those grants reach
// it. Without
// ReplicaAcks every one of them is doubled after the failover; with it, no
// grant is made that the replica has not confirmed, so none is doubled.
func TestFailoverWithLaggingReplica(t *testing.T) {
	for _, acks := range []int{0, 1} {
		t.Run(fmt.Sprintf("replicaAcks=%d", acks), func(t *testing.T) {
			ctx := context.Background()
			p := startPair(t)
			l := locker(t, p.primary.Addr(), mutex.Options{ReplicaAcks: acks, ReplicaTimeout: 200 * time.Millisecond})
			var held []string
			lock := func(name string) error {
				m, _ := l.NewMutex(name)
				err := m.Lock(ctx)
				if err == nil {
					held = append(held, name)
				}
				return err
			}
			for i := range 10 {
				if err := lock("before:" + strconv.Itoa(i)); err != nil {
					t.Fatal(err)
				}
			}
			// Let the replica catch up with the first grants.
			if !redistest.WaitFor(ctx, 10*time.Second, func() bool {
				keys, _ := p.replica.Do("KEYS", "sluice:mutex:{before:*")
				return len(strings.Fields(keys)) == 10
			}) {
				t.Fatal("replica did not receive the first grants")
			}
			// Pause the replica and cut its link on the primary, so nothing
			// granted from now on reaches it, not even through socket buffers.
			if err := p.replica.Pause(); err != nil {
				t.Fatal(err)
			}
			if _, err := p.primary.Do("CLIENT", "KILL", "TYPE", "replica"); err != nil {
				t.Fatal(err)
			}
			// CLIENT KILL closes the link asynchronously: go on only once
			// the primary no longer counts the replica.
			if !redistest.WaitFor(ctx, 10*time.Second, func() bool {
				info, _ := p.primary.Do("INFO", "replication")
				return strings.Contains(info, "connected_slaves:0")
			}) {
				t.Fatal("the primary still counts the replica after CLIENT KILL")
			}
			refused := 0
			for i := range 10 {
				err := lock("during:" + strconv.Itoa(i))
				switch {
				case err == nil:
				case errors.Is(err, mutex.ErrNotReplicated):
					refused++
				default:
					t.Fatal(err)
				}
			}
			// The primary dies before the replica runs again: otherwise the
			// replica could reconnect and resync the grants from the
			// primary's backlog in between.
			p.primary.Kill()
			p.replica.Resume()
			p.failover(t)
			n := doubled(t, p.replica, held)
			t.Logf("ReplicaAcks=%d: %d grants, %d refused as unreplicated, %d doubled after failover", acks, len(held), refused, n)
			if acks == 0 && n != 10 {
				t.Errorf("without ReplicaAcks: %d doubled grants, want the 10 made while the replica lagged", n)
			}
			if acks == 1 && (n != 0 || refused != 10) {
				t.Errorf("with ReplicaAcks: %d doubled, %d refused; want 0 doubled and all 10 refused", n, refused)
			}
		})
	}
}

// TestFailoverUnderLoad kills the primary while goroutines keep taking new
// locks, with ordinary replication lag on loopback. It reports how many of
// the grants clients were told about are doubled after the failover; with
// ReplicaAcks there must be none.
func TestFailoverUnderLoad(t *testing.T) {
	for _, acks := range []int{0, 1} {
		t.Run(fmt.Sprintf("replicaAcks=%d", acks), func(t *testing.T) {
			ctx := context.Background()
			p := startPair(t)
			l := locker(t, p.primary.Addr(), mutex.Options{ReplicaAcks: acks, ReplicaTimeout: 200 * time.Millisecond})
			var mu sync.Mutex
			var held []string
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						name := fmt.Sprintf("load:%d:%d", g, i)
						m, _ := l.NewMutex(name)
						if m.TryLock(ctx) == nil {
							mu.Lock()
							held = append(held, name)
							mu.Unlock()
						}
					}
				})
			}
			time.Sleep(300 * time.Millisecond) // the load runs for a while: that is the scenario
			p.primary.Kill()
			close(stop)
			wg.Wait()
			if _, err := p.replica.Do("REPLICAOF", "NO", "ONE"); err != nil {
				t.Fatal(err)
			}
			n := doubled(t, p.replica, held)
			t.Logf("ReplicaAcks=%d: %d grants before the kill, %d doubled after failover", acks, len(held), n)
			if len(held) == 0 {
				t.Fatal("no grants before the kill")
			}
			if acks == 1 && n != 0 {
				t.Errorf("with ReplicaAcks: %d doubled grants, want 0", n)
			}
		})
	}
}

// TestSemaphoreFailoverWithLaggingReplica does the same for permits: after
// the failover, the promoted replica may let new holders take permits that
// clients still hold, so more than the capacity is in use.
func TestSemaphoreFailoverWithLaggingReplica(t *testing.T) {
	const capacity = 10
	for _, acks := range []int{0, 1} {
		t.Run(fmt.Sprintf("replicaAcks=%d", acks), func(t *testing.T) {
			ctx := context.Background()
			p := startPair(t)
			mgr := semManager(t, p.primary.Addr(), semaphore.Options{ReplicaAcks: acks, ReplicaTimeout: 200 * time.Millisecond})
			sem, err := mgr.NewSemaphore("workers", capacity)
			if err != nil {
				t.Fatal(err)
			}
			held := 0
			for range 5 {
				if _, err := sem.Acquire(ctx, 1); err != nil {
					t.Fatal(err)
				}
				held++
			}
			if !redistest.WaitFor(ctx, 10*time.Second, func() bool {
				n, _ := p.replica.Do("ZCARD", "sluice:sem:{workers}:e") // the permits listed
				return n == "5"
			}) {
				t.Fatal("replica did not receive the first grants")
			}
			if err := p.replica.Pause(); err != nil {
				t.Fatal(err)
			}
			if _, err := p.primary.Do("CLIENT", "KILL", "TYPE", "replica"); err != nil {
				t.Fatal(err)
			}
			// CLIENT KILL closes the link asynchronously: go on only once
			// the primary no longer counts the replica.
			if !redistest.WaitFor(ctx, 10*time.Second, func() bool {
				info, _ := p.primary.Do("INFO", "replication")
				return strings.Contains(info, "connected_slaves:0")
			}) {
				t.Fatal("the primary still counts the replica after CLIENT KILL")
			}
			refused := 0
			for range 5 {
				_, err := sem.Acquire(ctx, 1)
				switch {
				case err == nil:
					held++
				case errors.Is(err, semaphore.ErrNotReplicated):
					refused++
				default:
					t.Fatal(err)
				}
			}
			// The primary dies before the replica runs again: otherwise the
			// replica could reconnect and resync the grants from the
			// primary's backlog in between.
			p.primary.Kill()
			p.replica.Resume()
			p.failover(t)
			after, err := semManager(t, p.replica.Addr(), semaphore.Options{}).NewSemaphore("workers", capacity)
			if err != nil {
				t.Fatal(err)
			}
			free, err := after.Available(ctx)
			if err != nil {
				t.Fatal(err)
			}
			over := max(0, int64(held)+free-capacity)
			t.Logf("ReplicaAcks=%d: %d permits held by clients, %d refused, %d free on the promoted replica: %d over capacity", acks, held, refused, free, over)
			if acks == 0 && over != 5 {
				t.Errorf("without ReplicaAcks: %d permits over capacity, want the 5 granted while the replica lagged", over)
			}
			if acks == 1 && (over != 0 || refused != 5) {
				t.Errorf("with ReplicaAcks: %d over capacity, %d refused; want 0 and 5", over, refused)
			}
		})
	}
}

func semManager(t *testing.T, addr string, opts semaphore.Options) *semaphore.Manager {
	t.Helper()
	m, err := semaphore.NewManager(scriptCache(t, addr), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}
