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

// FuzzRWAndMultiInput feeds arbitrary names, prefixes and leases to
// NewRWMutex and NewMultiMutex (names split at '\n') and, when accepted,
// takes and releases every kind of hold on miniredis. Nothing may panic,
// every refusal must be a documented error, and no key may be written
// outside the prefix.
//
// Plain go test replays the seeds; explore with
// go test -run=NONE -fuzz=FuzzRWAndMultiInput ./mutex
func FuzzRWAndMultiInput(f *testing.F) {
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
	f.Add("catalog", "", int64(0))
	f.Add("a\nb\na", "p:", int64(time.Second))
	f.Add("}x{\n~\n{a}", "", int64(0))
	f.Add("\n", "x{", int64(-1))
	f.Fuzz(func(t *testing.T, names, prefix string, leaseNs int64) {
		mr.FlushAll()
		l, err := mutex.NewLocker(sc, mutex.Options{Prefix: prefix, Lease: time.Duration(leaseNs)})
		if err != nil {
			if !errors.Is(err, mutex.ErrInvalidOptions) {
				t.Fatalf("NewLocker: %v, want ErrInvalidOptions", err)
			}
			return
		}
		defer l.Close()
		ctx := context.Background()
		set := strings.Split(names, "\n")
		if rw, err := l.NewRWMutex(set[0]); err != nil {
			if !errors.Is(err, mutex.ErrInvalidName) {
				t.Fatalf("NewRWMutex: %v, want ErrInvalidName", err)
			}
		} else {
			for _, step := range []func(context.Context) error{rw.TryLock, rw.TryRLock, rw.Unlock, rw.RUnlock, rw.TryRLock, rw.RUnlock} {
				if err := step(ctx); err != nil {
					t.Fatalf("hold on an empty server: %v", err)
				}
			}
		}
		if mm, err := l.NewMultiMutex(set); err != nil {
			if !errors.Is(err, mutex.ErrInvalidName) && !errors.Is(err, mutex.ErrInvalidOptions) {
				t.Fatalf("NewMultiMutex: %v, want ErrInvalidName or ErrInvalidOptions", err)
			}
		} else {
			if err := mm.TryLock(ctx); err != nil {
				t.Fatalf("TryLock of a set on an empty server: %v", err)
			}
			if err := mm.Unlock(ctx); err != nil {
				t.Fatalf("Unlock of a set: %v", err)
			}
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
