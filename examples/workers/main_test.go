package main

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/redistest"
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
