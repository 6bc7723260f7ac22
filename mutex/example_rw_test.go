package mutex_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/mutex"
)

// exampleLocker starts a miniredis and returns a Locker on it and a
// function that closes all three.
func exampleLocker() (*mutex.Locker, func()) {
	mr, _ := miniredis.Run()
	client, _ := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{mr.Addr()}, DisableCache: true, AlwaysRESP2: true,
	})
	sc, err := sluice.New(context.Background(), client)
	if err != nil {
		panic(err)
	}
	locks, err := mutex.NewLocker(sc, mutex.Options{})
	if err != nil {
		panic(err)
	}
	return locks, func() { locks.Close(); client.Close(); mr.Close() }
}

// Readers share a read-write lock; a writer waits until they are gone and
// then excludes everyone.
func ExampleRWMutex() {
	locks, done := exampleLocker()
	defer done()
	ctx := context.Background()

	r1, _ := locks.NewRWMutex("catalog")
	r2, _ := locks.NewRWMutex("catalog")
	w, _ := locks.NewRWMutex("catalog")

	fmt.Println("reader 1:", r1.RLock(ctx))
	fmt.Println("reader 2:", r2.RLock(ctx))
	fmt.Println("writer under readers:", errors.Is(w.TryLock(ctx), mutex.ErrNotObtained))

	r1.RUnlock(ctx)
	r2.RUnlock(ctx)
	fmt.Println("writer:", w.Lock(ctx), "token > 0:", w.Token() > 0)
	fmt.Println("reader under the writer:", errors.Is(r1.TryRLock(ctx), mutex.ErrNotObtained))
	w.Unlock(ctx)
	// Output:
	// reader 1: <nil>
	// reader 2: <nil>
	// writer under readers: true
	// writer: <nil> token > 0: true
	// reader under the writer: true
}

// A writer may take read holds and keep them after its Unlock: the lock
// is downgraded without a writer slipping in between. The opposite, an
// upgrade, is refused at once because two readers doing it would deadlock.
func ExampleRWMutex_downgrade() {
	locks, done := exampleLocker()
	defer done()
	ctx := context.Background()

	rw, _ := locks.NewRWMutex("report")
	other, _ := locks.NewRWMutex("report")
	writer, _ := locks.NewRWMutex("report")

	rw.Lock(ctx)
	// ... write the report ...
	rw.RLock(ctx) // allowed while writing
	rw.Unlock(ctx)
	// ... read it back: other readers may join, writers may not ...
	fmt.Println("other reader:", other.TryRLock(ctx))
	fmt.Println("other writer refused:", errors.Is(writer.TryLock(ctx), mutex.ErrNotObtained))
	other.RUnlock(ctx)

	fmt.Println("upgrade refused:", errors.Is(rw.Lock(ctx), mutex.ErrUpgrade))
	rw.RUnlock(ctx)
	// Output:
	// other reader: <nil>
	// other writer refused: true
	// upgrade refused: true
}

// A transfer locks both accounts. Whatever order processes list them in,
// they are locked in one canonical order, so two opposite transfers
// cannot deadlock; and each account is an ordinary lock, so a Mutex of
// one of them waits for the transfer.
func ExampleMultiMutex() {
	locks, done := exampleLocker()
	defer done()
	ctx := context.Background()

	transfer, err := locks.NewMultiMutex([]string{"account:bob", "account:alice"})
	if err != nil {
		panic(err)
	}
	if err := transfer.Lock(ctx); err != nil {
		panic(err)
	}
	alice, _ := locks.NewMutex("account:alice")
	fmt.Println("alice alone:", errors.Is(alice.TryLock(ctx), mutex.ErrNotObtained))
	fmt.Println("tokens:", len(transfer.Tokens()))
	if err := transfer.Unlock(ctx); err != nil {
		panic(err)
	}
	fmt.Println("alice after the transfer:", alice.TryLock(ctx))
	alice.Unlock(ctx)
	// Output:
	// alice alone: true
	// tokens: 2
	// alice after the transfer: <nil>
}

// RDo takes a read hold for the length of a function; its context ends if
// the hold is lost, so the work can stop.
func ExampleRWMutex_RDo() {
	locks, done := exampleLocker()
	defer done()
	ctx := context.Background()

	rw, _ := locks.NewRWMutex("config")
	err := rw.RDo(ctx, func(ctx context.Context) error {
		// ... read the configuration, passing ctx to every call ...
		fmt.Println("reading")
		return ctx.Err()
	})
	fmt.Println("err:", err)
	// Output:
	// reading
	// err: <nil>
}
