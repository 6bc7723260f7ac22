package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// eachRW calls f for every RWMutex of rws from 32 goroutines; each stops
// at its first error.
func eachRW(rws []*mutex.RWMutex, f func(*mutex.RWMutex) error) error {
	const workers = 32
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(rws); i += workers {
				if err := f(rws[i]); err != nil {
					errs[w] = fmt.Errorf("%s: %w", rws[i].Name(), err)
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// writeAndRead takes the write lock and then a read hold (a writer's own
// read hold goes through): two holds of one value, renewed apart.
func writeAndRead(rw *mutex.RWMutex) error {
	if err := rw.Lock(context.Background()); err != nil {
		return err
	}
	return rw.RLock(context.Background())
}

// releaseRW gives back every hold of every RWMutex of rws, ignoring errors
// (a lost hold's release reports its loss).
func releaseRW(rws []*mutex.RWMutex) {
	eachRW(rws, func(rw *mutex.RWMutex) error {
		ctx := context.Background()
		w, r := rw.Holds()
		for range r {
			rw.RUnlock(ctx)
		}
		for range w {
			rw.Unlock(ctx)
		}
		return nil
	})
}

// lostRW returns the indexes of the RWMutexes of rws that lost a hold.
func lostRW(rws []*mutex.RWMutex) []int {
	var lost []int
	for i, rw := range rws {
		if rw.Err() != nil {
			lost = append(lost, i)
		}
	}
	return lost
}

// sameSlotNames returns n lock names whose keys are all in one cluster
// slot, so that on a cluster their holds are renewed in the same batches
// (as they are on a single server).
func sameSlotNames(prefix string, n int) []string {
	names := []string{prefix + "0"}
	slot := keyspace.Slot(lockKey(names[0]))
	for i := 1; len(names) < n; i++ {
		if name := fmt.Sprintf("%s%d", prefix, i); keyspace.Slot(lockKey(name)) == slot {
			names = append(names, name)
		}
	}
	return names
}

// TestWatchdogManyRWHoldsBatched holds 2,020 RWMutex holds of 40
// read-write locks on a 2 s watchdog lease for three leases: on 20
// locks a writer with its own read hold, on the other 20 locks 99 readers
// each. None may be lost, the server must still count every writer and
// reader, and the renewals go out many per script call (one call each
// would be 2,020 per 667 ms). On the cluster the locks share 16 slots, so
// calls renew write and read holds of several locks. The lease lets a
// round of renewals start 2*2000/3 - Margin = 1,133 ms late before its
// holds are (rightly) lost: batched holds are renewed together, so one
// late round would lose them all, and a 900 ms lease (510 ms of slack)
// lost 1,369 of them once at load 9-11 with -race.
func TestWatchdogManyRWHoldsBatched(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			ctx := context.Background()
			client := clientFor(t, tg)
			const watchdog, leases, locks, perLock = 2 * time.Second, 3, 40, 99
			l := newLocker(t, client, mutex.Options{WatchdogLease: watchdog})
			names := heldNames("rwheld:"+t.Name()+":", locks, tg.name == "cluster")
			writers := make([]*mutex.RWMutex, 0, locks/2)
			for _, name := range names[:locks/2] {
				writers = append(writers, newRW(t, l, name))
			}
			readers := make([]*mutex.RWMutex, 0, locks/2*perLock)
			for _, name := range names[locks/2:] {
				for range perLock {
					readers = append(readers, newRW(t, l, name))
				}
			}
			all := append(slices.Clip(writers), readers...)
			defer releaseRW(all)
			start := time.Now()
			if err := eachRW(writers, writeAndRead); err != nil {
				t.Fatal(err)
			}
			if err := eachRW(readers, func(rw *mutex.RWMutex) error { return rw.RLock(ctx) }); err != nil {
				t.Fatal(err)
			}
			holds := int64(2*len(writers) + len(readers))
			t.Logf("%d holds taken in %v", holds, time.Since(start))

			before := scriptCalls(t, client)
			time.Sleep(leases * watchdog) // nothing to wait for: asserting that nothing happens
			calls := scriptCalls(t, client) - before
			if lost := lostRW(all); len(lost) > 0 {
				t.Fatalf("%d of %d RWMutexes lost a hold, first %s: %v", len(lost), len(all), all[lost[0]].Name(), all[lost[0]].Err())
			}
			// Each hold is renewed about every watchdog/3.
			renewals := holds * leases * 3
			t.Logf("%d script calls for about %d renewals", calls, renewals)
			if calls*20 > renewals {
				t.Errorf("%d script calls in %d leases, want at most %d (a twentieth of the renewals)", calls, leases, renewals/20)
			}
			// The server agrees: three leases on, every hold still runs.
			for i, w := range writers {
				in, err := w.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if in.Writer != w.Owner() || in.WriteRemain <= 0 || in.Readers != 1 {
					t.Fatalf("%s: %+v, want the writer %s with its read hold", names[i], in, w.Owner())
				}
			}
			for i := range locks / 2 {
				in, err := readers[i*perLock].Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if in.Writer != "" || in.Readers != perLock {
					t.Fatalf("%s: %+v, want %d readers", names[locks/2+i], in, perLock)
				}
			}
		})
	}
}

// TestWatchdogRWBatchGoneOnlyThatHold takes away four holds on the server,
// among 36 holds of 6 read-write locks of one slot renewed in shared
// batches: a writer's hold whose hash is deleted, a writer's hold whose
// end has passed, a reader deleted from the readers set and a reader whose
// end has passed. The watchdog reports those four lost, with the error,
// reason and observer event a renewal of one hold gave, and only those: a
// writer's own read hold lives on after its write hold is lost. The lease
// leaves the renewals 510 ms of lateness, as above.
func TestWatchdogRWBatchGoneOnlyThatHold(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			ctx := context.Background()
			client := clientFor(t, tg)
			const watchdog, perLock = 900 * time.Millisecond, 10
			rec := &recorder{}
			l := observedLocker(t, client, rec, mutex.Options{WatchdogLease: watchdog})
			names := sameSlotNames("rwgone:"+t.Name()+":", 6)
			// Locks 0-2: a writer with its own read hold. Locks 3-5: readers.
			var all []*mutex.RWMutex
			for _, name := range names[:3] {
				w := newRW(t, l, name)
				if err := writeAndRead(w); err != nil {
					t.Fatal(err)
				}
				all = append(all, w)
			}
			// The first reader of a lock is alone in its readers set when
			// it joins: that is how its acquisition id is found.
			var firstIDs []string
			for _, name := range names[3:] {
				first := newRW(t, l, name)
				if err := first.RLock(ctx); err != nil {
					t.Fatal(err)
				}
				ids, err := client.Do(ctx, client.B().Zrange().Key(rwKey(name, "z")).Min("0").Max("-1").Build()).AsStrSlice()
				if err != nil || len(ids) != 1 {
					t.Fatalf("readers of %s: %v, %v; want one", name, ids, err)
				}
				firstIDs = append(firstIDs, ids[0])
				all = append(all, first)
				for range perLock - 1 {
					rw := newRW(t, l, name)
					if err := rw.RLock(ctx); err != nil {
						t.Fatal(err)
					}
					all = append(all, rw)
				}
			}
			defer releaseRW(all)
			rec.take()

			deletedW, expiredW := 0, 1         // writers of locks 0 and 1
			deletedR, expiredR := 3, 3+perLock // first readers of locks 3 and 4
			for _, cmd := range []rueidis.Completed{
				client.B().Del().Key(rwKey(names[0], "h")).Build(),
				client.B().Hset().Key(rwKey(names[1], "h")).FieldValue().FieldValue("e", "1").Build(),
				client.B().Zrem().Key(rwKey(names[3], "z")).Member(firstIDs[0]).Build(),
				client.B().Zadd().Key(rwKey(names[4], "z")).Xx().ScoreMember().ScoreMember(1, firstIDs[1]).Build(),
			} {
				if err := client.Do(ctx, cmd).Error(); err != nil {
					t.Fatal(err)
				}
			}
			victims := []int{deletedW, expiredW, deletedR, expiredR}
			for _, i := range victims {
				select {
				case <-all[i].Lost():
				case <-time.After(signal):
					t.Fatalf("%s (%d): the hold taken away was not reported lost", all[i].Name(), i)
				}
				kind := "(read)"
				if i < 3 {
					kind = "(write)"
				}
				err := all[i].Err()
				if !errors.Is(err, mutex.ErrLost) || !errors.Is(err, lease.ErrGone) ||
					!strings.Contains(err.Error(), kind+": "+"not held any more: deleted, expired or forced") {
					t.Fatalf("%s (%d): Err() = %v, want ErrLost of the %s hold found deleted, expired or forced by a renewal", all[i].Name(), i, err, kind)
				}
			}
			// The others were in the same batches; they must have been
			// renewed by them, and go on being renewed.
			time.Sleep(2 * watchdog) // nothing to wait for: asserting that nothing happens
			if lost := lostRW(all); !slices.Equal(lost, victims) {
				t.Fatalf("lost %v, want only %v", lost, victims)
			}
			for i, rw := range all {
				w, r := rw.Holds()
				wantW, wantR := int64(0), int64(1)
				switch {
				case i == deletedW || i == expiredW:
				case i < 3:
					wantW = 1
				case i == deletedR || i == expiredR:
					wantR = 0
				}
				if w != wantW || r != wantR {
					t.Errorf("%s (%d): holds %d write, %d read; want %d, %d", rw.Name(), i, w, r, wantW, wantR)
				}
			}
			// The server agrees: the writers' read holds and the readers
			// left are still there, and so is the untouched writer.
			for j, want := range []int64{1, 1, 1, perLock - 1, perLock - 1, perLock} {
				rw := all[j] // a writer
				if j >= 3 {
					rw = all[3+(j-3)*perLock] // the lock's first reader
				}
				in, err := rw.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if in.Readers != want || j == 2 && (in.Writer != rw.Owner() || in.WriteRemain <= 0) {
					t.Errorf("%s: %+v, want %d readers", names[j], in, want)
				}
			}

			var events []scriptcache.Event
			for _, ev := range rec.take() {
				if ev.Kind == scriptcache.EventLost {
					events = append(events, ev)
				}
			}
			var got []string
			for _, ev := range events {
				if ev.Primitive != scriptcache.PrimitiveRWMutex || ev.Reason != scriptcache.ReasonGone || ev.Weight != 1 ||
					!errors.Is(ev.Err, mutex.ErrLost) || !errors.Is(ev.Err, lease.ErrGone) {
					t.Errorf("lost event %+v, want an RWMutex's, reason gone, weight 1", ev)
				}
				got = append(got, ev.Name)
			}
			want := []string{names[0], names[1], names[3], names[4]}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("lost events of %v, want one each of %v", got, want)
			}

			for i, rw := range all {
				var errW, errR error
				if i < 3 {
					errR = rw.RUnlock(ctx)
					errW = rw.Unlock(ctx)
				} else {
					errR = rw.RUnlock(ctx)
				}
				switch {
				case i == deletedW || i == expiredW:
					if errR != nil || !errors.Is(errW, mutex.ErrNotHeld) {
						t.Errorf("%s (%d): RUnlock = %v, Unlock = %v; want nil and ErrNotHeld", rw.Name(), i, errR, errW)
					}
				case i == deletedR || i == expiredR:
					if !errors.Is(errR, mutex.ErrNotHeld) {
						t.Errorf("%s (%d): RUnlock = %v, want ErrNotHeld", rw.Name(), i, errR)
					}
				case errR != nil || errW != nil:
					t.Errorf("%s (%d): release: %v, %v", rw.Name(), i, errR, errW)
				}
			}
		})
	}
}
