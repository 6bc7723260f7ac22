package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
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
// never more than the capacity at once.
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
		if n, _ := srv.Do("GET", "kill:running"); n == "2" {
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

	// The killed jobs never count themselves out; start the count afresh
	// for the jobs that follow.
	if _, err := srv.Do("DEL", "kill:running"); err != nil {
		t.Fatal(err)
	}
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
