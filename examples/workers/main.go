// Command workers runs a pool of workers spread over several processes,
// at most -capacity of which work at once across all of them: each job is
// done under a permit of one sluice semaphore, on a go-redis client. A
// process that dies holding permits gives them back when their lease ends.
//
//	go run ./workers -redis 127.0.0.1:6379
//
// It starts -procs copies of itself, each with -workers goroutines that
// take jobs from a Redis list, and prints each one's pid. Every job enters
// itself in a Redis set of running jobs for as long as its permit holds;
// each process reports the most entries it saw, which never exceeds the
// capacity. A copy started by hand with -procs 0 works the same queue as
// one more process. Kill one with kill -9 (run prints their pids): its
// permits come back within -lease and the others go on; the parent reports
// the killed process (its jobs in flight are lost), prints its summary and
// exits with status 1.
// Every key the program leaves has a TTL: the queue an hour, the set of
// running jobs a lease.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice/goredis"
	"github.com/sluicekit/sluice/semaphore"
)

// config is what the command line sets.
type config struct {
	redis    string        // host:port of Redis
	procs    int           // processes to start; 0 works in this one
	workers  int           // goroutines per process
	capacity int           // jobs running at once, across all processes
	jobs     int           // jobs queued at the start
	job      time.Duration // how long one job takes
	lease    time.Duration // permits' watchdog lease
	prefix   string        // starts every Redis key
}

// workerArgs are the flags of a worker process started by run.
func (c config) workerArgs() []string {
	return []string{"-procs", "0", "-redis", c.redis, "-workers", strconv.Itoa(c.workers),
		"-capacity", strconv.Itoa(c.capacity), "-job", c.job.String(), "-lease", c.lease.String(), "-prefix", c.prefix}
}

func (c config) key(name string) string { return c.prefix + name }

func main() {
	c, err := parseFlags(os.Args[1:])
	if err != nil {
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if c.procs == 0 {
		_, err = work(ctx, c, os.Stdout)
	} else {
		_, err = run(ctx, c, os.Stdout)
	}
	if err != nil {
		log.Fatal(err)
	}
}

func parseFlags(args []string) (config, error) {
	c := config{}
	fs := flag.NewFlagSet("workers", flag.ContinueOnError)
	fs.StringVar(&c.redis, "redis", "127.0.0.1:6379", "Redis `host:port`")
	fs.IntVar(&c.procs, "procs", 3, "processes to start; 0 joins the pool as a worker process")
	fs.IntVar(&c.workers, "workers", 4, "worker goroutines per process")
	fs.IntVar(&c.capacity, "capacity", 3, "jobs running at once, across all processes")
	fs.IntVar(&c.jobs, "jobs", 30, "jobs to queue")
	fs.DurationVar(&c.job, "job", 50*time.Millisecond, "how long one job takes")
	fs.DurationVar(&c.lease, "lease", 10*time.Second, "permit lease, renewed while a job runs: a killed process's permits come back within it")
	fs.StringVar(&c.prefix, "prefix", "example:workers:", "start of every Redis key")
	return c, fs.Parse(args)
}

// tally is what workers report: jobs done, and the most jobs seen running
// at once.
type tally struct{ Done, Peak int }

// run queues the jobs, starts the worker processes, and adds up what they
// report.
func run(ctx context.Context, c config, out io.Writer) (tally, error) {
	rdb := redis.NewClient(&redis.Options{Addr: c.redis})
	defer rdb.Close()
	jobs := make([]any, c.jobs)
	for i := range jobs {
		jobs[i] = i
	}
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, c.key("queue"), c.key("running"))
		p.RPush(ctx, c.key("queue"), jobs...)
		// Left behind if every process is killed: it goes on its own.
		p.PExpire(ctx, c.key("queue"), queueTTL)
		return nil
	})
	if err != nil {
		return tally{}, fmt.Errorf("redis %s: %w", c.redis, err)
	}

	self, err := os.Executable()
	if err != nil {
		return tally{}, err
	}
	start := time.Now()
	var mu sync.Mutex // guards out, total and errs
	var total tally
	var errs []error
	var wg sync.WaitGroup
	for i := range c.procs {
		cmd := exec.CommandContext(ctx, self, c.workerArgs()...)
		cmd.Env = append(os.Environ(), workerEnv+"=1")
		cmd.Stderr = os.Stderr
		var stdout strings.Builder
		cmd.Stdout = &stdout
		if err := cmd.Start(); err != nil {
			mu.Lock()
			errs = append(errs, fmt.Errorf("process %d: %w", i, err))
			mu.Unlock()
			break // the ones started still work the queue
		}
		mu.Lock()
		fmt.Fprintf(out, "process %d: pid %d\n", i, cmd.Process.Pid)
		mu.Unlock()
		wg.Go(func() {
			err := cmd.Wait()
			var t tally
			for l := range strings.Lines(stdout.String()) {
				if _, err := fmt.Sscanf(l, "done %d peak %d", &t.Done, &t.Peak); err == nil {
					break
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				// Killed, say: the jobs it had taken are lost, and its
				// permits come back when their lease ends, so the
				// others go on.
				fmt.Fprintf(out, "process %d (pid %d): %v; the jobs it did are not counted, those it had in flight are lost\n", i, cmd.Process.Pid, err)
				errs = append(errs, fmt.Errorf("process %d (pid %d): %w", i, cmd.Process.Pid, err))
				return
			}
			fmt.Fprintf(out, "process %d (pid %d): %d jobs, at most %d running at once\n", i, cmd.Process.Pid, t.Done, t.Peak)
			total.Done += t.Done
			total.Peak = max(total.Peak, t.Peak)
		})
	}
	wg.Wait()
	fmt.Fprintf(out, "%d processes x %d workers did %d of %d jobs in %s, at most %d at once (capacity %d)",
		c.procs, c.workers, total.Done, c.jobs, time.Since(start).Round(time.Millisecond), total.Peak, c.capacity)
	if len(errs) > 0 {
		fmt.Fprintf(out, "; %d of %d processes failed", len(errs), c.procs)
	}
	fmt.Fprintln(out)
	return total, errors.Join(errs...)
}

// queueTTL is how long the queue of jobs lasts at most, so that a run whose
// processes were all killed leaves nothing behind for ever.
const queueTTL = time.Hour

// workerEnv marks a process started by run, for the test binary.
const workerEnv = "WORKERS_CHILD"

// work is one worker process: c.workers goroutines that take jobs from the
// queue, each under a permit, until it is empty. It prints and returns its
// tally.
func work(ctx context.Context, c config, out io.Writer) (tally, error) {
	rdb := redis.NewClient(&redis.Options{Addr: c.redis})
	defer rdb.Close()
	sc, err := goredis.New(ctx, rdb)
	if err != nil {
		return tally{}, fmt.Errorf("redis %s: %w", c.redis, err)
	}
	// One Manager per process: it renews the permits of every job running
	// here every third of the lease, and Close waits for its goroutines. A
	// process killed with kill -9 renews nothing, so its permits come back
	// when their lease ends.
	mgr, err := semaphore.NewManager(sc, semaphore.Options{WatchdogLease: c.lease, Prefix: c.prefix})
	if err != nil {
		return tally{}, err
	}
	defer mgr.Close()
	c.lease, _ = mgr.Lease() // the default if -lease was 0
	// The owner label shows in Holders, and in the ids of the permits, so
	// an operator can tell whose they are.
	sem, err := mgr.NewSemaphore("jobs", int64(c.capacity), semaphore.WithOwner(owner()))
	if err != nil {
		return tally{}, err
	}

	var mu sync.Mutex
	var t tally
	errs := make([]error, c.workers)
	var wg sync.WaitGroup
	for i := range c.workers {
		wg.Go(func() {
			for {
				done, running, err := job(ctx, c, rdb, sem)
				if err != nil || !done {
					errs[i] = err
					return
				}
				mu.Lock()
				t.Done++
				t.Peak = max(t.Peak, running)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fmt.Fprintf(out, "done %d peak %d\n", t.Done, t.Peak)
	return t, errors.Join(errs...)
}

// owner labels the permits of this process: "pid-" and its pid.
func owner() string { return "pid-" + strconv.Itoa(os.Getpid()) }

// job takes a permit, then a job, and does it. It returns done false when
// the queue is empty, and how many jobs were running, this one included.
func job(ctx context.Context, c config, rdb *redis.Client, sem *semaphore.Semaphore) (done bool, running int, err error) {
	p, err := sem.Acquire(ctx, 1)
	if err != nil {
		return false, 0, err
	}
	defer func() {
		// Giving back a permit that expired (this process was stopped
		// past its lease) is no error of the job's.
		if rerr := p.Release(ctx); rerr != nil && !errors.Is(rerr, semaphore.ErrNotHeld) {
			err = errors.Join(err, rerr)
		}
	}()
	if err := rdb.LPop(ctx, c.key("queue")).Err(); errors.Is(err, redis.Nil) {
		return false, 0, nil
	} else if err != nil {
		return false, 0, err
	}
	n, err := enter(ctx, c, rdb, p)
	if err != nil {
		return false, 0, err
	}
	defer rdb.ZRem(context.WithoutCancel(ctx), c.key("running"), p.ID())
	// The entry lasts as long as the permit: renewed as the permit is.
	renew := time.NewTicker(c.lease / 3)
	defer renew.Stop()
	work := time.After(c.job)
	for { // the work itself
		select {
		case <-work:
			return true, n, nil
		case <-renew.C:
			if _, err := enter(ctx, c, rdb, p); err != nil {
				return false, n, err
			}
		case <-p.Lost(): // the permit expired or was taken away: stop
			return false, n, fmt.Errorf("permit lost: %w", p.Err())
		case <-ctx.Done():
			return false, n, ctx.Err()
		}
	}
}

// enter adds the job of permit p to the set of running jobs, or renews its
// entry there, and returns how many entries the set has. An entry counts
// until the permit's HeldUntil, which is before the permit expires: the
// job of a process killed with kill -9 stops counting before its permit
// can go to another job, so the count never exceeds the capacity unless
// the semaphore does. The set itself expires a lease after its last entry
// was made or renewed. (Entries end on this machine's clock: run the
// processes on machines whose clocks agree.)
func enter(ctx context.Context, c config, rdb *redis.Client, p *semaphore.Permit) (int, error) {
	key := c.key("running")
	var card *redis.IntCmd
	_, err := rdb.TxPipelined(ctx, func(tx redis.Pipeliner) error {
		tx.ZRemRangeByScore(ctx, key, "-inf", strconv.FormatInt(time.Now().UnixMilli(), 10))
		tx.ZAdd(ctx, key, redis.Z{Score: float64(p.HeldUntil().UnixMilli()), Member: p.ID()})
		tx.PExpire(ctx, key, c.lease)
		card = tx.ZCard(ctx, key)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return int(card.Val()), nil
}
