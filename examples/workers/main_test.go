package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

// TestMain lets the test binary be a worker process: run starts
// os.Executable() with workerEnv set and the worker's flags.
func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		c, err := parseFlags(os.Args[1:])
		if err == nil {
			_, err = work(context.Background(), c, os.Stdout)
		}
		if err != nil {
			os.Stderr.WriteString("worker: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestWorkers runs the program: 3 processes of 3 workers share a capacity
// of 2. Every job is done once, and no process ever saw more than 2 jobs
// running at once across all of them.
func TestWorkers(t *testing.T) {
	srv := redistest.NewServer(t)
	c := config{redis: srv.Addr(), procs: 3, workers: 3, capacity: 2, jobs: 24, job: 20 * time.Millisecond, prefix: "test:"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	got, err := run(ctx, c, &out)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if got.Done != c.jobs {
		t.Errorf("%d jobs done, want %d", got.Done, c.jobs)
	}
	if got.Peak < 1 || got.Peak > c.capacity {
		t.Errorf("at most %d jobs running at once, want 1 to %d", got.Peak, c.capacity)
	}
	if n, err := srv.Do("LLEN", "test:queue"); err != nil || n != "0" {
		t.Errorf("queue left with %s jobs (%v), want 0", n, err)
	}
}

// TestKilledWorker kills (SIGKILL) a worker process while it holds both
// permits of the pool: its jobs never end and it releases nothing, yet the
// jobs queued after it all run, once its permits' lease has run out, and
// never more than the capacity at once, counting the killed ones.
func TestKilledWorker(t *testing.T) {
	srv := redistest.NewServer(t)
	c := config{redis: srv.Addr(), workers: 2, capacity: 2, job: time.Minute, lease: 500 * time.Millisecond, prefix: "kill:"}
	if _, err := srv.Do("RPUSH", "kill:queue", "long-1", "long-2"); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, c.workerArgs()...)
	cmd.Env = append(os.Environ(), workerEnv+"=1")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if n, _ := srv.Do("ZCARD", "kill:running"); n == "2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker process never ran its two jobs")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()

	// The killed jobs never count themselves out: their entries stop
	// counting when their permits' lease ends, before the permits can go
	// to the jobs that follow, which never see more than the capacity.
	if _, err := srv.Do("RPUSH", "kill:queue", "1", "2", "3", "4", "5", "6"); err != nil {
		t.Fatal(err)
	}
	c.job = 10 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := work(ctx, c, io.Discard)
	if err != nil {
		t.Fatalf("work after the kill: %v (the killed process's permits never came back?)", err)
	}
	if got.Done != 6 || got.Peak > c.capacity {
		t.Errorf("after the kill: %d jobs done, at most %d at once; want 6, at most %d", got.Done, got.Peak, c.capacity)
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestKillChild is what a user does by hand to see the README's promise:
// kill -9 one of the processes run started, in the middle of a job. The
// others go on once its permits' lease has run out; the parent reports the
// killed process, prints its summary (never more jobs at once than the
// capacity) and returns an error; the queue is worked to the end; and
// every key the program leaves has a TTL. Before, the parent stopped
// without a summary, and the counter of running jobs stayed for ever,
// still counting the killed jobs (a later process reported 4 at once with
// a capacity of 3).
func TestKillChild(t *testing.T) {
	srv := redistest.NewServer(t)
	c := config{redis: srv.Addr(), procs: 3, workers: 2, capacity: 2, jobs: 30, job: 150 * time.Millisecond, lease: time.Second, prefix: "killchild:"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out syncBuffer
	type result struct {
		t   tally
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := run(ctx, c, &out)
		done <- result{got, err}
	}()
	// The pid of process 0, from run's output, and then one of its jobs
	// running: an entry of the running set with its permit's owner label.
	pidRE := regexp.MustCompile(`(?m)^process 0: pid (\d+)$`)
	var pid int
	waitFor(t, "process 0's pid", func() bool {
		m := pidRE.FindStringSubmatch(out.String())
		if m != nil {
			pid, _ = strconv.Atoi(m[1])
		}
		return m != nil
	})
	waitFor(t, "a job of process 0", func() bool {
		members, _ := srv.Do("ZRANGE", "killchild:running", "0", "-1")
		return strings.Contains(members, "/pid-"+strconv.Itoa(pid))
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var res result
	select {
	case res = <-done:
	case <-time.After(50 * time.Second):
		t.Fatalf("run still going 50 s after the kill; output:\n%s", out.String())
	}
	text := out.String()
	t.Logf("output:\n%s", text)
	if res.err == nil || !strings.Contains(res.err.Error(), fmt.Sprintf("process 0 (pid %d): signal: killed", pid)) {
		t.Errorf("run = %v; want an error saying process 0 (pid %d) was killed", res.err, pid)
	}
	for _, want := range []string{
		fmt.Sprintf("process 0 (pid %d): signal: killed; the jobs it did are not counted, those it had in flight are lost", pid),
		"3 processes x 2 workers did ",
		"; 1 of 3 processes failed",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	if res.t.Peak < 1 || res.t.Peak > c.capacity {
		t.Errorf("at most %d jobs running at once, want 1 to %d", res.t.Peak, c.capacity)
	}
	if n, err := srv.Do("LLEN", "killchild:queue"); err != nil || n != "0" {
		t.Errorf("queue left with %s jobs (%v), want 0", n, err)
	}
	keys, err := srv.Do("KEYS", "killchild:*")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range strings.Fields(keys) {
		if ttl, err := srv.Do("PTTL", k); err != nil || ttl == "-1" {
			t.Errorf("key %s left with PTTL %s (%v): without a TTL", k, ttl, err)
		}
	}
}

// waitFor polls cond until it holds, or fails the test after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 20 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
