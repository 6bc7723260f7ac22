package mutex_test

// Regression tests for the losses an independent review found erased,
// reported late or answered with a reused token (issue 10).

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

func lockKey(name string) string { return mutex.DefaultPrefix + "{" + name + "}" }

// lockScriptKeys are the KEYS of mutex_lock and mutex_release for a name.
type lockScriptKeys struct{ lock, release []string }

func scriptKeys(name string) lockScriptKeys {
	k := lockKey(name)
	return lockScriptKeys{
		lock:    []string{k, k + ":x", k + ":q", k + ":e"},
		release: []string{k, k + ":w", k + ":q", k + ":e", k + ":x"},
	}
}

// lockArgs are mutex_lock's ARGV for an outermost attempt (mode "", "f",
// "t" or "w"), as package mutex sends them.
func lockArgs(owner, leaseMs, attempt, mode string) []string {
	if mode == "" {
		return []string{leaseMs, owner, attempt}
	}
	return []string{leaseMs, owner, attempt, mode}
}

// lockAnswer returns mutex_lock's reply in one shape: {1, holds, token}
// for a new acquisition, {2, holds, token} when the attempt held it
// already, {0, wait or code, 0} when refused.
func lockAnswer(r scriptcache.Reply) ([]int64, error) {
	if err := r.Error(); err != nil {
		return nil, err
	}
	if v, err := r.AsInt64(); err == nil {
		if v > 0 {
			return []int64{1, 1, v}, nil
		}
		return []int64{0, -1 - v, 0}, nil
	}
	return r.AsIntSlice()
}

// execLock runs an outermost attempt of owner (see lockArgs) and returns
// lockAnswer's shape.
func execLock(ctx context.Context, lock *scriptcache.Script, keys []string, owner, leaseMs, attempt, mode string) ([]int64, error) {
	return lockAnswer(lock.Exec(ctx, keys, lockArgs(owner, leaseMs, attempt, mode)))
}

// unlockArgs, giveBackArgs and forceArgs are mutex_release's ARGV for an
// Unlock, a give-back and ForceUnlock (PUBLISH; the record kept 1 s).
func unlockArgs(owner string, holds, token int64) []string {
	args := []string{"u", "1000", owner, strconv.FormatInt(token, 10)}
	if holds > 1 {
		args = append(args, strconv.FormatInt(holds, 10))
	}
	return args
}

func giveBackArgs(owner, attempt, leaseMs string) []string {
	return []string{"a", "1000", owner, attempt, leaseMs}
}

func forceArgs() []string { return []string{"f", "1000"} }

// lockRecord is a lock's record (see mutex_lock) by field: f, c, n, a and
// o as stored (n, a and o absent when free), k the flags q and x (in that
// order), w "1" if k has w.
// ok is false if there is no record, or the key holds something else.
func lockRecord(v string) (rec map[string]string, ok bool) {
	if !validRecord(v) {
		return nil, false
	}
	head, hold, _ := strings.Cut(v[1:], "|")
	kfc := strings.SplitN(head, ":", 3)
	rec = map[string]string{"f": kfc[1], "c": kfc[2]}
	if hold != "" {
		nao := strings.SplitN(hold, ":", 3)
		rec["n"], rec["a"], rec["o"] = nao[0], nao[1], nao[2]
	}
	for _, flag := range "qx" {
		if strings.ContainsRune(kfc[0], flag) {
			rec["k"] += string(flag)
		}
	}
	if strings.ContainsRune(kfc[0], 'w') {
		rec["w"] = "1"
	}
	return rec, true
}

// validRecord reports whether v is a lock record, as mutex_lock's
// pattern reads one.
func validRecord(v string) bool { return recordPattern.MatchString(v) }

var recordPattern = regexp.MustCompile(`(?s)^L[a-z]*:[0-9]+:[0-9 ]*\|([0-9]+:[^:]+:.+)?$`)

// recordField reads field f of the record of the lock key (see
// lockRecord; "" if there is none).
func recordField(t testing.TB, client rueidis.Client, key, f string) string {
	t.Helper()
	v, err := client.Do(context.Background(), client.B().Get().Key(key).Build()).ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		t.Fatal(err)
	}
	rec, _ := lockRecord(v)
	return rec[f]
}

// keepKeyAfterClientLoss takes m (with a fixed lease of a second: the
// PEXPIRE must come before it ends, even on a loaded machine) and stretches
// the key's TTL on the server, then waits until the client declares the hold
// lost: the state a fixed lease's loss margin or a renewal whose reply came
// late leaves, made deterministic.
func keepKeyAfterClientLoss(t *testing.T, srv *redistest.Server, m *mutex.Mutex) int64 {
	t.Helper()
	ctx := context.Background()
	if err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	token := m.Token()
	if n, err := srv.Do("PEXPIRE", lockKey(m.Name()), "60000"); err != nil || n != "1" {
		t.Fatalf("PEXPIRE = %q, %v", n, err)
	}
	select {
	case <-m.Lost():
	case <-time.After(signal):
		t.Fatal("the fixed lease did not end on the client")
	}
	if !errors.Is(m.Err(), mutex.ErrLost) {
		t.Fatalf("Err() = %v, want ErrLost", m.Err())
	}
	return token
}

// TestTokenNotReusedAfterLoss: a hold declared lost while the server still
// keeps it under the same owner must not hand its token out again. The
// Mutex that lost it refuses to Lock until its Unlock (which gives the
// orphan back); another Mutex value of the same owner meets the server's
// stale hold.
func TestTokenNotReusedAfterLoss(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{})
	m := newMutex(t, l, "reuse", mutex.WithLease(time.Second))
	old := keepKeyAfterClientLoss(t, srv, m)
	if err := m.Lock(ctx); !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("Lock after a loss, before Unlock = %v, want ErrLost", err)
	}
	m2 := newMutex(t, l, "reuse", mutex.WithLease(time.Second), mutex.WithOwner(m.Owner()))
	if err := m2.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if m2.Token() <= old {
		t.Fatalf("token after the loss = %d, want greater than the lost hold's %d", m2.Token(), old)
	}
	if info, _ := m2.Info(ctx); info.Token != m2.Token() || info.Holds != 1 {
		t.Fatalf("Info = %+v, want token %d with 1 hold", info, m2.Token())
	}
	if err := m2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestUnlockAfterLossGivesBackOrphan: Unlock after a loss reports
// ErrNotHeld, and releases what the server still keeps of the lost hold
// instead of leaving it to block others for the rest of its lease.
func TestUnlockAfterLossGivesBackOrphan(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	l := newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{})
	m := newMutex(t, l, "orphan", mutex.WithLease(time.Second))
	keepKeyAfterClientLoss(t, srv, m)
	if err := m.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) || !errors.Is(err, mutex.ErrLost) {
		t.Fatalf("Unlock after loss = %v, want ErrNotHeld wrapping ErrLost", err)
	}
	if info, err := m.Info(ctx); err != nil || info.Held {
		t.Fatalf("Info after Unlock = %+v, %v; want the orphaned hold released", info, err)
	}
	other := newMutex(t, l, "orphan")
	if err := other.TryLock(ctx); err != nil {
		t.Fatalf("another owner's TryLock = %v, want the lock free", err)
	}
	// A second Unlock does nothing more (and must not touch other's hold).
	if err := m.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Fatalf("second Unlock = %v, want ErrNotHeld", err)
	}
	if info, _ := other.Info(ctx); info.Owner != other.Owner() {
		t.Fatalf("Info = %+v, want held by the other owner", info)
	}
	other.Unlock(ctx)
}

// TestTakeoverWithSameOwner: a second Mutex with the same owner id (the
// documented WithOwner takeover after a restart, when the old process was
// only paused) gets a new, greater token, and the old holder is told it
// lost the lock instead of renewing it as its own.
func TestTakeoverWithSameOwner(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	// Renewals every 200 ms find the takeover soon; each has 340 ms to
	// come back, so the new holder keeps its lock on a loaded machine.
	opts := mutex.Options{WatchdogLease: 600 * time.Millisecond}
	oldProc, newProc := newLocker(t, client, opts), newLocker(t, client, opts)
	a := newMutex(t, oldProc, "takeover:"+t.Name(), mutex.WithOwner("worker-7"))
	b := newMutex(t, newProc, "takeover:"+t.Name(), mutex.WithOwner("worker-7"))
	if err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Token() <= a.Token() {
		t.Fatalf("takeover token %d, want greater than the old holder's %d", b.Token(), a.Token())
	}
	select {
	case <-a.Lost():
	case <-time.After(signal):
		t.Fatal("the old holder was not told of the takeover")
	}
	if !errors.Is(a.Err(), mutex.ErrLost) {
		t.Fatalf("old holder's Err() = %v, want ErrLost", a.Err())
	}
	if err := a.Unlock(ctx); !errors.Is(err, mutex.ErrNotHeld) {
		t.Fatalf("old holder's Unlock = %v, want ErrNotHeld", err)
	}
	if info, _ := b.Info(ctx); !info.Held || info.Token != b.Token() {
		t.Fatalf("Info = %+v, want still held with token %d", info, b.Token())
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestNestedLockAfterTakeover: the outer hold is released behind the
// holder's back and another owner takes the lock. A nested Lock must report
// the loss at once, not wait and then return nil as if it had nested.
func TestNestedLockAfterTakeover(t *testing.T) {
	ctx := context.Background()
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			l := newLocker(t, clientFor(t, tg), mutex.Options{})
			name := "nested-takeover:" + t.Name()
			m, other := newMutex(t, l, name), newMutex(t, l, name)
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
			lost := m.Lost()
			if ok, err := other.ForceUnlock(ctx); err != nil || !ok {
				t.Fatalf("ForceUnlock = %v, %v", ok, err)
			}
			if err := other.TryLock(ctx); err != nil {
				t.Fatal(err)
			}
			// Far shorter than the 30 s lease the old code would wait out,
			// far longer than one round trip on a loaded machine.
			lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if err := m.Lock(lctx); !errors.Is(err, mutex.ErrLost) {
				t.Fatalf("nested Lock after a takeover = %v (holds %d), want ErrLost", err, m.Holds())
			}
			select {
			case <-lost:
			default:
				t.Fatal("Lost not closed")
			}
			if m.Holds() != 0 || m.Token() != 0 {
				t.Fatalf("Holds %d, Token %d; want 0, 0", m.Holds(), m.Token())
			}
			if info, _ := other.Info(ctx); info.Owner != other.Owner() || info.Holds != 1 {
				t.Fatalf("Info = %+v, want the other owner's single hold untouched", info)
			}
			other.Unlock(ctx)
		})
	}
}

// TestNoLossAfterCleanUnlock: with renewals every 10 ms, some land just
// after a release and find the key gone. A successful Unlock must never be
// followed by a loss signal for the hold it released.
func TestNoLossAfterCleanUnlock(t *testing.T) {
	ctx := context.Background()
	// Renewals every 20 ms, each with 34 ms to come back before the client
	// gives the lease up: short enough for releases to meet renewals often,
	// long enough that a loaded machine still unlocks cleanly most times.
	l := newLocker(t, redistest.Client(t, redistest.Single(t).Addr()), mutex.Options{WatchdogLease: 60 * time.Millisecond})
	m := newMutex(t, l, "clean-unlock")
	clean := 0
	for i := range 300 {
		if err := m.Lock(ctx); err != nil {
			continue // a false loss under load is another matter
		}
		lost := m.Lost()
		// Hold across about one renewal period so releases meet renewals.
		time.Sleep(time.Duration(i%22) * time.Millisecond)
		if err := m.Unlock(ctx); err != nil {
			continue
		}
		clean++
		if err := m.Err(); err != nil {
			t.Fatalf("cycle %d: Unlock returned nil, then Err() = %v", i, err)
		}
		select {
		case <-lost:
			t.Fatalf("cycle %d: Lost closed after a clean Unlock", i)
		default:
		}
	}
	if clean < 30 {
		t.Fatalf("only %d of 300 cycles unlocked cleanly; the test did not exercise the race", clean)
	}
}

// TestStaleAttemptCannotRetag runs the lock and give-back scripts in the
// order a late abandoned attempt produces: attempt 2 of a Mutex holds the
// lock when its abandoned attempt 1 arrives. Attempt 1 must be refused, so
// that the give-back of attempt 1 leaves attempt 2's hold alone.
func TestStaleAttemptCannotRetag(t *testing.T) {
	ctx := context.Background()
	client := redistest.Client(t, redistest.Single(t).Addr())
	sc := newScripts(t, client)
	lock, _ := sc.Script("mutex_lock")
	release, _ := sc.Script("mutex_release")
	keys := scriptKeys("retag")
	attempt := func(id string) []int64 {
		vs, err := execLock(ctx, lock, keys.lock[:3], "owner", "30000", id, "")
		if err != nil {
			t.Fatal(err)
		}
		return vs
	}
	if got := attempt("n0nce.2"); got[0] != 1 {
		t.Fatalf("attempt 2 = %v, want granted", got)
	}
	if got := attempt("n0nce.1"); got[0] != 0 {
		t.Fatalf("late attempt 1 = %v, want refused while attempt 2 holds", got)
	}
	if n, _ := release.Exec(ctx, keys.release, giveBackArgs("owner", "n0nce.1", "30000")).AsInt64(); n != 0 {
		t.Fatalf("give-back of attempt 1 released %d holds, want 0", n)
	}
	if o, a := recordField(t, client, keys.lock[0], "o"), recordField(t, client, keys.lock[0], "a"); o != "owner" || a != "n0nce.2" {
		t.Fatalf("record held by %q under %q, want held by attempt 2", o, a)
	}
	// Another value of the same owner (a restart with WithOwner) is not
	// ordered against this one: it takes over with a new token.
	before := attempt("n0nce.2")[2]
	if got := attempt("0ther.1"); got[0] != 1 || got[2] <= before {
		t.Fatalf("takeover by another value = %v, want granted with a token above %d", got, before)
	}
}

// TestGiveBackBeforeAttempt: the give-back of an abandoned attempt is sent
// without waiting for the attempt's reply, so it may reach Redis first. Its
// tombstone must make the attempt refuse itself when it arrives, while the
// same Mutex's next attempt still gets the lock.
func TestGiveBackBeforeAttempt(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Single(t)
	sc, err := scriptcache.New(ctx, redistest.Client(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	lock, _ := sc.Script("mutex_lock")
	release, _ := sc.Script("mutex_release")
	keys := scriptKeys("tomb")
	attempt := func(id string) []int64 {
		vs, err := execLock(ctx, lock, keys.lock[:3], "owner", "30000", id, "")
		if err != nil {
			t.Fatal(err)
		}
		return vs
	}
	if n, err := release.Exec(ctx, keys.release, giveBackArgs("owner", "v.5", "30000")).AsInt64(); err != nil || n != 0 {
		t.Fatalf("give-back before its attempt = %d, %v; want 0 (nothing held yet)", n, err)
	}
	if got := attempt("v.5"); got[0] != 0 {
		t.Fatalf("abandoned attempt v.5 arriving after its give-back = %v, want refused", got)
	}
	if ex, _ := srv.Do("EXISTS", keys.lock[0]); ex != "0" {
		t.Fatalf("lock record exists after refused attempts (%s), want the lock free", ex)
	}
	if pttl, _ := srv.Do("PTTL", keys.lock[1]); pttl == "-1" || pttl == "-2" {
		t.Fatalf("tombstones PTTL = %s, want them to expire", pttl)
	}
	if got := attempt("v.6"); got[0] != 1 {
		t.Fatalf("the next attempt of the same Mutex = %v, want granted", got)
	}
	// The tombstone names v.5 alone: v.4, another goroutine's Lock of the
	// same Mutex that was not given back, is refused only because v.6
	// holds the lock now (an older attempt of the value), not for ever.
	if got := attempt("v.4"); got[0] != 0 {
		t.Fatalf("v.4 while v.6 holds = %v, want refused", got)
	}
}

// TestReplicaAcksHonoursContext: with ReplicaAcks, Lock on a server that
// stopped answering returns when its context ends, and the grant the server
// makes when it wakes is given back rather than held for the lease.
func TestReplicaAcksHonoursContext(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	client := redistest.Client(t, srv.Addr())
	l := newLocker(t, client, mutex.Options{ReplicaAcks: 1, ReplicaTimeout: 20 * time.Millisecond})
	m := newMutex(t, l, "acks-ctx")
	if err := m.TryLock(ctx); !errors.Is(err, mutex.ErrNotReplicated) { // opens the connections
		t.Fatalf("TryLock = %v, want ErrNotReplicated", err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	start := time.Now()
	err := m.Lock(short)
	elapsed := time.Since(start)
	cancel()
	if rerr := srv.Resume(); rerr != nil {
		t.Fatal(rerr)
	}
	if !errors.Is(err, mutex.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock on a paused server = %v, want ErrNotObtained and DeadlineExceeded", err)
	}
	// The server stayed paused until Lock returned; the bound only tells the
	// 200 ms context from the call's own bound (WAIT's timeout plus 5 s).
	if elapsed > 2500*time.Millisecond {
		t.Fatalf("Lock returned after %v, want soon after its 200 ms context", elapsed)
	}
	plain := newMutex(t, newLocker(t, client, mutex.Options{}), "acks-ctx")
	lctx, cancel := context.WithTimeout(ctx, signal)
	defer cancel()
	if err := plain.Lock(lctx); err != nil {
		t.Fatalf("the late grant was not given back: %v", err)
	}
	plain.Unlock(ctx)
}

// TestSubscribeRefused: a Redis 7 ACL user without channel permissions gets
// NOPERM for SUBSCRIBE. A Lock that has to wait must say so, not poll at
// the pace of the holder's 30 s lease.
func TestSubscribeRefused(t *testing.T) {
	ctx := context.Background()
	srv := redistest.NewServer(t)
	if _, err := srv.Do("ACL", "SETUSER", "nochannels", "on", ">pw", "~*", "+@all", "resetchannels"); err != nil {
		t.Fatal(err)
	}
	holder := newMutex(t, newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{}), "acl")
	if err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	limited, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, Username: "nochannels", Password: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer limited.Close()
	waiter := newMutex(t, newLocker(t, limited, mutex.Options{}), "acl")
	lctx, cancel := context.WithTimeout(ctx, signal)
	defer cancel()
	if err := waiter.Lock(lctx); !errors.Is(err, mutex.ErrSubscribe) || errors.Is(err, mutex.ErrNotObtained) {
		t.Fatalf("Lock by a user without channels = %v, want ErrSubscribe (not a timeout)", err)
	}
	holder.Unlock(ctx)
}
