package mutex_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// FuzzMutexInput feeds arbitrary names, prefixes, owner ids and leases to
// the constructors and, when they are accepted, locks and unlocks on
// miniredis. Nothing may panic, every refusal must be one of the documented
// errors, and no key may be written outside the prefix.
//
// Plain go test replays the seed corpus in testdata/fuzz; explore with
// go test -run=NONE -fuzz=FuzzMutexInput ./mutex
func FuzzMutexInput(f *testing.F) {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		f.Fatal(err)
	}
	defer mr.Close()
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true, AlwaysRESP2: true})
	if err != nil {
		f.Fatal(err)
	}
	defer client.Close()
	sc, err := scriptcache.New(context.Background(), client)
	if err != nil {
		f.Fatal(err)
	}
	f.Add("order:42", "", "", int64(0))
	f.Add("", "p:", "owner", int64(time.Second))
	f.Add("{a}b}", "x{", "", int64(-1))
	f.Fuzz(func(t *testing.T, name, prefix, owner string, leaseNs int64) {
		mr.FlushAll()
		l, err := mutex.NewLocker(sc, mutex.Options{Prefix: prefix, Lease: time.Duration(leaseNs)})
		if err != nil {
			if !errors.Is(err, mutex.ErrInvalidOptions) {
				t.Fatalf("NewLocker: %v, want ErrInvalidOptions", err)
			}
			return
		}
		defer l.Close()
		var opts []mutex.LockOption
		if owner != "" {
			opts = append(opts, mutex.WithOwner(owner))
		}
		m, err := l.NewMutex(name, opts...)
		if err != nil {
			if !errors.Is(err, mutex.ErrInvalidName) && !errors.Is(err, mutex.ErrInvalidOptions) {
				t.Fatalf("NewMutex: %v, want ErrInvalidName or ErrInvalidOptions", err)
			}
			return
		}
		ctx := context.Background()
		if err := m.TryLock(ctx); err != nil {
			t.Fatalf("TryLock on an empty server: %v", err)
		}
		if err := m.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		if prefix == "" {
			prefix = mutex.DefaultPrefix
		}
		for _, k := range mr.Keys() {
			if !strings.HasPrefix(k, prefix) {
				t.Fatalf("key %q outside the prefix %q", k, prefix)
			}
		}
	})
}
