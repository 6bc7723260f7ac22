package mutex_test

// Multi-process tests of RWMutex and MultiMutex: they re-run this test
// binary as helper processes (TestRWHelperProcess), as mutex_test.go does
// for Mutex.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

const envRWRole = "SLUICE_RW_HELPER"

// rwHelper prepares a helper process running role with args; its stdout
// is returned as a line scanner once started.
func rwHelper(t *testing.T, role string, addrs []string, args ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestRWHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envRWRole+"="+role, "SLUICE_RW_ADDRS="+strings.Join(addrs, ","),
		"SLUICE_RW_ARGS="+strings.Join(args, ","))
	cmd.Stderr = os.Stderr
	// The helper ends when its stdin closes, whatever happens to this
	// process.
	if _, err := cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, bufio.NewScanner(out)
}

// TestRWHelperProcess is not a test: it is the body of helper processes.
func TestRWHelperProcess(t *testing.T) {
	role := os.Getenv(envRWRole)
	if role == "" {
		t.Skip("helper process body")
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: strings.Split(os.Getenv("SLUICE_RW_ADDRS"), ","), DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	args := strings.Split(os.Getenv("SLUICE_RW_ARGS"), ",")
	ctx := context.Background()
	sc := newScripts(t, client)
	opts := mutex.Options{}
	if role == "reader" || role == "writer" {
		opts.WatchdogLease = 400 * time.Millisecond
	}
	l, err := mutex.NewLocker(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	switch role {
	case "rwexcl":
		rwExclusionWorker(t, client, l, args)
	case "multi":
		multiWorker(t, client, l, args)
	case "reader":
		rw, _ := l.NewRWMutex(args[0])
		if err := rw.RLock(ctx); err != nil {
			t.Fatal(err)
		}
		fmt.Println("held")
		io.Copy(io.Discard, os.Stdin) // until killed, or the parent goes
	case "writer":
		rw, _ := l.NewRWMutex(args[0])
		if err := rw.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("token %d\n", rw.Token())
		select {
		case <-rw.Lost():
			fmt.Printf("lost %v\n", rw.Err())
		case <-time.After(signal):
			fmt.Println("not told")
		}
	}
}

// rwExclusionWorker runs goroutines that mix reads and writes of one
// read-write lock and checks, through counters in Redis, that a writer is
// alone and a reader sees no writer. It prints how many writes it made
// and how many violations it saw.
func rwExclusionWorker(t *testing.T, client rueidis.Client, l *mutex.Locker, args []string) {
	ctx := context.Background()
	name := args[0]
	goroutines, _ := strconv.Atoi(args[1])
	rounds, _ := strconv.Atoi(args[2])
	counter, writers, readers := "{"+name+"}:counter", "{"+name+"}:writers", "{"+name+"}:readers"
	incr := func(key string, by int64) int64 {
		n, _ := client.Do(ctx, client.B().Incrby().Key(key).Increment(by).Build()).AsInt64()
		return n
	}
	get := func(key string) int64 {
		n, _ := client.Do(ctx, client.B().Get().Key(key).Build()).AsInt64()
		return n
	}
	var writes, bad atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rw, _ := l.NewRWMutex(name)
			for j := range rounds {
				if (g+j)%3 == 0 {
					if err := rw.Lock(ctx); err != nil {
						t.Error(err)
						return
					}
					if incr(writers, 1) != 1 || get(readers) != 0 {
						bad.Add(1)
					}
					v := get(counter)
					client.Do(ctx, client.B().Set().Key(counter).Value(strconv.FormatInt(v+1, 10)).Build())
					writes.Add(1)
					incr(writers, -1)
					if err := rw.Unlock(ctx); err != nil {
						t.Error(err)
						return
					}
				} else {
					if err := rw.RLock(ctx); err != nil {
						t.Error(err)
						return
					}
					incr(readers, 1)
					if get(writers) != 0 {
						bad.Add(1)
					}
					incr(readers, -1)
					if err := rw.RUnlock(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("writes %d bad %d\n", writes.Load(), bad.Load())
}

// multiWorker locks overlapping sets of names, listed in the order given,
// and counts times a name had another holder.
func multiWorker(t *testing.T, client rueidis.Client, l *mutex.Locker, args []string) {
	ctx := context.Background()
	rounds, _ := strconv.Atoi(args[0])
	sets := strings.Split(args[1], ";")
	var bad atomic.Int64
	var wg sync.WaitGroup
	for _, set := range sets {
		names := strings.Split(set, "+")
		wg.Go(func() {
			mm, err := l.NewMultiMutex(names)
			if err != nil {
				t.Error(err)
				return
			}
			for range rounds {
				if err := mm.Lock(ctx); err != nil {
					t.Error(err)
					return
				}
				for _, name := range names {
					if n, _ := client.Do(ctx, client.B().Incr().Key("{"+name+"}:holders").Build()).AsInt64(); n != 1 {
						bad.Add(1)
					}
				}
				for _, name := range names {
					client.Do(ctx, client.B().Decr().Key("{"+name+"}:holders").Build())
				}
				if err := mm.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("bad %d\n", bad.Load())
}

func TestRWExclusionAcrossProcesses(t *testing.T) {
	const procs, goroutines, rounds = 3, 4, 12
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			addrs := tg.addrs(t)
			name := "rwexcl:" + tg.name + strconv.Itoa(rand.IntN(1e9))
			var cmds []*exec.Cmd
			var outs []*bufio.Scanner
			for range procs {
				cmd, out := rwHelper(t, "rwexcl", addrs, name, strconv.Itoa(goroutines), strconv.Itoa(rounds))
				cmds, outs = append(cmds, cmd), append(outs, out)
			}
			var writes int64
			for i, cmd := range cmds {
				for outs[i].Scan() {
					var w, bad int64
					if _, err := fmt.Sscanf(outs[i].Text(), "writes %d bad %d", &w, &bad); err == nil {
						writes += w
						if bad != 0 {
							t.Errorf("process %d saw %d sections sharing with a writer", i, bad)
						}
					}
				}
				if err := cmd.Wait(); err != nil {
					t.Fatalf("helper %d: %v", i, err)
				}
			}
			client := redistest.Client(t, addrs...)
			got, err := client.Do(context.Background(), client.B().Get().Key("{"+name+"}:counter").Build()).AsInt64()
			if err != nil || got != writes || writes == 0 {
				t.Fatalf("counter = %d, %v; want %d (lost updates mean two writers at once)", got, err, writes)
			}
		})
	}
}

// TestMultiAcrossProcesses: processes lock overlapping sets of names on a
// cluster, each set listed in the opposite order in the next process. All
// finish (no deadlock) and no name has two holders.
func TestMultiAcrossProcesses(t *testing.T) {
	addrs := redistest.SharedCluster(t).Addrs()
	p := "mproc" + strconv.Itoa(rand.IntN(1e9)) + ":"
	n := func(i int) string { return p + strconv.Itoa(i%5) }
	var cmds []*exec.Cmd
	var outs []*bufio.Scanner
	for proc := range 3 {
		var sets []string
		for g := range 2 {
			set := []string{n(proc + g), n(proc + g + 1), n(proc + g + 2)}
			if (proc+g)%2 == 1 {
				slices.Reverse(set)
			}
			sets = append(sets, strings.Join(set, "+"))
		}
		cmd, out := rwHelper(t, "multi", addrs, "10", strings.Join(sets, ";"))
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	timer := time.AfterFunc(4*signal, func() {
		for _, cmd := range cmds {
			cmd.Process.Kill()
		}
	})
	defer timer.Stop()
	for i, cmd := range cmds {
		for outs[i].Scan() {
			if bad, ok := strings.CutPrefix(outs[i].Text(), "bad "); ok && bad != "0" {
				t.Errorf("process %d saw %s names with two holders", i, bad)
			}
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper %d: %v (killed after %v means a deadlock)", i, err, 4*signal)
		}
	}
}

// TestRWKilledReader: a reader process is killed (kill -9) while it holds;
// a writer gets in once its lease has run out, not never.
func TestRWKilledReader(t *testing.T) {
	srv := redistest.Single(t)
	name := "rw-killed:" + strconv.Itoa(rand.IntN(1e9))
	cmd, out := rwHelper(t, "reader", []string{srv.Addr()}, name)
	if !out.Scan() || out.Text() != "held" {
		t.Fatalf("reader said %q", out.Text())
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	w := newRW(t, newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{}), name)
	ctx, cancel := context.WithTimeout(context.Background(), signal)
	defer cancel()
	if err := w.Lock(ctx); err != nil {
		t.Fatalf("writer held out by a killed reader: %v", err)
	}
	w.Unlock(context.Background())
}

// TestRWPausedWriter stops a writer process (SIGSTOP) past its lease:
// another process gets the write lock with a larger token, and the writer,
// when it runs again, learns that it lost the lock.
func TestRWPausedWriter(t *testing.T) {
	srv := redistest.Single(t)
	name := "rw-paused:" + strconv.Itoa(rand.IntN(1e9))
	cmd, out := rwHelper(t, "writer", []string{srv.Addr()}, name)
	if !out.Scan() {
		t.Fatal("writer printed nothing")
	}
	first, err := strconv.ParseInt(strings.TrimPrefix(out.Text(), "token "), 10, 64)
	if err != nil {
		t.Fatalf("writer said %q", out.Text())
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), signal)
	defer cancel()
	w := newRW(t, newLocker(t, redistest.Client(t, srv.Addr()), mutex.Options{}), name)
	err = w.Lock(ctx)
	cmd.Process.Signal(syscall.SIGCONT)
	if err != nil {
		t.Fatalf("write lock of a paused writer never freed: %v", err)
	}
	if w.Token() <= first {
		t.Errorf("new token %d, want > the paused writer's %d", w.Token(), first)
	}
	if !out.Scan() || !strings.HasPrefix(out.Text(), "lost ") {
		t.Fatalf("resumed writer said %q, want it to know it lost the lock", out.Text())
	}
	if err := w.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
}
