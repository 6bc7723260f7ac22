package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	sluicemutex "github.com/sluicekit/sluice/mutex"
)

// inventoryScenario: buyers in several "processes" (each its own client and
// mutex Locker) buy from one stock kept in Redis with a plain GET and SET,
// a read-modify-write that only the mutex makes safe. Demand exceeds the
// stock. The final stock must equal the initial stock minus the successful
// purchases, it must never go negative, and the fencing tokens handed to
// successive holders must keep increasing.
func inventoryScenario(ctx context.Context, s *server, ns string, quick bool) scenario {
	sc := scenario{Name: "inventory under the mutex"}
	const processes, buyersPer, wantEach = 3, 6, 4
	initial := 50
	if quick {
		initial = 25
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stockKey := ns + "stock"

	var (
		purchases, soldOut, holders, overlap atomic.Int64
		mu                                   sync.Mutex // guards the fields below
		lastToken                            int64
		tokensOK                             = true
		negative                             bool
		firstErr                             error
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	// buy takes the lock, reads the stock and writes it back one lower.
	buy := func(m *sluicemutex.Mutex, c rueidis.Client) (bought bool, err error) {
		if err := m.Lock(ctx); err != nil {
			return false, err
		}
		defer func() {
			if uerr := m.Unlock(ctx); err == nil {
				err = uerr
			}
		}()
		if holders.Add(1) > 1 {
			overlap.Add(1)
		}
		defer holders.Add(-1)
		mu.Lock()
		if tok := m.Token(); tok <= lastToken {
			tokensOK = false
		} else {
			lastToken = tok
		}
		mu.Unlock()
		n, err := c.Do(ctx, c.B().Get().Key(stockKey).Build()).AsInt64()
		if err != nil {
			return false, err
		}
		if n < 0 {
			mu.Lock()
			negative = true
			mu.Unlock()
		}
		if n <= 0 {
			return false, nil
		}
		if err := c.Do(ctx, c.B().Set().Key(stockKey).Value(strconv.FormatInt(n-1, 10)).Build()).Error(); err != nil {
			return false, err
		}
		return true, nil
	}

	setup, err := s.rueidis()
	if err != nil {
		sc.Err = err.Error()
		return sc
	}
	err = setup.Do(ctx, setup.B().Set().Key(stockKey).Value(strconv.Itoa(initial)).Ex(time.Minute).Build()).Error()
	if err != nil {
		setup.Close()
		sc.Err = err.Error()
		return sc
	}

	start := time.Now()
	var wg sync.WaitGroup
	for p := range processes {
		cache, client, err := openCache(ctx, s)
		if err != nil {
			fail(err)
			break
		}
		locks, err := sluicemutex.NewLocker(cache, sluicemutex.Options{Prefix: ns})
		if err != nil {
			client.Close()
			fail(err)
			break
		}
		var procWG sync.WaitGroup
		for range buyersPer {
			procWG.Go(func() {
				m, err := locks.NewMutex("stock")
				if err != nil {
					fail(err)
					return
				}
				for range wantEach {
					ok, err := buy(m, client)
					if err != nil {
						fail(fmt.Errorf("process %d: %w", p, err))
						return
					}
					if !ok {
						soldOut.Add(1)
						return
					}
					purchases.Add(1)
				}
			})
		}
		wg.Go(func() {
			procWG.Wait()
			locks.Close()
			client.Close()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	final, err := setup.Do(ctx, setup.B().Get().Key(stockKey).Build()).AsInt64()
	if err != nil {
		fail(err)
	}
	_ = setup.Do(ctx, setup.B().Del().Key(stockKey).Build()).Error()
	setup.Close()

	demand := processes * buyersPer * wantEach
	sc.Lines = append(sc.Lines,
		fmt.Sprintf("%d processes x %d buyers want %d items each (%d) from a stock of %d, GET+SET under one lock", processes, buyersPer, wantEach, demand, initial),
		fmt.Sprintf("purchases %d, turned away %d, in %s", purchases.Load(), soldOut.Load(), elapsed.Round(time.Millisecond)),
		fmt.Sprintf("check: final stock %d = %d - %d purchases; never negative: %v; fencing tokens increasing: %v; overlapping holders seen: %d",
			final, initial, purchases.Load(), !negative, tokensOK, overlap.Load()))
	if firstErr != nil {
		sc.Err = firstErr.Error()
	}
	sc.OK = firstErr == nil && final == int64(initial)-purchases.Load() && final >= 0 && !negative && tokensOK && overlap.Load() == 0
	return sc
}
