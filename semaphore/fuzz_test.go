package semaphore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// FuzzSemaphoreInput feeds arbitrary names, prefixes, capacities, weights
// and leases to the constructors and, when accepted, sets the capacity to
// the weight, acquires and releases on a real Redis, fair or not. Nothing may panic, every refusal must be a documented
// error, and no key may be written outside the prefix.
//
// Plain go test replays the seed corpus in testdata/fuzz; explore with
// go test -run=NONE -fuzz=FuzzSemaphoreInput ./semaphore
func FuzzSemaphoreInput(f *testing.F) {
	srv := redistest.NewServer(f)
	client := redistest.Client(f, srv.Addr())
	sc, err := scriptcache.New(context.Background(), client)
	if err != nil {
		f.Fatal(err)
	}
	f.Add("workers", "", int64(5), int64(1), int64(0), false)
	f.Add("", "p:", int64(0), int64(0), int64(time.Second), false)
	f.Add("fair", "", int64(3), int64(7), int64(0), true)
	f.Fuzz(func(t *testing.T, name, prefix string, capacity, n, leaseNs int64, fair bool) {
		ctx := context.Background()
		srv.Do("FLUSHALL")
		mgr, err := semaphore.NewManager(sc, semaphore.Options{Prefix: prefix, Lease: time.Duration(leaseNs), Fair: fair})
		if err != nil {
			if !errors.Is(err, semaphore.ErrInvalidOptions) {
				t.Fatalf("NewManager: %v, want ErrInvalidOptions", err)
			}
			return
		}
		defer mgr.Close()
		sem, err := mgr.NewSemaphore(name, capacity)
		if err != nil {
			if !errors.Is(err, semaphore.ErrInvalidName) && !errors.Is(err, semaphore.ErrInvalidCapacity) {
				t.Fatalf("NewSemaphore: %v, want ErrInvalidName or ErrInvalidCapacity", err)
			}
			return
		}
		if n%2 == 0 {
			// Half the inputs resize first: the weight is then the capacity.
			if err := sem.SetCapacity(ctx, n); err != nil {
				if !errors.Is(err, semaphore.ErrInvalidCapacity) {
					t.Fatalf("SetCapacity(%d): %v, want ErrInvalidCapacity", n, err)
				}
				return
			}
		}
		p, err := sem.TryAcquire(ctx, n)
		if err != nil {
			if !errors.Is(err, semaphore.ErrInvalidWeight) {
				t.Fatalf("TryAcquire(%d) of %d on an empty semaphore: %v", n, capacity, err)
			}
			return
		}
		if err := p.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if prefix == "" {
			prefix = semaphore.DefaultPrefix
		}
		keys, err := client.Do(ctx, client.B().Keys().Pattern("*").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if !strings.HasPrefix(k, prefix) {
				t.Fatalf("key %q outside the prefix %q", k, prefix)
			}
		}
	})
}
