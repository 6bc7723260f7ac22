// Command wakeprobe shows what the bench's one-goroutine rows measure on a
// given machine: the same two go-redis script calls (SET NX PX, then DEL:
// a lock pair without a library), made directly by one goroutine or each
// in a goroutine of its own, as redsync makes its calls. The two ways
// alternate in blocks, so both see the same machine. On a VM whose idle
// CPUs halt at once, the second is often faster: a goroutine started per
// call wakes another thread, which keeps a CPU awake for the reply.
//
//	go run ./wakeprobe -redis 127.0.0.1:6379
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"slices"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("redis", "127.0.0.1:6379", "Redis `address` (loopback)")
	blocks := flag.Int("blocks", 6, "blocks of each way")
	pairs := flag.Int("pairs", 1500, "call pairs per block")
	flag.Parse()

	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: *addr})
	defer c.Close()
	set := goredis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 30000)`)
	del := goredis.NewScript(`return redis.call('DEL', KEYS[1])`)
	for _, s := range []*goredis.Script{set, del} {
		if err := s.Load(ctx, c).Err(); err != nil {
			log.Fatal(err)
		}
	}
	key := []string{"sluice-wakeprobe"}
	ways := []struct {
		name string
		pair func(ctx context.Context) error
	}{
		{"direct", func(ctx context.Context) error {
			if err := set.EvalSha(ctx, c, key, "v").Err(); err != nil && !errors.Is(err, goredis.Nil) {
				return err
			}
			return del.EvalSha(ctx, c, key).Err()
		}},
		{"goroutine per call", func(ctx context.Context) error {
			errs := make(chan error)
			go func() { errs <- set.EvalSha(ctx, c, key, "v").Err() }()
			if err := <-errs; err != nil && !errors.Is(err, goredis.Nil) {
				return err
			}
			go func() { errs <- del.EvalSha(ctx, c, key).Err() }()
			return <-errs
		}},
	}
	p50s := make([][]time.Duration, len(ways))
	for b := range *blocks {
		for w, way := range ways {
			lat := make([]time.Duration, 0, *pairs)
			for range *pairs {
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				t0 := time.Now()
				err := way.pair(cctx)
				lat = append(lat, time.Since(t0))
				cancel()
				if err != nil {
					log.Fatal(err)
				}
			}
			slices.Sort(lat)
			p50s[w] = append(p50s[w], lat[len(lat)/2])
			fmt.Printf("block %d  %-19s p50 %v\n", b+1, way.name, lat[len(lat)/2].Round(time.Microsecond))
		}
	}
	for w, way := range ways {
		slices.Sort(p50s[w])
		fmt.Printf("%-19s median of block p50s %v (range %v-%v)\n", way.name, p50s[w][len(p50s[w])/2].Round(time.Microsecond),
			p50s[w][0].Round(time.Microsecond), p50s[w][len(p50s[w])-1].Round(time.Microsecond))
	}
}
