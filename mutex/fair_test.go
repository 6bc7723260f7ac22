package mutex_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// queueOwners returns the owners queued on a fair lock, in queue order.
func queueOwners(t *testing.T, client rueidis.Client, name string) []string {
	t.Helper()
	ctx := context.Background()
	k := lockKey(name)
	ids, err := client.Do(ctx, client.B().Zrange().Key(k+":q").Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	owners := make([]string, 0, len(ids))
	for _, id := range ids {
		e, err := client.Do(ctx, client.B().Hget().Key(k+":e").Field(id).Build()).ToString()
		if err != nil {
			t.Fatalf("entry of %s: %v", id, err)
		}
		_, owner, _ := strings.Cut(e, " ")
		owners = append(owners, owner)
	}
	return owners
}

// waitQueued waits until n waiters are queued on name.
func waitQueued(t *testing.T, client rueidis.Client, name string, n int64) {
	t.Helper()
	ctx := context.Background()
	if !redistest.WaitFor(ctx, signal, func() bool {
		got, _ := client.Do(ctx, client.B().Zcard().Key(lockKey(name)+":q").Build()).AsInt64()
		return got == n
	}) {
		t.Fatalf("%d waiters were not queued in time", n)
	}
}

// fairWaiter runs goroutines that each Lock a fair mutex once, append their
// owner to a list inside the critical section, and Unlock.
func fairWaiter(t *testing.T, client rueidis.Client, args []string) {
	ctx := context.Background()
	name := args[0]
	goroutines, _ := strconv.Atoi(args[1])
	sc := newScripts(t, client)
	l, err := mutex.NewLocker(sc, mutex.Options{Fair: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			m, _ := l.NewMutex(name)
			lctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			if err := m.Lock(lctx); err != nil {
				t.Error(err)
				return
			}
			client.Do(ctx, client.B().Rpush().Key("{"+name+"}:order").Element(m.Owner()).Build())
			if err := m.Unlock(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	fmt.Println("done")
}

// TestFairOrderAcrossProcesses: waiters of 4 processes queue on a held fair
// lock; they must get it exactly in queue order.
func TestFairOrderAcrossProcesses(t *testing.T) {
	const procs, goroutines = 4, 6
	ctx := context.Background()
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			addrs := tg.addrs(t)
			client := redistest.Client(t, addrs...)
			name := "fifo:" + tg.name + strconv.Itoa(rand.IntN(1e9))
			holder := newMutex(t, newLocker(t, client, mutex.Options{Fair: true}), name)
			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			var cmds []*exec.Cmd
			var outs []*bufio.Scanner
			for range procs {
				cmd := helper(t, "fairwaiter", addrs, name, strconv.Itoa(goroutines))
				out, _ := cmd.StdoutPipe()
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				cmds = append(cmds, cmd)
				outs = append(outs, bufio.NewScanner(out))
			}
			waitQueued(t, client, name, procs*goroutines)
			want := queueOwners(t, client, name)
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			for i, cmd := range cmds {
				for outs[i].Scan() {
				}
				if err := cmd.Wait(); err != nil {
					t.Fatalf("helper %d: %v", i, err)
				}
			}
			got, err := client.Do(ctx, client.B().Lrange().Key("{"+name+"}:order").Start(0).Stop(-1).Build()).AsStrSlice()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("acquisition order differs from queue order:\n got %q\nwant %q", got, want)
			}
		})
	}
}

// TestFairNoBarging: a holder that unlocks and locks again at once must
// queue behind the waiter that was already waiting.
func TestFairNoBarging(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l := newLocker(t, client, mutex.Options{Fair: true})
	name := "barge"
	a, b := newMutex(t, l, name), newMutex(t, l, name)
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- b.Lock(ctx) }()
	waitQueued(t, client, name, 1)
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.TryLock(ctx); !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("TryLock right after Unlock with a waiter queued = %v, want ErrNotObtained", err)
	}
	if info, _ := a.Info(ctx); info.Owner != b.Owner() {
		t.Fatalf("Info after Unlock = %+v, want handed to the waiter %s", info, b.Owner())
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if b.Token() <= 0 {
		t.Fatalf("hand-off token = %d", b.Token())
	}
	relocked := make(chan error, 1)
	go func() { relocked <- a.Lock(ctx) }()
	waitQueued(t, client, name, 1)
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-relocked; err != nil {
		t.Fatal(err)
	}
	a.Unlock(ctx)
}

// TestFairWaiterLeaves: a queued waiter whose context ends leaves the queue
// at once, so the release goes to the next waiter without a stall (the
// 30 s lease would show).
func TestFairWaiterLeaves(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l := newLocker(t, client, mutex.Options{Fair: true})
	name := "leaves"
	holder, quitter, next := newMutex(t, l, name), newMutex(t, l, name), newMutex(t, l, name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	qctx, cancel := context.WithCancel(ctx)
	quit := make(chan error, 1)
	go func() { quit <- quitter.Lock(qctx) }()
	waitQueued(t, client, name, 1)
	got := make(chan error, 1)
	go func() { got <- next.Lock(ctx) }()
	waitQueued(t, client, name, 2)
	if info, err := holder.Info(ctx); err != nil || info.Queued != 2 {
		t.Fatalf("Info = %+v, %v; want 2 queued", info, err)
	}
	cancel()
	if err := <-quit; !errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("cancelled Lock = %v, want ErrNotObtained", err)
	}
	waitQueued(t, client, name, 1)
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(signal):
		t.Fatal("the next waiter did not get the lock: the release went to the waiter that left")
	}
	next.Unlock(ctx)
}

// TestFairDeadWaiterAtHead: a waiter that died at the head of the queue
// (its process killed: nothing refreshes its entry or takes the grant)
// blocks the lock no longer than its entry's lease. This is where
// Redisson's RFairLock stalled (its issues 1104, 2883, 3004, 3730).
func TestFairDeadWaiterAtHead(t *testing.T) {
	ctx := context.Background()
	addr := redistest.Single(t).Addr()
	client := redistest.Client(t, addr)
	const lease = time.Second
	name := "deadhead"
	holder := newMutex(t, newLocker(t, client, mutex.Options{Fair: true, WatchdogLease: lease}), name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// The dead waiter's process: its own client and Locker, closed without
	// leaving the queue, as a kill -9 would.
	deadClient, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	dead := newMutex(t, newLocker(t, deadClient, mutex.Options{Fair: true, WatchdogLease: lease}), name)
	live := newMutex(t, newLocker(t, client, mutex.Options{Fair: true, WatchdogLease: lease}), name)
	dctx, dcancel := context.WithCancel(ctx)
	deadDone := make(chan struct{})
	go func() { defer close(deadDone); dead.Lock(dctx) }()
	waitQueued(t, client, name, 1)
	got := make(chan error, 1)
	go func() { got <- live.Lock(ctx) }()
	// Both queue while the first is alive (its entry dies a lease after
	// its last refresh, so queueing the second after the kill could find
	// it gone already on a loaded machine).
	waitQueued(t, client, name, 2)
	deadClient.Close() // from now on nothing it sends reaches Redis
	dcancel()
	<-deadDone
	start := time.Now()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(signal):
		t.Fatal("the queue stalled behind a dead waiter")
	}
	// The dead entry's lease (1 s) bounds the stall; a generous margin for
	// a loaded machine, far below the 10 s signal.
	if d := time.Since(start); d > 5*lease {
		t.Fatalf("stalled %v behind a dead waiter, want at most about its 1 s entry lease", d)
	}
	live.Unlock(ctx)
}

// TestFairLostGrantMessage: the release's grant message never reaches the
// waiter; it must find its grant by its own periodic re-check, well before
// the lease would end.
func TestFairLostGrantMessage(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc := newScripts(t, client)
	l := newLocker(t, client, mutex.Options{Fair: true}) // 30 s lease, re-check every second
	name := "lostgrant"
	holder, waiter := newMutex(t, l, name), newMutex(t, l, name)
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- waiter.Lock(ctx) }()
	waitQueued(t, client, name, 1)
	// Release as Unlock would, but publish on a channel nobody listens to.
	release, _ := sc.Script("mutex_release")
	keys := scriptKeys(name)
	keys.release[1] = "{" + name + "}:nowhere"
	left, err := release.Exec(ctx, keys.release, unlockArgs(holder.Owner(), 1, holder.Token())).AsInt64()
	if err != nil || left != 0 {
		t.Fatalf("release = %d, %v", left, err)
	}
	start := time.Now()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(signal):
		t.Fatal("the waiter did not find its grant")
	}
	if d := time.Since(start); d > signal/2 {
		t.Fatalf("found the grant after %v, want about one re-check (1 s)", d)
	}
	if info, _ := waiter.Info(ctx); info.Owner != waiter.Owner() || info.Token != waiter.Token() {
		t.Fatalf("Info = %+v, want held by the waiter with token %d", info, waiter.Token())
	}
	waiter.Unlock(ctx)
}

// TestUnfairUnlockHandsToFairWaiter: an unfair Mutex's Unlock sends only
// the lock's record and channel; when a fair waiter is queued, the release
// asks for the queue's keys (-2) before it changes anything and gets them,
// so the lock is handed to the waiter as any release would: the waiter
// holds it as soon as the Unlock returns. With nobody queued, the Unlock is
// one call.
func TestUnfairUnlockHandsToFairWaiter(t *testing.T) {
	ctx := context.Background()
	addr := redistest.Single(t).Addr()
	client := redistest.Client(t, addr)
	l, spy := spiedLocker(t, []string{addr}, mutex.Options{})
	name := "unfair-to-fair"
	holder, waiter := newMutex(t, l, name), newMutex(t, newLocker(t, client, mutex.Options{Fair: true}), name)
	var mu sync.Mutex
	var keyCounts []int // of the holder's Unlock calls
	spy.set(func(keys, args []string) spyAction {
		if isUnlockOf(holder.Owner(), keys, args) {
			mu.Lock()
			keyCounts = append(keyCounts, len(keys))
			mu.Unlock()
		}
		return spyPass
	}, nil)
	unlock := func() []int {
		t.Helper()
		mu.Lock()
		keyCounts = nil
		mu.Unlock()
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return keyCounts
	}
	for round := range 2 {
		if err := holder.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if calls := unlock(); !slices.Equal(calls, []int{2}) {
			t.Fatalf("round %d: an Unlock with nobody queued sent calls with %v keys, want [2]", round, calls)
		}
	}
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- waiter.Lock(ctx) }()
	waitQueued(t, client, name, 1)
	if calls := unlock(); !slices.Equal(calls, []int{2, 5}) {
		t.Fatalf("an Unlock with a fair waiter queued sent calls with %v keys, want [2 5]", calls)
	}
	if info, err := waiter.Info(ctx); err != nil || info.Owner != waiter.Owner() {
		t.Fatalf("Info after the Unlock = %+v, %v; want handed to the waiter %s", info, err, waiter.Owner())
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if err := waiter.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
