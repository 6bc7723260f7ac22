package rls_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/rueidis"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicekit/sluice/envoy/rls"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/ratelimit"
)

// randomConfig has a rule of every kind the oracle checks: enforced
// counters in the three algorithms (limits per day or year, so that a run
// of seconds sees no refill and no new window but at midnight), a shadow
// rule, an unlimited one, a rule of 0 requests and a nested one.
const randomConfig = `
domain: r
descriptors:
  - key: org
    rate_limit: {unit: day, requests_per_unit: 40}
  - key: user
    rate_limit: {unit: year, requests_per_unit: 9, algorithm: gcra}
  - key: path
    rate_limit: {unit: day, requests_per_unit: 12, algorithm: sliding_window}
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 4}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: free
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: day, requests_per_unit: 0}
`

// limits are the enforced counters' limits, by the first key of their
// descriptor (two entries: "path/user").
var randomLimits = map[string]int{"org": 40, "user": 9, "path": 12, "path/user": 4, "shadow": 3}

// sent is one request of the randomized run and what became of it.
type sent struct {
	counters       map[string]int // enforced counter -> hits (0: a peek)
	start, end     time.Time
	allowed, error bool
	denied         map[string]bool // counters that said OVER_LIMIT
	uncached       bool            // answered by the instance without a deny cache
}

// TestRandomized sends random requests through three instances of the
// service (each its own client, Limiter and gRPC server) on one
// redis-server, with random hits, peeks, duplicates, shadow, unlimited,
// blocked and unmatched descriptors, while the server is restarted (kill
// -9) and paused (SIGSTOP) now and then. Its oracle:
//   - every answer is consistent: OVER_LIMIT overall exactly when an
//     enforced descriptor says OVER_LIMIT, shadow and unlimited
//     descriptors never do, a blocked one always does, and a denying
//     descriptor has less left than its hits;
//   - counts are exact: after the run, each counter holds the hits of the
//     allowed requests that certainly ran on the last server, plus at most
//     those of requests whose fate is unknown (answered with an error, or
//     in flight over the last restart); the denied add nothing;
//   - nothing refused what it had to allow: a counter that denied a
//     request on the last server ends with fewer than that request's hits
//     left.
//
// SLUICE_RLS_SEED=N replays a seed's choices (the machine's timing decides
// the interleaving); SLUICE_RLS_RUN=30s runs longer.
func TestRandomized(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SLUICE_RLS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	runFor := 4 * time.Second
	if s := os.Getenv("SLUICE_RLS_RUN"); s != "" {
		var err error
		if runFor, err = time.ParseDuration(s); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (SLUICE_RLS_SEED=%d replays it)", seed, seed)
	day := time.Now().UTC().Truncate(24 * time.Hour)

	srv := redistest.NewServer(t)
	prefix := fmt.Sprintf("rnd%d:", runs.Add(1))
	cfg, err := rls.Parse(rls.File{Name: "r.yaml", Data: []byte(randomConfig)})
	if err != nil {
		t.Fatal(err)
	}
	// The third instance has no deny cache: a restart without persistence
	// loses the counts, and the others' caches keep denying what Redis
	// denied before it until then, as they are meant to; the check that
	// nothing was refused with room reads only the third's answers.
	// A short dial timeout: a paused server accepts connections but does
	// not answer their handshake, which rueidis waits for up to it.
	var envs []*env
	for i := range 3 {
		client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true,
			Dialer: net.Dialer{Timeout: time.Second}, ConnWriteTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(client.Close)
		envs = append(envs, startLimiter(t, client, cfg, rls.Options{Timeout: time.Second},
			ratelimit.Options{DisableDenyCache: i == 2}, prefix))
	}

	// Faults: restarts and pauses, each noted with when it began and
	// ended.
	var (
		faultMu     sync.Mutex
		lastKill    time.Time // the last restart began
		lastRestart time.Time // and ended
	)
	stop := make(chan struct{})
	faultsDone := make(chan struct{})
	rng := rand.New(rand.NewPCG(seed, 1))
	faultSeed := rng.Uint64()
	go func() {
		defer close(faultsDone)
		frng := rand.New(rand.NewPCG(faultSeed, 2))
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(300+frng.IntN(700)) * time.Millisecond):
			}
			switch frng.IntN(3) {
			case 0:
				faultMu.Lock()
				lastKill = time.Now()
				faultMu.Unlock()
				srv.Kill()
				if err := srv.Restart(); err != nil {
					t.Error(err)
					return
				}
				faultMu.Lock()
				lastRestart = time.Now()
				faultMu.Unlock()
			case 1:
				if err := srv.Pause(); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Duration(100+frng.IntN(400)) * time.Millisecond) //nolint:forbidigo // the fault's length
				if err := srv.Resume(); err != nil {
					t.Error(err)
					return
				}
			default: // a quiet spell
			}
		}
	}()

	const workers = 12
	results := make([][]sent, workers)
	var wg sync.WaitGroup
	deadline := time.Now().Add(runFor)
	for w := range workers {
		wseed := rng.Uint64()
		wg.Go(func() {
			wrng := rand.New(rand.NewPCG(wseed, uint64(w)))
			for time.Now().Before(deadline) {
				r, s := randomRequest(wrng)
				s.start = time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				i := wrng.IntN(len(envs))
				s.uncached = i == 2
				resp, err := envs[i].client.ShouldRateLimit(ctx, r)
				cancel()
				s.end = time.Now()
				if err != nil {
					s.error = true
					if testing.Verbose() && wrng.IntN(5) == 0 {
						t.Logf("error after %v: %v", s.end.Sub(s.start), err)
					}
				} else {
					checkAnswer(t, r, resp, &s)
				}
				results[w] = append(results[w], s)
			}
		})
	}
	wg.Wait()
	close(stop)
	<-faultsDone
	if time.Now().UTC().Truncate(24*time.Hour) != day {
		t.Skip("the run crossed midnight UTC: the day's windows rolled over")
	}

	// The last server's counts, read with peeks through the service once
	// it answers again.
	if !redistest.WaitFor(context.Background(), 10*time.Second, func() bool {
		_, err := envs[0].client.ShouldRateLimit(context.Background(), req("r", desc("free", "x")))
		return err == nil
	}) {
		t.Fatal("the service does not answer after the run")
	}
	faultMu.Lock()
	kill, restart := lastKill, lastRestart
	faultMu.Unlock()
	lo, hi := map[string]int{}, map[string]int{}
	total, allowed, denied, errs := 0, 0, 0, 0
	var deniedAfter []sent
	for _, rs := range results {
		for _, s := range rs {
			total++
			certain := s.start.After(restart) // ran on the last server, if at all
			unknown := s.error && s.end.After(kill) || s.allowed && !certain && s.end.After(kill)
			switch {
			case s.error:
				errs++
			case s.allowed:
				allowed++
			default:
				denied++
				if certain && (s.uncached || kill.IsZero()) {
					deniedAfter = append(deniedAfter, s)
				}
			}
			for c, hits := range s.counters {
				if s.allowed && certain {
					lo[c] += hits
				}
				if s.allowed && certain || unknown {
					hi[c] += hits
				}
			}
		}
	}
	t.Logf("%d requests: %d allowed, %d denied, %d errors; last restart %v before the end", total, allowed, denied, errs, time.Since(restart).Round(time.Millisecond))
	if allowed == 0 || denied == 0 {
		t.Fatalf("the run decided too little to check: %d allowed, %d denied", allowed, denied)
	}
	final := map[string]int{}
	for c := range hi {
		final[c] = counted(t, envs[1], c)
	}
	for c := range lo {
		if _, ok := final[c]; !ok {
			final[c] = counted(t, envs[1], c)
		}
	}
	for c, n := range final {
		if n < lo[c] || n > hi[c] {
			t.Errorf("counter %s holds %d, want between %d (allowed on the last server) and %d (and the unknown); denied requests add nothing", c, n, lo[c], hi[c])
		}
	}
	for _, s := range deniedAfter {
		for c := range s.denied {
			if limit := randomLimits[kindOf(c)]; final[c]+s.counters[c] <= limit {
				t.Errorf("counter %s refused %d hits but ends with %d of %d counted: it refused what it had room for", c, s.counters[c], final[c], limit)
			}
		}
	}
}

// kindOf is the rule of counter c ("user/u3" -> "user").
func kindOf(c string) string {
	for k := range randomLimits {
		if len(c) > len(k) && c[:len(k)+1] == k+":" {
			return k
		}
	}
	return c
}

// counted reads counter c's count with a peek.
func counted(t *testing.T, e *env, c string) int {
	t.Helper()
	kind := kindOf(c)
	val := c[len(kind)+1:]
	var d *rlcommon.RateLimitDescriptor
	if kind == "path/user" {
		var p, u string
		fmt.Sscanf(val, "%s %s", &p, &u)
		d = desc("path", p, "user", u)
	} else {
		d = desc(kind, val)
	}
	d.HitsAddend = wrapperspb.UInt64(0)
	// A peek counts nothing, so one that met a connection the last
	// restart broke (Unavailable, "EOF": a restart 6 ms before the end,
	// CI 2026-11-30) is sent again; any other error fails at once.
	resp, err := e.client.ShouldRateLimit(context.Background(), req("r", d))
	for try := 0; status.Code(err) == codes.Unavailable && try < 20; try++ {
		time.Sleep(50 * time.Millisecond)
		resp, err = e.client.ShouldRateLimit(context.Background(), req("r", d))
	}
	if err != nil {
		t.Fatalf("peek at %s: %v", c, err)
	}
	return randomLimits[kind] - int(resp.Statuses[0].LimitRemaining)
}

// randomRequest draws a request: 1 to 4 descriptors, with request and
// descriptor hits, peeks and duplicates, and what the oracle must know of
// it.
func randomRequest(rng *rand.Rand) (*rlspb.RateLimitRequest, sent) {
	r := &rlspb.RateLimitRequest{Domain: "r"}
	if rng.IntN(4) == 0 {
		r.HitsAddend = uint32(1 + rng.IntN(2))
	}
	s := sent{counters: map[string]int{}, denied: map[string]bool{}}
	n := 1 + rng.IntN(4)
	for range n {
		var d *rlcommon.RateLimitDescriptor
		var counter string
		switch rng.IntN(10) {
		case 0, 1:
			v := fmt.Sprint("o", rng.IntN(2))
			d, counter = desc("org", v), "org:"+v
		case 2, 3:
			v := fmt.Sprint("u", rng.IntN(4))
			d, counter = desc("user", v), "user:"+v
		case 4:
			v := fmt.Sprint("/p", rng.IntN(2))
			d, counter = desc("path", v), "path:"+v
		case 5:
			p, u := fmt.Sprint("/p", rng.IntN(2)), fmt.Sprint("u", rng.IntN(3))
			d, counter = desc("path", p, "user", u), "path/user:"+p+" "+u
		case 6:
			d = desc("shadow", fmt.Sprint("s", rng.IntN(2)))
		case 7:
			d = desc("free", "x")
		case 8:
			if rng.IntN(8) == 0 {
				d = desc("blocked", "b")
			} else {
				d = desc("unknown", "k")
			}
		default:
			d = desc("org", "o0", "deeper", "x") // too deep: no rule
		}
		hits := int(max(r.HitsAddend, 1))
		if rng.IntN(6) == 0 {
			h := uint64(rng.IntN(3))
			d.HitsAddend = wrapperspb.UInt64(h)
			hits = int(h)
		}
		if counter != "" {
			s.counters[counter] += hits // a duplicate counts twice
		}
		r.Descriptors = append(r.Descriptors, d)
	}
	return r, s
}

// checkAnswer checks one answer against the rules of the descriptors it
// answers and notes it in s.
func checkAnswer(t *testing.T, r *rlspb.RateLimitRequest, resp *rlspb.RateLimitResponse, s *sent) {
	t.Helper()
	s.allowed = resp.OverallCode == rlspb.RateLimitResponse_OK
	if len(resp.Statuses) != len(r.Descriptors) {
		t.Errorf("%d statuses for %d descriptors", len(resp.Statuses), len(r.Descriptors))
		return
	}
	anyOver := false
	for i, st := range resp.Statuses {
		d := r.Descriptors[i]
		key := d.Entries[0].Key
		over := st.Code == rlspb.RateLimitResponse_OVER_LIMIT
		anyOver = anyOver || over
		switch {
		case key == "free":
			if over || st.LimitRemaining != math.MaxUint32 {
				t.Errorf("unlimited descriptor: %v", st)
			}
		case key == "shadow":
			if over {
				t.Errorf("shadow descriptor said OVER_LIMIT: %v", st)
			}
		case key == "blocked":
			// Over its limit of 0, but for a look (hits 0).
			if look := d.HitsAddend != nil && d.HitsAddend.Value == 0; over == look {
				t.Errorf("blocked descriptor (hits 0: %v): %v", look, st)
			}
		case key == "unknown" || len(d.Entries) == 2 && d.Entries[1].Key == "deeper":
			if over || st.CurrentLimit != nil {
				t.Errorf("unmatched descriptor: %v", st)
			}
		}
		if over && key != "blocked" {
			c := counterOf(d)
			s.denied[c] = true
			if hits := s.counters[c]; st.LimitRemaining >= uint32(hits) {
				t.Errorf("%s said OVER_LIMIT with %d left for %d hits", c, st.LimitRemaining, hits)
			}
		}
	}
	if anyOver == s.allowed {
		t.Errorf("overall %v with a descriptor over its limit: %v", resp.OverallCode, anyOver)
	}
}

// counterOf names a descriptor's counter as randomRequest does.
func counterOf(d *rlcommon.RateLimitDescriptor) string {
	if len(d.Entries) == 2 {
		return "path/user:" + d.Entries[0].Value + " " + d.Entries[1].Value
	}
	return d.Entries[0].Key + ":" + d.Entries[0].Value
}
