// Command rlsbench measures decisions per second and their latency at 64
// concurrent callers, for the same requests made four ways on one Redis:
//
//   - grpc: ShouldRateLimit through the service over gRPC on loopback (64
//     concurrent streams on one connection, as Envoy multiplexes them);
//   - rls: the same Service called in this process, without gRPC;
//   - counters: ratelimit.Limiter.AllowCounters with the counters the
//     service builds, the library alone;
//   - incr-expire: envoyproxy/ratelimit's documented algorithm, written
//     here: per descriptor an INCRBY of a key named by the window and an
//     EXPIRE, the request's commands pipelined in one round trip, every
//     descriptor counted whatever the others say. It is that algorithm,
//     not that program.
//
// Each request carries two descriptors, an organisation (16) and a user
// (1,024) drawn at random, under limits no request reaches, so every
// request is allowed and counted: the write path of each.
//
//	go run ./internal/rlsbench                 # starts a redis-server on a free port
//	go run ./internal/rlsbench -redis ADDR     # or uses one
//
// Rounds interleave the ways; the table gives each way's median round and
// the range over the rounds.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/rueidis"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicekit/sluice/envoy/rls"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/ratelimit"
	"github.com/sluicekit/sluice/scriptcache"
)

const config = `
domain: bench
descriptors:
  - key: org
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
`

func main() {
	addr := flag.String("redis", "", "Redis `address`; empty starts a redis-server on a free loopback port")
	d := flag.Duration("d", 5*time.Second, "length of one round of one way")
	rounds := flag.Int("rounds", 3, "rounds of every way")
	conc := flag.Int("c", 64, "concurrent callers")
	only := flag.String("only", "", "run only the ways of this comma-separated `list` (grpc, rls, counters, incr-expire)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of this process to `file`")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(*addr, *d, *rounds, *conc, *only); err != nil {
		log.Print(err)
		return
	}
}

type result struct {
	rate     float64 // decisions per second
	p50, p99 time.Duration
}

type way struct {
	name, label string
	do          func(ctx context.Context, rng *rand.Rand) error
}

func run(addr string, d time.Duration, rounds, conc int, only string) error {
	ctx := context.Background()
	if addr == "" {
		srv, err := redistest.StartServer()
		if err != nil {
			return err
		}
		defer srv.Stop()
		addr = srv.Addr()
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return err
	}
	defer client.Close()
	sc, err := scriptcache.New(ctx, client)
	if err != nil {
		return err
	}
	prefix := fmt.Sprintf("rlsbench:%d:", time.Now().UnixNano())
	lim, err := ratelimit.New(sc, ratelimit.Options{Prefix: prefix})
	if err != nil {
		return err
	}
	cfg, err := rls.Parse(rls.File{Name: "bench.yaml", Data: []byte(config)})
	if err != nil {
		return err
	}
	// The bench measures throughput, not the fallback: a generous wait.
	svc, err := rls.New(lim, cfg, rls.Options{Timeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	gs := grpc.NewServer()
	rlspb.RegisterRateLimitServiceServer(gs, svc)
	go gs.Serve(lis) //nolint:errcheck // ends with Stop
	defer gs.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	stub := rlspb.NewRateLimitServiceClient(conn)

	request := func(rng *rand.Rand) (*rlspb.RateLimitRequest, string, string) {
		org, user := "o"+strconv.Itoa(rng.IntN(16)), "u"+strconv.Itoa(rng.IntN(1024))
		return &rlspb.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "org", Value: org}}},
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: user}}},
		}}, org, user
	}
	check := func(resp *rlspb.RateLimitResponse, err error) error {
		if err != nil {
			return err
		}
		if resp.OverallCode != rlspb.RateLimitResponse_OK {
			return fmt.Errorf("denied: %v", resp)
		}
		return nil
	}
	limit := ratelimit.Limit{Rate: 1_000_000_000, Period: time.Hour}
	ways := []way{
		{"grpc", "through the service over gRPC (64 streams, one connection)", func(ctx context.Context, rng *rand.Rand) error {
			r, _, _ := request(rng)
			return check(stub.ShouldRateLimit(ctx, r))
		}},
		{"rls", "rls.Service called in process (no gRPC)", func(ctx context.Context, rng *rand.Rand) error {
			r, _, _ := request(rng)
			return check(svc.ShouldRateLimit(ctx, r))
		}},
		{"counters", "the library: ratelimit AllowCounters", func(ctx context.Context, rng *rand.Rand) error {
			_, org, user := request(rng)
			dec, err := lim.AllowCounters(ctx, "bench", []ratelimit.Counter{
				{Key: "org=" + org, Policy: ratelimit.Policy{Algorithm: ratelimit.FixedWindow, Limit: limit}, Aligned: true},
				{Key: "user=" + user, Policy: ratelimit.Policy{Algorithm: ratelimit.FixedWindow, Limit: limit}, Aligned: true},
			})
			if err == nil && !dec.Allowed {
				err = fmt.Errorf("denied: %+v", dec)
			}
			return err
		}},
		{"incr-expire", "envoyproxy/ratelimit's algorithm (INCRBY+EXPIRE per descriptor, pipelined, every descriptor counted)", func(ctx context.Context, rng *rand.Rand) error {
			_, org, user := request(rng)
			window := strconv.FormatInt(time.Now().Unix()/3600*3600, 10)
			k1, k2 := prefix+"bench_org_"+org+"_"+window, prefix+"bench_user_"+user+"_"+window
			res := client.DoMulti(ctx,
				client.B().Incrby().Key(k1).Increment(1).Build(), client.B().Expire().Key(k1).Seconds(3600).Build(),
				client.B().Incrby().Key(k2).Increment(1).Build(), client.B().Expire().Key(k2).Seconds(3600).Build())
			for _, i := range []int{0, 2} {
				n, err := res[i].AsInt64()
				if err != nil {
					return err
				}
				if n > int64(limit.Rate) {
					return fmt.Errorf("over the limit: %d", n)
				}
			}
			return res[1].Error()
		}},
	}
	if only != "" {
		ways = slices.DeleteFunc(ways, func(w way) bool { return !slices.Contains(strings.Split(only, ","), w.name) })
	}
	results := map[string][]result{}
	fmt.Fprintf(os.Stderr, "rlsbench: %d rounds of %v per way, %d callers, redis %s\n", rounds, d, conc, addr)
	for round := range rounds {
		for _, w := range ways {
			r, err := measure(w, d, conc, uint64(round))
			if err != nil {
				return fmt.Errorf("%s: %w", w.name, err)
			}
			fmt.Fprintf(os.Stderr, "round %d %-12s %9.0f/s p50 %v p99 %v\n", round+1, w.name, r.rate, r.p50, r.p99)
			results[w.name] = append(results[w.name], r)
		}
	}
	fmt.Printf("\n| way | decisions/s (range) | p50 (range) | p99 (range) |\n| --- | --- | --- | --- |\n")
	for _, w := range ways {
		rs := results[w.name]
		fmt.Printf("| %s | %s | %s | %s |\n", w.label,
			spread(rs, func(r result) float64 { return r.rate }, func(v float64) string { return fmt.Sprintf("%.1fk", v/1000) }),
			spread(rs, func(r result) float64 { return float64(r.p50) }, durStr),
			spread(rs, func(r result) float64 { return float64(r.p99) }, durStr))
	}
	return nil
}

func durStr(v float64) string {
	d := time.Duration(v)
	if d < time.Millisecond {
		return fmt.Sprintf("%d µs", d.Microseconds())
	}
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// spread formats the median of f over rs and its range.
func spread(rs []result, f func(result) float64, format func(float64) string) string {
	vs := make([]float64, len(rs))
	for i, r := range rs {
		vs[i] = f(r)
	}
	slices.Sort(vs)
	return fmt.Sprintf("%s (%s-%s)", format(vs[len(vs)/2]), strings.TrimSpace(format(vs[0])), strings.TrimSpace(format(vs[len(vs)-1])))
}

// measure runs w from conc goroutines for d, after a short warm-up.
func measure(w way, d time.Duration, conc int, seed uint64) (result, error) {
	ctx := context.Background()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		lat   []time.Duration
		first error
	)
	warm := time.Now().Add(d / 10)
	end := warm.Add(d)
	for g := range conc {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			var mine []time.Duration
			for {
				start := time.Now()
				if start.After(end) {
					break
				}
				c, cancel := context.WithTimeout(ctx, 5*time.Second)
				err := w.do(c, rng)
				cancel()
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				if start.After(warm) {
					mine = append(mine, time.Since(start))
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if first != nil {
		return result{}, first
	}
	slices.Sort(lat)
	if len(lat) == 0 {
		return result{}, fmt.Errorf("no decision measured")
	}
	return result{
		rate: float64(len(lat)) / d.Seconds(),
		p50:  lat[len(lat)*50/100],
		p99:  lat[len(lat)*99/100],
	}, nil
}
