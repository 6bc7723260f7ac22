package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/semaphore"
)

// Examples run on miniredis so that they need no server; use a real Redis
// in production. Against miniredis the client needs DisableCache and
// AlwaysRESP2.
func exampleManager() (*semaphore.Manager, func()) {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  []string{mr.Addr()},
		DisableCache: true,
		AlwaysRESP2:  true,
	})
	if err != nil {
		log.Fatal(err)
	}
	sc, err := sluice.New(context.Background(), client)
	if err != nil {
		log.Fatal(err)
	}
	mgr, err := semaphore.NewManager(sc, semaphore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	return mgr, func() { mgr.Close(); client.Close(); mr.Close() }
}

// A pool of workers bounded fleet-wide: every process that runs this code
// against the same Redis shares the 3 permits of "fragile-upstream", so at
// most 3 calls to the upstream run at once however many processes and
// goroutines there are.
func Example_workerPool() {
	mgr, done := exampleManager()
	defer done()

	upstream, err := mgr.NewSemaphore("fragile-upstream", 3)
	if err != nil {
		log.Fatal(err)
	}
	var running, most, finished atomic.Int64
	callUpstream := func() {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(5 * time.Millisecond)
		running.Add(-1)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 8 { // 8 local workers, 20 jobs
		wg.Add(1)
		go func() {
			defer wg.Done()
			for finished.Load() < 20 {
				p, err := upstream.Acquire(ctx, 1)
				if err != nil {
					log.Print(err)
					return
				}
				if finished.Add(1) <= 20 {
					callUpstream()
				}
				if err := p.Release(ctx); err != nil {
					log.Print(err)
				}
			}
		}()
	}
	wg.Wait()
	fmt.Println("at most 3 at once:", most.Load() <= 3)
	free, err := upstream.Available(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("free afterwards:", free)
	// Output:
	// at most 3 at once: true
	// free afterwards: 3
}

func ExampleSemaphore_TryAcquire() {
	mgr, done := exampleManager()
	defer done()
	ctx := context.Background()

	sem, err := mgr.NewSemaphore("exports", 4)
	if err != nil {
		log.Fatal(err)
	}
	big, err := sem.Acquire(ctx, 3) // a heavy job takes 3 of the 4 permits
	if err != nil {
		log.Fatal(err)
	}
	if _, err := sem.TryAcquire(ctx, 2); errors.Is(err, semaphore.ErrNotObtained) {
		fmt.Println("2 permits: busy, try later")
	}
	small, err := sem.TryAcquire(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("1 permit: ok")
	small.Release(ctx)
	big.Release(ctx)
	if err := big.Release(ctx); errors.Is(err, semaphore.ErrNotHeld) {
		fmt.Println("second release: not held")
	}
	// Output:
	// 2 permits: busy, try later
	// 1 permit: ok
	// second release: not held
}

// A holder should stop work its permit bounds when the permit is lost (its
// lease ran out without renewal, or the keys were removed).
func ExamplePermit_Lost() {
	mgr, done := exampleManager()
	defer done()
	ctx := context.Background()

	sem, err := mgr.NewSemaphore("reindex", 1)
	if err != nil {
		log.Fatal(err)
	}
	p, err := sem.Acquire(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	defer p.Release(ctx)
	select {
	case <-p.Lost():
		fmt.Println("stop:", p.Err())
	case <-time.After(10 * time.Millisecond): // the work
		fmt.Println("work done with the permit held")
	}
	// Output:
	// work done with the permit held
}

// Resizing a semaphore whose permits are held: shrinking revokes nothing,
// but grants nothing until the permits held are fewer than the new
// capacity; growing frees permits at once. The set capacity applies to
// every process, whatever capacity its Semaphore was made with.
func ExampleSemaphore_SetCapacity() {
	mgr, done := exampleManager()
	defer done()
	ctx := context.Background()

	sem, err := mgr.NewSemaphore("batch-jobs", 4)
	if err != nil {
		log.Fatal(err)
	}
	a, _ := sem.Acquire(ctx, 2)
	b, _ := sem.Acquire(ctx, 2)
	show := func(when string) {
		free, err := sem.Available(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: %d free\n", when, free)
	}

	if err := sem.SetCapacity(ctx, 2); err != nil {
		log.Fatal(err)
	}
	show("shrunk to 2 with 4 held")
	a.Release(ctx)
	show("2 held")
	b.Release(ctx)
	show("none held")

	if err := sem.SetCapacity(ctx, 6); err != nil {
		log.Fatal(err)
	}
	big, err := sem.TryAcquire(ctx, 5) // more than the 4 it was made with
	fmt.Println("took 5 after growing to 6:", err == nil)
	big.Release(ctx)
	// Output:
	// shrunk to 2 with 4 held: 0 free
	// 2 held: 0 free
	// none held: 2 free
	// took 5 after growing to 6: true
}

// Do takes permits, runs the work with a context that ends if they are
// lost, and gives them back, reporting a loss even if the work succeeded.
func ExampleSemaphore_Do() {
	mgr, done := exampleManager()
	defer done()
	ctx := context.Background()

	sem, err := mgr.NewSemaphore("transcoders", 4)
	if err != nil {
		log.Fatal(err)
	}
	err = sem.Do(ctx, 2, func(ctx context.Context) error {
		// ctx ends if the permits are lost: pass it to everything the
		// work does.
		free, _ := sem.Available(ctx)
		fmt.Println("free while working:", free)
		return nil
	})
	if errors.Is(err, semaphore.ErrLost) {
		fmt.Println("the work ran, at least in part, without its permits")
	}
	free, _ := sem.Available(ctx)
	fmt.Println("done:", err, "free after:", free)
	// Output:
	// free while working: 2
	// done: <nil> free after: 4
}

// Labelling permits with their owner tells an operator who holds what.
func ExampleWithOwner() {
	mgr, done := exampleManager()
	defer done()
	ctx := context.Background()

	sem, err := mgr.NewSemaphore("gpu", 2, semaphore.WithOwner("trainer-7"))
	if err != nil {
		log.Fatal(err)
	}
	p, err := sem.Acquire(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	defer p.Release(ctx)
	holders, err := sem.Holders(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, h := range holders {
		fmt.Println(h.Owner, h.Weight, h.ID == p.ID())
	}
	// Output:
	// trainer-7 1 true
}

// Info tells, in one call, how a semaphore is used: the capacity, the
// permits held and free, and the fair waiters queued.
func ExampleSemaphore_Info() {
	mgr, done := exampleManager()
	defer done()
	ctx := context.Background()

	sem, err := mgr.NewSemaphore("imports", 5)
	if err != nil {
		log.Fatal(err)
	}
	p, err := sem.Acquire(ctx, 3)
	if err != nil {
		log.Fatal(err)
	}
	defer p.Release(ctx)
	in, err := sem.Info(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("capacity %d, used %d, available %d, holders %d, queued %d\n",
		in.Capacity, in.Used, in.Available, in.Holders, in.Queued)
	// Output:
	// capacity 5, used 3, available 2, holders 1, queued 0
}

// Before a write that must not happen without the permit, Valid asks, by
// this process's clock, whether its lease is still on: a process resumed
// after a pause longer than the lease gets false at once, before the
// watchdog has run and closed Lost.
func ExamplePermit_Valid() {
	mgr, done := exampleManager()
	defer done()
	ctx := context.Background()

	sem, err := mgr.NewSemaphore("exporter", 1)
	if err != nil {
		log.Fatal(err)
	}
	p, err := sem.Acquire(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	if p.Valid() {
		fmt.Println("writing; more than 20 s of lease left:", time.Until(p.HeldUntil()) > 20*time.Second)
	}
	p.Release(ctx)
	fmt.Println("after Release:", p.Valid())
	// Output:
	// writing; more than 20 s of lease left: true
	// after Release: false
}
