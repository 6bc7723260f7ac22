package clienttest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/semaphore"
)

// keyOfA returns a new key whose slot is one of master A's of a
// redistest.ReplicaCluster (0 to 8191) and none of avoid.
func keyOfA(t testing.TB, name string, avoid ...int) (string, int) {
	for i := 0; ; i++ {
		k := key(t, fmt.Sprintf("a%d", i), name)
		if s := int(keyspace.Slot(k)); s < 8192 && !slices.Contains(avoid, s) {
			return k, s
		}
	}
}

// testEvalWaitSlotMoved: the key's slot moves from master A, which has a
// replica, to master B, which has none, before the client knows. EvalWait
// must run the script where the slot now is (a MOVED reply means it did
// not run, and may be followed), and WAIT on the connection that ran it,
// after it: the acknowledgements counted are B's, none. Before issue 22
// (items 7 and 8), rueidis followed the redirect for the script alone and
// reported the acknowledgement of A's replica for a connection of A that
// had written nothing, and go-redis returned the MOVED error.
func testEvalWaitSlotMoved(t *testing.T, newClient NewClient) {
	rc := redistest.NewReplicaCluster(t)
	client := newClient(t, rc.Addrs())
	ctx := context.Background()
	body := "return redis.call('INCR', KEYS[1])"
	if err := client.LoadScripts(ctx, body); err != nil {
		t.Fatal(err)
	}
	sc := cache(t, client)
	l := locker(t, sc, mutex.Options{ReplicaAcks: 1, ReplicaTimeout: 200 * time.Millisecond})
	mgr := manager(t, sc, semaphore.Options{ReplicaAcks: 1, ReplicaTimeout: 200 * time.Millisecond})
	// The client learns the slots, and A's replica acknowledges.
	warm, warmSlot := keyOfA(t, "warm")
	if _, acks, err := client.EvalWait(ctx, sha(body), "", []string{warm}, nil, 1, 10*time.Second); err != nil || acks != 1 {
		t.Fatalf("EvalWait on A = %d acks, %v; want A's replica to acknowledge", acks, err)
	}
	k, slot := keyOfA(t, "moved", warmSlot)
	used := []int{warmSlot, slot}
	if err := rc.MoveSlot(slot, rc.B); err != nil {
		t.Fatal(err)
	}
	for i, shaArg := range []string{sha(body), ""} {
		b := ""
		if shaArg == "" {
			b = body
		}
		r, acks, err := client.EvalWait(ctx, shaArg, b, []string{k}, nil, 1, 200*time.Millisecond)
		if err != nil {
			t.Fatalf("EvalWait (sha %q) after slot %d moved to B = %v; want the script run on B", shaArg, slot, err)
		}
		if n, err := r.AsInt64(); err != nil || n != int64(i+1) {
			t.Errorf("script reply = %d, %v; want %d", n, err, i+1)
		}
		if acks != 0 {
			t.Errorf("EvalWait (sha %q) after slot %d moved to B = %d acks; B has no replica: WAIT did not run where the script did", shaArg, slot, acks)
		}
	}
	if got, err := rc.B.Do("GET", k); err != nil || got != "2" {
		t.Errorf("GET %s on B = %q, %v; want 2", k, got, err)
	}

	// A slot being migrated from A to B: A answers ASK for a key it does
	// not hold, and the pair must go to B, after ASKING.
	k, slot = keyOfA(t, "asked", used...)
	used = append(used, slot)
	if err := rc.StartMigration(slot, rc.B); err != nil {
		t.Fatal(err)
	}
	r, acks, err := client.EvalWait(ctx, sha(body), "", []string{k}, nil, 1, 200*time.Millisecond)
	if err != nil {
		t.Fatalf("EvalWait while slot %d migrates to B = %v; want the script run on B", slot, err)
	}
	if n, err := r.AsInt64(); err != nil || n != 1 {
		t.Errorf("script reply = %d, %v; want 1", n, err)
	}
	if acks != 0 {
		t.Errorf("EvalWait while slot %d migrates to B = %d acks; B has no replica: WAIT did not run where the script did", slot, acks)
	}
	if got, err := rc.B.Do("CLUSTER", "COUNTKEYSINSLOT", strconv.Itoa(slot)); err != nil || got != "1" {
		t.Errorf("keys of slot %d on B = %q, %v; want the script's key", slot, got, err)
	}

	// The primitives: a Lock or an Acquire with ReplicaAcks on a slot that
	// moved to B is not replicated, and must be refused as such.
	lname, lslot := nameOfA(t, "lock", used...)
	used = append(used, lslot)
	sname, sslot := nameOfA(t, "sem", used...)
	for _, s := range []int{lslot, sslot} {
		if err := rc.MoveSlot(s, rc.B); err != nil {
			t.Fatal(err)
		}
	}
	if err := newMutex(t, l, lname).TryLock(ctx); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Errorf("TryLock with ReplicaAcks after slot %d moved to B = %v; want ErrNotReplicated (B has no replica)", lslot, err)
	}
	sem, err := mgr.NewSemaphore(sname, 1)
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, signal)
	defer cancel()
	if _, err := sem.Acquire(actx, 1); !errors.Is(err, semaphore.ErrNotReplicated) {
		t.Errorf("Acquire with ReplicaAcks after slot %d moved to B = %v; want ErrNotReplicated (B has no replica)", sslot, err)
	}
}

// nameOfA returns a new lock or semaphore name whose keys' slot is one of
// master A's of a redistest.ReplicaCluster and none of avoid.
func nameOfA(t testing.TB, what string, avoid ...int) (string, int) {
	base := name(t, what)
	for i := 0; ; i++ {
		n := fmt.Sprintf("%s-%d", base, i)
		if s := int(keyspace.Slot("{" + n + "}")); s < 8192 && !slices.Contains(avoid, s) {
			return n, s
		}
	}
}
