package goredis_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice/goredis"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/semaphore"
)

// The quick start with go-redis: one script cache on the application's
// client runs every primitive. Against a real Redis, use your usual
// redis.NewClient or redis.NewClusterClient; miniredis stands in for it
// here so the example runs anywhere.
func Example() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	sc, err := goredis.New(ctx, rdb) // wraps rdb and loads the scripts
	if err != nil {
		panic(err)
	}

	locks, _ := mutex.NewLocker(sc, mutex.Options{})
	defer locks.Close()
	m, _ := locks.NewMutex("order:42")
	if err := m.Lock(ctx); err == nil {
		fmt.Println("locked")
		m.Unlock(ctx)
	}

	sems, _ := semaphore.NewManager(sc, semaphore.Options{})
	defer sems.Close()
	pool, _ := sems.NewSemaphore("db-connections", 10)
	if p, err := pool.Acquire(ctx, 2); err == nil {
		fmt.Println("2 of 10 permits")
		p.Release(ctx)
	}

	limiter, _ := ratelimit.New(sc, ratelimit.Options{Limit: ratelimit.Limit{Rate: 2, Period: time.Minute}})
	for range 3 {
		res, _ := limiter.Allow(ctx, "user:7")
		fmt.Println("allowed:", res.Allowed)
	}
	// Output:
	// locked
	// 2 of 10 permits
	// allowed: true
	// allowed: true
	// allowed: false
}

// A Redis Cluster: the same, with a *redis.ClusterClient. Keys of one
// lock share a hash slot; sluice's key names see to that.
func ExampleNew_cluster() {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"},
	})
	defer rdb.Close()
	sc, err := goredis.New(context.Background(), rdb)
	if err != nil {
		panic(err)
	}
	locks, _ := mutex.NewLocker(sc, mutex.Options{})
	defer locks.Close()
}
