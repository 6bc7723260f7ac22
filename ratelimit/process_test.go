package ratelimit

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Environment of the helper process TestMultiProcessExact starts.
const (
	helperEnv = "SLUICE_RATELIMIT_HELPER" // "1" in a helper process
	addrsEnv  = "SLUICE_RATELIMIT_ADDRS"  // comma-separated Redis addresses
	jobsEnv   = "SLUICE_RATELIMIT_JOBS"   // comma-separated ALGO:PREFIX
	skewEnv   = "SLUICE_RATELIMIT_SKEW"   // added to the helper's clock
	perProc   = 250                       // requests per job per process
	multiJob  = -1                        // job "algorithm" of AllowPolicies
)

// TestMultiProcessExact has 4 OS processes send 1,000 requests for one key
// against a limit of 100 per hour, for every algorithm and for a
// three-policy decision, on a single server and on a cluster, and checks
// that exactly 100 pass. Each process runs
// with its clock skewed by a different amount (up to 90 minutes), which
// must not matter: decisions are made on the server's clock.
func TestMultiProcessExact(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 4 processes")
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			addrs := tg.addrs(t)
			var jobs []string
			for _, algo := range algorithms {
				jobs = append(jobs, fmt.Sprintf("%d:%s%s:", int(algo), testPrefix(t), algo))
			}
			// And one multi-policy decision (multiJob) whose tightest
			// policy allows 100 per hour.
			jobs = append(jobs, fmt.Sprintf("%d:%smulti:", multiJob, testPrefix(t)))
			const procs = 4
			type proc struct {
				cmd   *exec.Cmd
				stdin interface{ Close() error }
				out   *bufio.Scanner
			}
			var ps []proc
			for i := range procs {
				cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
				skew := time.Duration(2*i-3) * 30 * time.Minute
				cmd.Env = append(os.Environ(), helperEnv+"=1", addrsEnv+"="+strings.Join(addrs, ","),
					jobsEnv+"="+strings.Join(jobs, ","), skewEnv+"="+skew.String())
				cmd.Stderr = os.Stderr
				stdin, err := cmd.StdinPipe()
				if err != nil {
					t.Fatal(err)
				}
				stdout, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
				ps = append(ps, proc{cmd, stdin, bufio.NewScanner(stdout)})
			}
			// Wait until every process is connected, then start them together.
			for i, p := range ps {
				if !scanUntil(p.out, "ready") {
					t.Fatalf("process %d never got ready", i)
				}
			}
			for _, p := range ps {
				p.stdin.Close() // EOF on stdin is the start signal
			}
			allowed := make([]int, len(jobs))
			for i, p := range ps {
				got := 0
				for p.out.Scan() {
					var job, n int
					if _, err := fmt.Sscanf(p.out.Text(), "job %d allowed %d", &job, &n); err == nil {
						allowed[job] += n
						got++
					}
				}
				if err := p.cmd.Wait(); err != nil {
					t.Fatalf("process %d: %v", i, err)
				}
				if got != len(jobs) {
					t.Fatalf("process %d reported %d jobs; want %d", i, got, len(jobs))
				}
			}
			for i, job := range jobs {
				if allowed[i] != 100 {
					t.Errorf("job %s: %d of %d requests allowed; want exactly 100", job, allowed[i], procs*perProc)
				}
			}
		})
	}
}

func scanUntil(s *bufio.Scanner, line string) bool {
	for s.Scan() {
		if s.Text() == line {
			return true
		}
	}
	return false
}

// TestHelperProcess is the body of the processes TestMultiProcessExact
// starts; run directly it does nothing.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process for TestMultiProcessExact")
	}
	skew, err := time.ParseDuration(os.Getenv(skewEnv))
	if err != nil {
		t.Fatal(err)
	}
	sc := newCache(t, strings.Split(os.Getenv(addrsEnv), ",")...)
	var limiters []*Limiter
	var multi []bool
	for _, job := range strings.Split(os.Getenv(jobsEnv), ",") {
		algo, prefix, _ := strings.Cut(job, ":")
		a, _ := strconv.Atoi(algo)
		opts := Options{Algorithm: Algorithm(a), Limit: PerHour(100), Prefix: prefix}
		if a == multiJob {
			opts.Algorithm = GCRA
		}
		l := newLimiter(t, sc, opts)
		l.now = func() time.Time { return time.Now().Add(skew) }
		limiters = append(limiters, l)
		multi = append(multi, a == multiJob)
	}
	ps := newPolicies(t,
		Policy{Name: "burst", Limit: Limit{Rate: 1000, Period: time.Hour, Burst: 150}},
		// The binding one: a fixed window starts with its first request,
		// so no window boundary can fall inside the test.
		Policy{Name: "hour", Algorithm: FixedWindow, Limit: PerHour(100)},
		Policy{Name: "day", Algorithm: SlidingWindow, Limit: Limit{Rate: 120, Period: 24 * time.Hour}},
	)
	fmt.Println("ready")
	// Start when the parent closes stdin.
	bufio.NewReader(os.Stdin).ReadString('\n')
	for i, l := range limiters {
		var allowed atomic.Int64
		var next atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for next.Add(1) <= perProc {
					var ok bool
					if multi[i] {
						d, err := l.AllowPolicies(context.Background(), "k", 1, ps)
						if err != nil {
							t.Error(err)
							return
						}
						ok = d.Allowed
					} else {
						res, err := l.Allow(context.Background(), "k")
						if err != nil {
							t.Error(err)
							return
						}
						ok = res.Allowed
					}
					if ok {
						allowed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		fmt.Printf("job %d allowed %d\n", i, allowed.Load())
	}
}
