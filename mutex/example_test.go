package mutex_test

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/mutex"
)

// The quick start of the README. Against a real Redis the client needs no
// special options; miniredis needs DisableCache and AlwaysRESP2.
func Example() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	client, _ := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{mr.Addr()}, DisableCache: true, AlwaysRESP2: true,
	})
	defer client.Close()

	ctx := context.Background()
	sc, err := sluice.New(ctx, client)
	if err != nil {
		panic(err)
	}
	locks, err := mutex.NewLocker(sc, mutex.Options{}) // 30 s lease renewed by a watchdog
	if err != nil {
		panic(err)
	}
	defer locks.Close()

	m, _ := locks.NewMutex("order:42")
	if err := m.Lock(ctx); err != nil {
		panic(err)
	}
	fmt.Println("held, token > 0:", m.Token() > 0)

	other, _ := locks.NewMutex("order:42")
	err = other.TryLock(ctx)
	fmt.Println("other owner:", errors.Is(err, mutex.ErrNotObtained))

	if err := m.Unlock(ctx); err != nil {
		panic(err)
	}
	fmt.Println("other after unlock:", other.TryLock(ctx))
	other.Unlock(ctx)
	// Output:
	// held, token > 0: true
	// other owner: true
	// other after unlock: <nil>
}

// inventory stands for the storage the lock protects. It remembers the
// highest fencing token it has seen and refuses writes with a lower one, so
// a holder that lost the lock without noticing (a long GC pause, a
// partition) cannot overwrite a newer holder's work.
type inventory struct {
	mu        sync.Mutex
	stock     int
	lastToken int64
}

var errStaleToken = errors.New("inventory: stale fencing token")

func (inv *inventory) read() int {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return inv.stock
}

func (inv *inventory) write(token int64, stock int) error {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if token < inv.lastToken {
		return errStaleToken
	}
	inv.lastToken, inv.stock = token, stock
	return nil
}

// Guarding an inventory decrement: buyers take the lock, check the stock,
// and write the new stock with their fencing token.
func Example_inventory() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	client, _ := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{mr.Addr()}, DisableCache: true, AlwaysRESP2: true,
	})
	defer client.Close()
	ctx := context.Background()
	sc, _ := sluice.New(ctx, client)
	locks, _ := mutex.NewLocker(sc, mutex.Options{})
	defer locks.Close()

	inv := &inventory{stock: 5}
	buy := func() (bool, error) {
		m, _ := locks.NewMutex("sku:1234")
		if err := m.Lock(ctx); err != nil {
			return false, err
		}
		defer m.Unlock(ctx)
		stock := inv.read()
		if stock == 0 {
			return false, nil
		}
		// By this process's own clock, is the lease still on? A process
		// paused past it (GC, SIGSTOP) learns it here at once; the token
		// refuses a write delayed after the check.
		if !m.Valid() {
			return false, errors.New("lease over before the write")
		}
		return true, inv.write(m.Token(), stock-1)
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	sold := 0
	for range 8 {
		wg.Go(func() {
			ok, err := buy()
			if err != nil {
				fmt.Println(err)
				return
			}
			if ok {
				mu.Lock()
				sold++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fmt.Println("sold:", sold, "left:", inv.read())

	// A holder with an old token is refused.
	fmt.Println(inv.write(1, 100))
	// Output:
	// sold: 5 left: 0
	// inventory: stale fencing token
}

// Do runs a function under the lock, with a context that ends if the lock
// is lost, and unlocks afterwards.
func ExampleMutex_Do() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	client, _ := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{mr.Addr()}, DisableCache: true, AlwaysRESP2: true,
	})
	defer client.Close()
	ctx := context.Background()
	sc, _ := sluice.New(ctx, client)
	locks, _ := mutex.NewLocker(sc, mutex.Options{})
	defer locks.Close()

	m, _ := locks.NewMutex("report:daily")
	err := m.Do(ctx, func(ctx context.Context) error {
		// ctx ends if the lock is lost: pass it to everything the work does.
		fmt.Println("working under the lock:", m.Holds() == 1)
		return nil
	})
	fmt.Println("done:", err, "held after:", m.Holds())
	// Output:
	// working under the lock: true
	// done: <nil> held after: 0
}

// HeldUntil tells, by this process's clock, until when the hold is sure to
// last: a write bounded by it does not outlive the lease, and a process
// resumed after a pause longer than the lease finds it already past, before
// the watchdog has run and closed Lost.
func ExampleMutex_HeldUntil() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	client, _ := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{mr.Addr()}, DisableCache: true, AlwaysRESP2: true,
	})
	defer client.Close()
	ctx := context.Background()
	sc, _ := sluice.New(ctx, client)
	locks, _ := mutex.NewLocker(sc, mutex.Options{})
	defer locks.Close()

	m, _ := locks.NewMutex("ledger")
	if err := m.Lock(ctx); err != nil {
		panic(err)
	}
	wctx, cancel := context.WithDeadline(ctx, m.HeldUntil())
	defer cancel()
	_ = wctx // the write to storage runs under wctx, with m.Token()
	fmt.Println("may write:", m.Valid())
	m.Unlock(ctx)
	fmt.Println("after Unlock:", m.Valid(), m.HeldUntil().IsZero())
	// Output:
	// may write: true
	// after Unlock: false true
}
