package chaos

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestCloseBoundsReplicaGiveBack: a Lock with ReplicaAcks whose grant too
// few replicas confirmed gives the grant back; if Redis cannot take that
// give-back (here: CLIENT PAUSE WRITE, which lets WAIT time out but holds
// the give-back's script), Close must not wait for it. README ("Close"):
// "a give-back of an abandoned attempt gets a second to reach Redis ... So
// a server that stopped answering cannot hold Close up." The harness's
// unsatisfiable ReplicaAcks lane reported it on rueidis now and then (a
// Lock of "lu0" in flight at Close returned 4 s later, after its
// context's end); this is its reproduction, without the harness.
func TestCloseBoundsReplicaGiveBack(t *testing.T) {
	const (
		pause = 10 * time.Second
		// bound: the README's second for the give-back, and room for a
		// loaded 2-core machine under -race; the bug waits out pause.
		bound = 4 * time.Second
		// replicaWait: the WAIT's timeout, the window in which the
		// test pauses writes. One missed only delays the test: the
		// call is retried, and a later attempt's give-back meets the
		// pause.
		replicaWait = 300 * time.Millisecond
	)
	srv := redistest.NewServer(t)
	client := redistest.Client(t, srv.Addr())
	sc, err := scriptcache.New(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	l, err := mutex.NewLocker(sc, mutex.Options{ReplicaAcks: 1, ReplicaTimeout: replicaWait})
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	var once sync.Once
	closeOnce := func() {
		once.Do(func() {
			l.Close()
			close(closed)
		})
	}
	// A test that fails before its Close closes here: waiting for a
	// Close nobody started held go test until its timeout.
	t.Cleanup(func() {
		_, _ = srv.Do("CLIENT", "UNPAUSE")
		closeOnce()
	})
	m, err := l.NewMutex("close-give-back")
	if err != nil {
		t.Fatal(err)
	}
	// Warm the connections the pair and the give-back run on.
	if err := m.TryLock(context.Background()); !errors.Is(err, mutex.ErrNotReplicated) {
		t.Fatalf("warm-up TryLock = %v, want ErrNotReplicated (no replica)", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	locked := make(chan error, 1)
	go func() { locked <- m.Lock(ctx) }()
	if !redistest.WaitFor(ctx, 10*time.Second, func() bool { return len(redistest.GoroutinesIn("ExecWaitOrLate")) > 0 }) {
		t.Fatal("the Lock's script+WAIT never went out")
	}
	// WAIT runs replicaWait: pause writes now, so that it answers "no
	// replica" and the give-back that follows waits on the server.
	if _, err := srv.Do("CLIENT", "PAUSE", strconv.FormatInt(pause.Milliseconds(), 10), "WRITE"); err != nil {
		t.Fatal(err)
	}
	if !redistest.WaitFor(ctx, 10*time.Second, func() bool { return len(redistest.GoroutinesIn("mutex.(*Mutex).releaseGrant")) > 0 }) {
		t.Fatal("the Lock never gave its grant back")
	}

	start := time.Now()
	go closeOnce()
	select {
	case <-closed:
		t.Logf("Close took %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(bound):
		t.Errorf("Locker.Close still blocked %v after it was called, with a give-back waiting on a paused server", bound)
	}
	// README: a Lock with ReplicaAcks in flight at Close returns at once
	// (the harness holds it to Close's bound); its give-back gets a
	// second.
	select {
	case err := <-locked:
		t.Logf("Lock returned %v, %v after Close was called", err, time.Since(start).Round(time.Millisecond))
	case <-time.After(bound):
		t.Errorf("Lock still in flight %v after Close was called (its give-back waiting on a server that takes no writes)", bound)
		t.Logf("Lock returned %v, %v after Close was called", <-locked, time.Since(start).Round(time.Millisecond))
	}
	_, _ = srv.Do("CLIENT", "UNPAUSE")
	<-closed
}
