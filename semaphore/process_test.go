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
	e := newEnv(t, addrs, opts)
	s := e.sem(t, os.Getenv(envName), capacity)
	switch role {
	case "worker":
		peak, done := runWorker(t, e, s, os.Getenv(envCounter))
		fmt.Printf("result peak=%d done=%d\n", peak, done)
	case "holder":
		weight, _ := strconv.ParseInt(os.Getenv(envWeight), 10, 64)
		acquire(t, s, weight)
		fmt.Println("held")
		select {} // until kill -9
	default:
		t.Fatalf("unknown helper role %q", role)
	}
}

// runWorker runs goroutines that each take one permit at a time, count
// themselves in the shared occupancy counter while holding it, and release
// it. It returns the highest count seen and the rounds completed.
func runWorker(t *testing.T, e *env, s *semaphore.Semaphore, counter string) (peak, done int64) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range workerGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for range workerRounds {
				p, err := s.Acquire(ctx, 1)
				if err != nil {
					t.Errorf("Acquire: %v", err)
					return
				}
				n, err := e.client.Do(ctx, e.client.B().Incr().Key(counter).Build()).AsInt64()
				if err != nil {
					t.Errorf("INCR: %v", err)
				}
				time.Sleep(time.Millisecond) // the work the permit bounds
				if err := e.client.Do(ctx, e.client.B().Decr().Key(counter).Build()).Error(); err != nil {
					t.Errorf("DECR: %v", err)
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
		const capacity, procs = 5, 3
		e := newEnv(t, addrs, semaphore.Options{})
		name := uniqueName(t)
		counter := "sluice:test:occupancy:" + name
		hs := make([]*helper, procs)
		for i := range hs {
			hs[i] = startHelper(t, "worker",
				envAddrs+"="+strings.Join(addrs, ","), envName+"="+name,
				envCapacity+"="+strconv.Itoa(capacity), envCounter+"="+counter)
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
		// 96 goroutines on 5 permits keep them all busy: fewer would mean
		// the semaphore under-grants.
		if peak < capacity {
			t.Errorf("peak occupancy %d, want %d (permits left unused)", peak, capacity)
		}
		if want := int64(procs * workerGoroutines * workerRounds); done != want {
			t.Fatalf("rounds done %d, want %d", done, want)
		}
		wantAvailable(t, e.sem(t, name, capacity), capacity)
		if got := e.keysLeft(t, name); got != 0 {
			t.Fatalf("keys left = %d, want 0", got)
		}
		e.client.Do(context.Background(), e.client.B().Del().Key(counter).Build())
	})
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
