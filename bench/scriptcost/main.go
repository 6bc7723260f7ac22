// Command scriptcost measures what the server spends on one uncontended
// lock+unlock pair of the shipped lock scripts, beside variants that show
// where that time goes (issue 33). It calls the scripts in pipelines of
// 200 on distinct keys, so that the client's round trips do not count,
// and reads the server's EVALSHA time from INFO commandstats (it resets
// the server's statistics: use a server of its own).
//
//	redis-server --port 6399 --save "" --appendonly no --daemonize yes
//	cd bench && go run ./scriptcost -redis 127.0.0.1:6399
//
// The variants, each a lock script and a release script:
//
//   - shipped: lua/mutex_lock.lua and lua/mutex_release.lua, with the keys
//     and arguments an unfair Mutex sends. Each lock takes a free record
//     left by the previous release, the common case.
//   - same calls: the same redis.calls (GET, TIME, SET with PX; GET, SET
//     with PX), with none of the scripts' Lua around them: what any
//     script of this layout costs at least.
//   - without TIME: the same, less the lock's TIME.
//   - SET NX, GET+DEL: redislock's layout (SET NX PX; GET, compare, DEL).
package main

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/lua"
)

type variant struct {
	name          string
	lock, release string // script bodies; "" for the shipped one
}

var variants = []variant{
	{name: "shipped"},
	{name: "same calls",
		lock: `redis.call('GET', KEYS[1])
local t = redis.call('TIME')
redis.call('SET', KEYS[1], 'L:' .. t[1] .. t[2] .. ':1|1:' .. ARGV[3] .. ':' .. ARGV[2], 'PX', ARGV[1])
return 1`,
		release: `redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], 'L:1:1|', 'PX', ARGV[2])
return 0`},
	{name: "without TIME",
		lock: `redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], 'L:1:1|1:' .. ARGV[3] .. ':' .. ARGV[2], 'PX', ARGV[1])
return 1`,
		release: `redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], 'L:1:1|', 'PX', ARGV[2])
return 0`},
	{name: "SET NX, GET+DEL",
		lock: `if redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ARGV[1]) then return 1 end
return -1`,
		release: `if redis.call('GET', KEYS[1]) == ARGV[3] then redis.call('DEL', KEYS[1]) return 0 end
return -1`},
}

func main() {
	addr := flag.String("redis", "127.0.0.1:6399", "a Redis of this measurement's own (its statistics are reset)")
	pairs := flag.Int("n", 60000, "lock+unlock pairs per round")
	rounds := flag.Int("rounds", 5, "rounds per variant, interleaved; the median is reported")
	flag.Parse()
	if err := run(*addr, *pairs, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "scriptcost:", err)
		os.Exit(1)
	}
}

func run(addr string, pairs, rounds int) error {
	ctx := context.Background()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return err
	}
	defer c.Close()
	lockBody, err := fs.ReadFile(lua.FS(), "mutex_lock.lua")
	if err != nil {
		return err
	}
	releaseBody, err := fs.ReadFile(lua.FS(), "mutex_release.lua")
	if err != nil {
		return err
	}
	type loaded struct{ lock, release string }
	shas := make([]loaded, len(variants))
	for i, v := range variants {
		l, r := v.lock, v.release
		if l == "" {
			l, r = string(lockBody), string(releaseBody)
		}
		if shas[i].lock, err = c.Do(ctx, c.B().ScriptLoad().Script(l).Build()).ToString(); err != nil {
			return err
		}
		if shas[i].release, err = c.Do(ctx, c.B().ScriptLoad().Script(r).Build()).ToString(); err != nil {
			return err
		}
	}
	results := make([][]float64, len(variants))
	for range rounds {
		for i := range variants {
			us, err := measure(ctx, c, shas[i].lock, shas[i].release, pairs)
			if err != nil {
				return fmt.Errorf("%s: %w", variants[i].name, err)
			}
			results[i] = append(results[i], us)
		}
	}
	fmt.Printf("server time per uncontended lock+unlock pair (EVALSHA, µs; median of %d rounds of %d pairs, min–max)\n", rounds, pairs)
	for i, v := range variants {
		r := slices.Sorted(slices.Values(results[i]))
		fmt.Printf("  %-18s %6.2f  (%.2f–%.2f)\n", v.name, r[len(r)/2], r[0], r[len(r)-1])
	}
	return nil
}

var evalshaStat = regexp.MustCompile(`cmdstat_evalsha:calls=(\d+),usec=(\d+)`)

// measure runs pairs lock+unlock pairs in pipelines of 200 distinct keys
// and returns the server's EVALSHA time per pair in µs.
func measure(ctx context.Context, c rueidis.Client, lockSHA, releaseSHA string, pairs int) (float64, error) {
	const batch, owner = 200, "0b7e2a4c-5d1f-4e8a-9c3b-2f6d8e1a7b90"
	if err := c.Do(ctx, c.B().Flushall().Build()).Error(); err != nil {
		return 0, err
	}
	// One pass first, so that every key has the record a release leaves.
	for pass := range 2 {
		if pass == 1 {
			if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
				return 0, err
			}
		}
		n := batch
		if pass == 1 {
			n = pairs
		}
		tokens := make([]string, batch)
		for i := 0; i < n; i += batch {
			cmds := make(rueidis.Commands, 0, batch)
			for j := range batch {
				k := "{scriptcost:" + strconv.Itoa(j) + "}"
				attempt := "a" + strconv.Itoa(j) + "." + strconv.Itoa(i+1)
				cmds = append(cmds, c.B().Evalsha().Sha1(lockSHA).Numkeys(3).Key(k, k+":t", k+":q").Arg("30000", owner, attempt).Build())
			}
			for j, r := range c.DoMulti(ctx, cmds...) {
				v, err := r.AsInt64()
				if err != nil {
					return 0, fmt.Errorf("lock: %w", err)
				}
				if v < 0 {
					return 0, fmt.Errorf("lock refused: %d", v)
				}
				tokens[j] = strconv.FormatInt(v, 10)
			}
			cmds = cmds[:0]
			for j := range batch {
				k := "{scriptcost:" + strconv.Itoa(j) + "}"
				cmds = append(cmds, c.B().Evalsha().Sha1(releaseSHA).Numkeys(2).Key(k, k+":c").Arg("u", "5000", owner, tokens[j]).Build())
			}
			for _, r := range c.DoMulti(ctx, cmds...) {
				if v, err := r.AsInt64(); err != nil {
					return 0, fmt.Errorf("release: %w", err)
				} else if v < 0 {
					return 0, fmt.Errorf("release refused: %d", v)
				}
			}
		}
	}
	info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		return 0, err
	}
	m := evalshaStat.FindStringSubmatch(info)
	if m == nil {
		return 0, fmt.Errorf("no EVALSHA in INFO commandstats")
	}
	calls, _ := strconv.ParseFloat(m[1], 64)
	usec, _ := strconv.ParseFloat(m[2], 64)
	return 2 * usec / calls, nil
}
