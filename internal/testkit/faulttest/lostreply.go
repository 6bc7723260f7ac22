package faulttest

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sluicekit/sluice/mutex"
)

// warm makes sure the proxied client's connection is up before a fault.
func warm(t *testing.T, m *mutex.Mutex) {
	t.Helper()
	if _, err := m.Info(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// retry calls f until it returns something other than a connection error.
// The connection reset that ends a lost reply reaches the client
// asynchronously, so the first call after it may still be written into the
// dead connection and fail; the API says such calls are safe to repeat, and
// that is what a caller does.
func retry(t *testing.T, f func(context.Context) error) error {
	t.Helper()
	for i := 0; ; i++ {
		err := f(context.Background())
		var ne net.Error
		if !errors.As(err, &ne) && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) || i == 5 {
			if i > 0 {
				t.Logf("succeeded after %d connection errors", i)
			}
			return err
		}
	}
}

// lostReplyCall runs call with its reply dropped by the proxy: the request
// reaches Redis and runs, the answer never comes back. It waits (on the
// direct connection) until ran reports that the request has taken effect,
// lets call time out, and then ends the fault, which resets the damaged
// connection. It returns call's error.
func lostReplyCall(t *testing.T, r *rig, call func(ctx context.Context) error, ran func() bool) error {
	t.Helper()
	r.proxy.DropReplies(true)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- call(ctx) }()
	received := false
	defer func() { // also when waitFor fails the test
		cancel()
		if !received {
			<-errc //nolint:errcheck // the test has failed already: wait for call to end
		}
		r.proxy.DropReplies(false)
	}()
	waitFor(t, "the request to run on the server", ran)
	cancel() // the caller gives up: no reply is coming
	err := <-errc
	received = true
	return err
}

// lostAcquireReply drops the reply of an outermost Lock.
//
// Pass criterion: never a lock that nobody believes it holds for longer
// than the lease. Either the owner finds its own hold (a later Lock by the
// same Mutex returns at once with the server's token), or the key expires
// within one lease of the request: its TTL is at most the lease, and a
// contender acquires no later than the lease after the lost request was
// sent (plus scheduling slack).
func lostAcquireReply(t *testing.T, newCache NewCache) {
	const lease = 500 * time.Millisecond
	for _, tc := range []struct {
		name string
		opts mutex.Options
	}{
		{"watchdog", mutex.Options{WatchdogLease: lease}},
		{"fixed", mutex.Options{Lease: lease}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, newCache)
			locks := newLocker(t, r.proxied(t, ClientOptions{Quiet: true}), tc.opts)
			other := newLocker(t, r.directCache(t), tc.opts)
			ctx := context.Background()

			t.Run("owner finds its hold", func(t *testing.T) {
				m := newMutex(t, locks, uniqueName(t))
				key := lockKey(m.Name())
				warm(t, m)
				err := lostReplyCall(t, r, m.Lock, func() bool {
					return lockField(t, r.direct, key, "o") == m.Owner()
				})
				if !errors.Is(err, mutex.ErrNotObtained) || !errors.Is(err, context.Canceled) {
					t.Fatalf("Lock with a lost reply: %v, want ErrNotObtained wrapping context.Canceled", err)
				}
				if m.Holds() != 0 {
					t.Fatalf("Holds() = %d after a failed Lock", m.Holds())
				}
				orphanToken, _ := strconv.ParseInt(lockField(t, r.direct, key, "f"), 10, 64)
				pttl, _ := do(t, r.direct, "PTTL", key).AsInt64()
				start := time.Now()
				if err := retry(t, m.Lock); err != nil {
					t.Fatalf("Lock after the lost reply: %v", err)
				}
				// Waiting out the orphan would take its remaining TTL.
				if d, left := time.Since(start), time.Duration(pttl)*time.Millisecond; pttl > 0 && d >= left {
					t.Errorf("Lock took %v, the orphaned hold had %v left: it waited out its own orphaned hold", d, left)
				}
				// Either the Lock found its own orphaned hold (same token), or
				// the Locker had already given the orphan back (the reset ended
				// the attempt with an unknown outcome) and this is a fresh
				// acquisition; both leave no lock that nobody knows of. The
				// client's token must be the server's either way.
				serverToken, _ := strconv.ParseInt(lockField(t, r.direct, key, "f"), 10, 64)
				if m.Token() != serverToken {
					t.Errorf("Token() = %d, server has %d: not the same acquisition", m.Token(), serverToken)
				}
				if m.Token() != orphanToken {
					t.Logf("the orphaned hold was given back before the next Lock")
				}
				if n := lockHolds(t, r.direct, key); n != 1 || m.Holds() != 1 {
					t.Errorf("server holds %d (%q), client %d; want 1 and 1", n, str(t, r.direct, "GET", key), m.Holds())
				}
				if err := m.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				if o := lockField(t, r.direct, key, "o"); o != "" {
					t.Errorf("still held by %q after Unlock", o)
				}
			})

			t.Run("nobody claims it", func(t *testing.T) {
				m := newMutex(t, locks, uniqueName(t))
				key := lockKey(m.Name())
				warm(t, m)
				sent := time.Now()
				_ = lostReplyCall(t, r, m.TryLock, func() bool { // its reply is lost: the outcome is what Redis shows
					return lockField(t, r.direct, key, "o") == m.Owner()
				})
				pttl, err := do(t, r.direct, "PTTL", key).AsInt64()
				if err != nil {
					t.Fatal(err)
				}
				if pttl < 0 || time.Duration(pttl)*time.Millisecond > lease {
					t.Fatalf("orphaned lock has PTTL %d ms; want at most the lease %v", pttl, lease)
				}
				c := newMutex(t, other, m.Name())
				lctx, cancel := context.WithTimeout(ctx, signalWait)
				defer cancel()
				if err := c.Lock(lctx); err != nil {
					t.Fatalf("contender: %v", err)
				}
				waited := time.Since(sent)
				// The contender wakes when the orphan's TTL runs out; allow
				// that timer and one round trip to be late on a loaded
				// machine (up to a lease). An orphan the watchdog kept
				// renewing would never be free.
				if slack := lease; waited > lease+slack {
					t.Errorf("contender got the lock %v after the lost request; want within the lease %v (+%v)", waited, lease, slack)
				}
				t.Logf("orphan PTTL %d ms; contender acquired %v after the lost request", pttl, waited.Round(time.Millisecond))
				if err := c.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				if m.Holds() != 0 {
					t.Errorf("the Mutex whose reply was lost believes it holds %d", m.Holds())
				}
			})
		})
	}
}

// lostUnlockReply drops the reply of Unlock and retries it.
//
// Pass criterion: a retried Unlock never removes two holds. With two holds,
// a lost reply and a retry leave exactly one (HGET n on the server), and the
// next Unlock frees the lock. A retried final Unlock whose first try did
// release the lock succeeds without touching the hold of the owner who took
// the lock in between.
func lostUnlockReply(t *testing.T, newCache NewCache) {
	const lease = time.Second
	r := newRig(t, newCache)
	locks := newLocker(t, r.proxied(t, ClientOptions{Quiet: true}), mutex.Options{WatchdogLease: lease})
	other := newLocker(t, r.directCache(t), mutex.Options{WatchdogLease: lease})
	ctx := context.Background()

	t.Run("nested", func(t *testing.T) {
		m := newMutex(t, locks, uniqueName(t))
		key := lockKey(m.Name())
		for range 2 {
			if err := m.Lock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		holds := func() int64 { return lockHolds(t, r.direct, key) }
		if n := holds(); n != 2 {
			t.Fatalf("server holds %d, want 2", n)
		}
		err := lostReplyCall(t, r, m.Unlock, func() bool { return holds() == 1 })
		if err == nil {
			t.Fatal("Unlock with a lost reply returned nil")
		}
		if m.Holds() != 2 {
			t.Fatalf("client counts %d holds after an Unlock without answer; want 2 (unknown outcome)", m.Holds())
		}
		if err := retry(t, m.Unlock); err != nil {
			t.Fatalf("retried Unlock: %v", err)
		}
		if n := holds(); n != 1 || m.Holds() != 1 {
			t.Fatalf("after the retry the server holds %d, the client %d; want exactly one removed (1, 1)", n, m.Holds())
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatalf("final Unlock: %v", err)
		}
		if o := lockField(t, r.direct, key, "o"); o != "" {
			t.Fatalf("still held by %q after the final Unlock", o)
		}
	})

	t.Run("final, taken over in between", func(t *testing.T) {
		m := newMutex(t, locks, uniqueName(t))
		key := lockKey(m.Name())
		if err := m.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		err := lostReplyCall(t, r, m.Unlock, func() bool { return lockField(t, r.direct, key, "o") == "" })
		if err == nil {
			t.Fatal("Unlock with a lost reply returned nil")
		}
		c := newMutex(t, other, m.Name())
		if err := c.TryLock(ctx); err != nil {
			t.Fatalf("another owner after the release: %v", err)
		}
		if err := retry(t, m.Unlock); err != nil {
			t.Fatalf("retried final Unlock: %v", err)
		}
		if m.Holds() != 0 {
			t.Errorf("client still counts %d holds", m.Holds())
		}
		if o, n := lockField(t, r.direct, key, "o"), c.Holds(); o != c.Owner() || n != 1 {
			t.Fatalf("the retry touched the new owner's hold: owner %q, holds %d", o, n)
		}
		if sn := lockHolds(t, r.direct, key); sn != 1 {
			t.Fatalf("server holds %d for the new owner, want 1", sn)
		}
		if err := c.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
