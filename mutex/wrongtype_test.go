package mutex_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/lease"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// A key overwritten with another type of value (an operator's SET, another
// program sharing the prefix) makes every Redis command on it fail with
// WRONGTYPE. In a batched renewal that answers for its own hold only: the
// others of the batch are renewed, not lost with it.

// wrongTyped is the loss a renewal reports for a hold whose key holds
// another type of value.
func wrongTyped(err error) bool {
	return errors.Is(err, mutex.ErrLost) && errors.Is(err, lease.ErrWrongType) && strings.Contains(err.Error(), "another type")
}

// TestWatchdogBatchWrongTypeOnlyThatLock overwrites one lock's key, among
// 50 locks renewed in shared batches, with a string: the watchdog reports
// that lock lost, saying why, and only that one; the others stay held and
// unlock. The lease leaves the renewals 510 ms of lateness, as in
// TestWatchdogBatchGoneOnlyThatLock.
func TestWatchdogBatchWrongTypeOnlyThatLock(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			ctx := context.Background()
			client := clientFor(t, tg)
			const watchdog, victim = 900 * time.Millisecond, 25
			l := newLocker(t, client, mutex.Options{WatchdogLease: watchdog})
			ms := lockAll(t, l, heldNames("wrongtype:"+t.Name()+":", 50, tg.name == "cluster"))
			defer unlockAll(ms)
			if err := client.Do(ctx, client.B().Set().Key(lockKey(ms[victim].Name())).Value("not a lock").Build()).Error(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-ms[victim].Lost():
			case <-time.After(signal):
				t.Fatal("the overwritten lock was not reported lost")
			}
			// The others were in the same batches; they must have been
			// renewed by them, and go on being renewed.
			time.Sleep(2 * watchdog) // nothing to wait for: asserting that nothing happens
			if lost := lostOf(ms); !slices.Equal(lost, []int{victim}) {
				t.Fatalf("%d lost %v, want only [%d]; first: %v", len(lost), lost, victim, ms[lost[0]].Err())
			}
			if err := ms[victim].Err(); !wrongTyped(err) {
				t.Fatalf("Err() = %v, want ErrLost for a key of another type", err)
			}
			for i, m := range ms {
				err := m.Unlock(ctx)
				switch {
				case i == victim:
					if !errors.Is(err, mutex.ErrNotHeld) || !wrongTyped(err) {
						t.Errorf("Unlock of the overwritten lock = %v, want ErrNotHeld with its loss", err)
					}
				case err != nil:
					t.Errorf("Unlock of %s: %v", m.Name(), err)
				}
			}
		})
	}
}

// TestWatchdogRWBatchWrongTypeOnlyThoseHolds overwrites, among 36 holds of
// 6 read-write locks of one slot renewed in shared batches, one lock's
// state hash and another lock's readers set with strings: the writer's
// hold kept in that hash and the 10 read holds kept in that set are
// reported lost, saying why, and only those (the writer's own read hold
// lives on); the others stay held and release. The lease leaves the
// renewals 510 ms of lateness, as in TestWatchdogBatchGoneOnlyThatLock.
func TestWatchdogRWBatchWrongTypeOnlyThoseHolds(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			ctx := context.Background()
			client := clientFor(t, tg)
			const watchdog, perLock = 900 * time.Millisecond, 10
			l := newLocker(t, client, mutex.Options{WatchdogLease: watchdog})
			names := sameSlotNames("rwwrongtype:"+t.Name()+":", 6)
			// Locks 0-2: a writer with its own read hold. Locks 3-5: readers.
			var all []*mutex.RWMutex
			for _, name := range names[:3] {
				w := newRW(t, l, name)
				if err := writeAndRead(w); err != nil {
					t.Fatal(err)
				}
				all = append(all, w)
			}
			for _, name := range names[3:] {
				for range perLock {
					rw := newRW(t, l, name)
					if err := rw.RLock(ctx); err != nil {
						t.Fatal(err)
					}
					all = append(all, rw)
				}
			}
			defer releaseRW(all)
			const writer, readers = 0, 3 // lock 0's state hash, lock 3's readers set
			for _, key := range []string{rwKey(names[writer], "h"), rwKey(names[readers], "z")} {
				if err := client.Do(ctx, client.B().Set().Key(key).Value("not a lock").Build()).Error(); err != nil {
					t.Fatal(err)
				}
			}
			victims := []int{writer}
			for i := range perLock {
				victims = append(victims, readers+i)
			}
			for _, i := range victims {
				select {
				case <-all[i].Lost():
				case <-time.After(signal):
					t.Fatalf("%s (%d): the hold whose key was overwritten was not reported lost", all[i].Name(), i)
				}
			}
			// The others were in the same batches; they must have been
			// renewed by them, and go on being renewed.
			time.Sleep(2 * watchdog) // nothing to wait for: asserting that nothing happens
			if lost := lostRW(all); !slices.Equal(lost, victims) {
				t.Fatalf("lost %v, want only %v; first: %v", lost, victims, all[lost[0]].Err())
			}
			for _, i := range victims {
				if err := all[i].Err(); !wrongTyped(err) {
					t.Errorf("%s (%d): Err() = %v, want ErrLost for a key of another type", all[i].Name(), i, err)
				}
			}
			for i, rw := range all {
				w, r := rw.Holds()
				wantW, wantR := int64(0), int64(1)
				switch {
				case i == writer:
				case i < 3:
					wantW = 1
				case i >= readers && i < readers+perLock:
					wantR = 0
				}
				if w != wantW || r != wantR {
					t.Errorf("%s (%d): holds %d write, %d read; want %d, %d", rw.Name(), i, w, r, wantW, wantR)
				}
			}
			for i, rw := range all {
				errR := rw.RUnlock(ctx)
				var errW error
				if i < 3 {
					errW = rw.Unlock(ctx)
				}
				switch {
				case i == writer:
					if errR != nil || !errors.Is(errW, mutex.ErrNotHeld) {
						t.Errorf("%s (%d): RUnlock = %v, Unlock = %v; want nil and ErrNotHeld", rw.Name(), i, errR, errW)
					}
				case i >= readers && i < readers+perLock:
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

// TestQueueRefreshWrongTypeOnlyThatWaiter runs one batched refresh of the
// queue entries of five fair waiters, each queued on its own lock of one
// slot, after overwriting with a string the queue of one lock, the
// entries hash of another and the lock record of a third. Those three
// waiters are answered "look for yourself" (their own Lock call then gets
// the error), and the call still refreshes the other two: the entry of the
// waiter on a held lock is rewritten and answered refreshed, the one on a
// lock whose holder is gone is answered "lock free".
func TestQueueRefreshWrongTypeOnlyThatWaiter(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			ctx := context.Background()
			client := clientFor(t, tg)
			sc := newScripts(t, client)
			lock, _ := sc.Script("mutex_lock")
			refresh, _ := sc.Script("mutex_queue_refresh")
			do := func(cmd rueidis.Completed) {
				t.Helper()
				if err := client.Do(ctx, cmd).Error(); err != nil {
					t.Fatal(err)
				}
			}
			names := sameSlotNames("queuewrongtype:"+t.Name()+":", 5)
			var keys, args []string
			for _, name := range names {
				k := scriptKeys(name).lock // hash, tombstones, queue, entries
				if got, err := execLock(ctx, lock, k[:3], "holder", "30000", "h.1", ""); err != nil || got[0] != 1 {
					t.Fatalf("%s: holder's Lock = %v, %v", name, got, err)
				}
				if got, err := execLock(ctx, lock, k, "waiter", "30000", "w.1", "f"); err != nil || got[0] != 0 {
					t.Fatalf("%s: waiter's Lock = %v, %v; want queued", name, got, err)
				}
				// An entry the refresh must rewrite.
				do(client.B().Hset().Key(k[3]).FieldValue().FieldValue("w.1", "1 waiter").Build())
				keys = append(keys, k[0], k[2], k[3])
				args = append(args, "w.1", "waiter", "30000")
			}
			// Waiter 1's queue, 2's entries and 3's lock record hold strings;
			// waiter 4's lock is free (its holder's hash is gone).
			for _, key := range []string{lockKey(names[1]) + ":q", lockKey(names[2]) + ":e", lockKey(names[3])} {
				do(client.B().Set().Key(key).Value("not a lock").Build())
			}
			do(client.B().Del().Key(lockKey(names[4])).Build())
			got, err := refresh.Exec(ctx, keys, args).AsIntSlice()
			if err != nil {
				t.Fatalf("refresh: %v, want an answer for each waiter", err)
			}
			if want := []int64{1, 0, 0, 0, 2}; !slices.Equal(got, want) {
				t.Fatalf("refresh answered %v, want %v", got, want)
			}
			for _, i := range []int{0, 4} {
				entry, err := client.Do(ctx, client.B().Hget().Key(lockKey(names[i])+":e").Field("w.1").Build()).ToString()
				if err != nil || entry == "1 waiter" || !strings.HasSuffix(entry, " waiter") {
					t.Errorf("%s: entry %q, %v after the refresh; want it rewritten", names[i], entry, err)
				}
			}
		})
	}
}

// notRecords are values of a lock's key that are not lock records: strings
// an operator or another program could write, among them ones that start
// like a record, and a hash (as development trees before the string record
// kept a lock in).
var notRecords = []struct {
	name  string
	write func(c rueidis.Client, key string) rueidis.Completed
}{
	{"plain string", func(c rueidis.Client, key string) rueidis.Completed {
		return c.B().Set().Key(key).Value("not a lock").Build()
	}},
	{"number", func(c rueidis.Client, key string) rueidis.Completed {
		return c.B().Set().Key(key).Value("12345").Build()
	}},
	{"record without its end", func(c rueidis.Client, key string) rueidis.Completed {
		return c.B().Set().Key(key).Value("L:1764350000000000:1764350000000000").Build()
	}},
	{"record with a broken hold", func(c rueidis.Client, key string) rueidis.Completed {
		return c.B().Set().Key(key).Value("L:1764350000000000:1764350000000000|1:a.1").Build()
	}},
	{"hash", func(c rueidis.Client, key string) rueidis.Completed {
		return c.B().Hset().Key(key).FieldValue().FieldValue("o", "x").FieldValue("f", "1").Build()
	}},
}

// TestNotALockRecord: a lock's key overwritten with a value that is not a
// lock record (another type, or a string that is not one) makes every call
// on that lock fail with WRONGTYPE and leaves the value as it is, as a key
// of another type did when the lock was a hash: a string layout must not
// take a string it did not write for a free lock, nor overwrite it.
func TestNotALockRecord(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	l := newLocker(t, client, mutex.Options{})
	fixed := newLocker(t, client, mutex.Options{Lease: time.Minute})
	dump := func(key string) string {
		v, err := client.Do(ctx, client.B().Dump().Key(key).Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range notRecords {
		t.Run(tc.name, func(t *testing.T) {
			name := "notrecord:" + tc.name
			holder := newMutex(t, fixed, name)
			if err := holder.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			for _, cmd := range []rueidis.Completed{client.B().Del().Key(lockKey(name)).Build(), tc.write(client, lockKey(name))} {
				if err := client.Do(ctx, cmd).Error(); err != nil {
					t.Fatal(err)
				}
			}
			before := dump(lockKey(name))
			m := newMutex(t, l, name)
			lctx, cancel := context.WithTimeout(ctx, signal)
			defer cancel()
			calls := map[string]error{
				"TryLock": m.TryLock(ctx),
				"Lock":    m.Lock(lctx),
				"Unlock":  holder.Unlock(ctx),
			}
			_, calls["Extend"] = holder.Extend(ctx, time.Minute)
			_, calls["Info"] = m.Info(ctx)
			_, calls["ForceUnlock"] = m.ForceUnlock(ctx)
			for call, err := range calls {
				if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
					t.Errorf("%s = %v, want WRONGTYPE", call, err)
				}
			}
			if after := dump(lockKey(name)); after != before {
				t.Errorf("the value changed under the calls")
			}
		})
	}
}

// TestRenewBatchNotALockRecord runs one watchdog batch over a held lock
// and locks whose keys hold the values of notRecords: each of those
// answers -1 (another type of value) for itself, and the held lock is
// renewed (1).
func TestRenewBatchNotALockRecord(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc := newScripts(t, client)
	renew, _ := sc.Script("mutex_renew_batch")
	l := newLocker(t, client, mutex.Options{})
	held := newMutex(t, l, "renewnotrecord:held")
	if err := held.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	keys := []string{lockKey(held.Name())}
	args := []string{"30000", held.Owner(), strconv.FormatInt(held.Token(), 10)}
	want := []int64{1}
	for _, tc := range notRecords {
		key := lockKey("renewnotrecord:" + tc.name)
		if err := client.Do(ctx, tc.write(client, key)).Error(); err != nil {
			t.Fatal(err)
		}
		keys, args, want = append(keys, key), append(args, "x", "1764350000000000"), append(want, -1)
	}
	got, err := renew.Exec(ctx, keys, args).AsIntSlice()
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("renewal answered %v, %v; want %v", got, err, want)
	}
}
