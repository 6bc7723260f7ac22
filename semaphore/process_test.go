package semaphore_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/semaphore"
)

// Environment of a helper process (see TestHelperProcess).
const (
	envRole     = "SLUICE_SEM_HELPER"   // "worker" or "holder"
	envAddrs    = "SLUICE_SEM_ADDRS"    // comma-separated Redis addresses
	envName     = "SLUICE_SEM_NAME"     // semaphore name
	envCapacity = "SLUICE_SEM_CAPACITY" // semaphore capacity
	envWeight   = "SLUICE_SEM_WEIGHT"   // holder: permits to take
	envLease    = "SLUICE_SEM_LEASE"    // holder: watchdog lease
	envCounter  = "SLUICE_SEM_COUNTER"  // worker: occupancy counter key
	envFair     = "SLUICE_SEM_FAIR"     // "1": Options.Fair
	envWeights  = "SLUICE_SEM_WEIGHTS"  // worker: comma-separated weights, one per goroutine in turn
	envOrder    = "SLUICE_SEM_ORDER"    // fairwaiter: list that records acquisitions
	envWaiters  = "SLUICE_SEM_WAITERS"  // fairwaiter: goroutines
)

const (
	workerGoroutines = 32
	workerRounds     = 4
)

// TestHelperProcess is not a test: it is the body of the processes that the
// multi-process tests start by running this test binary again.
func TestHelperProcess(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		t.Skip("helper process only")
	}
	addrs := strings.Split(os.Getenv(envAddrs), ",")
	capacity, _ := strconv.ParseInt(os.Getenv(envCapacity), 10, 64)
	opts := semaphore.Options{}
	if d, err := time.ParseDuration(os.Getenv(envLease)); err == nil {
		opts.WatchdogLease = d
	}
	opts.Fair = os.Getenv(envFair) == "1"
	e := newEnv(t, addrs, opts)
	s := e.sem(t, os.Getenv(envName), capacity)
	switch role {
	case "worker":
		weights := []int64{1}
		if ws := os.Getenv(envWeights); ws != "" {
			weights = weights[:0]
			for _, w := range strings.Split(ws, ",") {
				n, _ := strconv.ParseInt(w, 10, 64)
				weights = append(weights, n)
			}
		}
		peak, done := runWorker(t, e, s, os.Getenv(envCounter), weights)
		fmt.Printf("result peak=%d done=%d\n", peak, done)
	case "fairwaiter":
		waiters, _ := strconv.Atoi(os.Getenv(envWaiters))
		runFairWaiter(t, e, s, os.Getenv(envOrder), waiters)
		fmt.Println("done")
	case "holder":
		weight, _ := strconv.ParseInt(os.Getenv(envWeight), 10, 64)
		acquire(t, s, weight)
		fmt.Println("held")
		select {} // until kill -9
	default:
		t.Fatalf("unknown helper role %q", role)
	}
}

// runWorker runs goroutines that each take weights[i%len(weights)] permits
// at a time, add that weight to the shared occupancy counter while holding
// them, and release them. It returns the highest count seen and the rounds
// completed.
func runWorker(t *testing.T, e *env, s *semaphore.Semaphore, counter string, weights []int64) (peak, done int64) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range workerGoroutines {
		weight := weights[i%len(weights)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for range workerRounds {
				p, err := s.Acquire(ctx, weight)
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				n, err := e.client.Do(ctx, e.client.B().Incrby().Key(counter).Increment(weight).Build()).AsInt64()
				if err != nil {
					t.Errorf("INCRBY: %v", err)
				}
				time.Sleep(time.Millisecond) // the work the permit bounds
				if err := e.client.Do(ctx, e.client.B().Decrby().Key(counter).Decrement(weight).Build()).Error(); err != nil {
					t.Errorf("DECRBY: %v", err)
				}
				if err := p.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
				}
				mu.Lock()
				peak = max(peak, n)
				done++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return peak, done
}

// runFairWaiter runs goroutines that each Acquire one permit once, record
// the permit's id in the list order while holding it, and release it.
func runFairWaiter(t *testing.T, e *env, s *semaphore.Semaphore, order string, goroutines int) {
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p, err := s.Acquire(ctx, 1)
			if err != nil {
				t.Errorf("Acquire: %v", err)
				return
			}
			if err := e.client.Do(ctx, e.client.B().Rpush().Key(order).Element(p.ID()).Build()).Error(); err != nil {
				t.Errorf("RPUSH: %v", err)
			}
			if err := p.Release(ctx); err != nil {
				t.Errorf("Release: %v", err)
			}
		})
	}
	wg.Wait()
}

// helper is a started helper process.
type helper struct {
	cmd *exec.Cmd
	out *bufio.Scanner
}

func startHelper(t *testing.T, role string, env ...string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envRole+"="+role)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return &helper{cmd: cmd, out: bufio.NewScanner(stdout)}
}

// line returns the next output line starting with prefix, failing the test
// if the process ends first. The process's own test output is skipped.
func (h *helper) line(t *testing.T, prefix string) string {
	t.Helper()
	for h.out.Scan() {
		if l := h.out.Text(); strings.HasPrefix(l, prefix) {
			return l
		}
	}
	t.Fatalf("helper process ended without printing %q", prefix)
	return ""
}

func TestOccupancyAcrossProcesses(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		occupancy(t, addrs, false, "1", 5)
	})
}

// TestFairOccupancyAcrossProcesses: fair waiters of mixed weights in three
// processes, granted by the releases' pass through the queue, never hold
// more than the capacity together, and all get their turns.
func TestFairOccupancyAcrossProcesses(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		occupancy(t, addrs, true, "1,2,3,1", 3)
	})
}

// occupancy runs worker processes on one semaphore of capacity 5 and checks
// through their shared counter that the capacity was never exceeded and
// that at least minPeak permits were held at once (fewer would mean the
// semaphore under-grants: 96 goroutines keep it busy).
func occupancy(t *testing.T, addrs []string, fair bool, weights string, minPeak int64) {
	const capacity, procs = 5, 3
	e := newEnv(t, addrs, semaphore.Options{Fair: fair})
	name := uniqueName(t)
	counter := "sluice:test:occupancy:" + name
	env := []string{envAddrs + "=" + strings.Join(addrs, ","), envName + "=" + name,
		envCapacity + "=" + strconv.Itoa(capacity), envCounter + "=" + counter, envWeights + "=" + weights}
	if fair {
		env = append(env, envFair+"=1")
	}
	hs := make([]*helper, procs)
	for i := range hs {
		hs[i] = startHelper(t, "worker", env...)
	}
	var peak, done int64
	for _, h := range hs {
		var p, d int64
		l := h.line(t, "result ")
		if _, err := fmt.Sscanf(l, "result peak=%d done=%d", &p, &d); err != nil {
			t.Fatalf("helper printed %q: %v", l, err)
		}
		peak, done = max(peak, p), done+d
		for h.out.Scan() { // drain the rest so the process never blocks on a full pipe
		}
		if err := h.cmd.Wait(); err != nil {
			t.Fatalf("helper process: %v", err)
		}
	}
	if peak > capacity {
		t.Fatalf("peak occupancy %d, want at most %d", peak, capacity)
	}
	if peak < minPeak {
		t.Errorf("peak occupancy %d, want at least %d (permits left unused)", peak, minPeak)
	}
	if want := int64(procs * workerGoroutines * workerRounds); done != want {
		t.Fatalf("rounds done %d, want %d", done, want)
	}
	wantAvailable(t, e.sem(t, name, capacity), capacity)
	if got := e.keysLeft(t, name); got != 0 {
		t.Fatalf("keys left = %d, want 0", got)
	}
	e.client.Do(context.Background(), e.client.B().Del().Key(counter).Build())
}

func TestKilledHolderFreesPermits(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		const capacity, weight = 4, 3
		const leaseDur = time.Second
		e := newEnv(t, addrs, semaphore.Options{})
		name := uniqueName(t)
		h := startHelper(t, "holder",
			envAddrs+"="+strings.Join(addrs, ","), envName+"="+name,
			envCapacity+"="+strconv.Itoa(capacity), envWeight+"="+strconv.Itoa(weight),
			envLease+"="+leaseDur.String())
		h.line(t, "held")
		s := e.sem(t, name, capacity)
		wantAvailable(t, s, capacity-weight)

		if err := h.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		// The whole capacity comes back within one lease of the last
		// renewal, which was before the kill; a waiter for all of it is
		// woken by the expiry hint, as nobody releases.
		ctx, cancel := context.WithDeadline(context.Background(), killed.Add(leaseDur+time.Second))
		defer cancel()
		p, err := s.Acquire(ctx, capacity)
		if err != nil {
			t.Fatalf("Acquire(%d) within lease + 1s of kill -9: %v", capacity, err)
		}
		t.Logf("capacity back %v after kill -9 (lease %v)", time.Since(killed).Round(time.Millisecond), leaseDur)
		release(t, p)
		if got := e.keysLeft(t, name); got != 0 {
			t.Fatalf("keys left = %d, want 0", got)
		}
	})
}
