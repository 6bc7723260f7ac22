package semlin_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// Operations of a fair semaphore's history, all of weight 1 (so that
// fairness is plain arrival order: a head of weight 1 always fits when a
// permit is free). The API does not show when a waiting Acquire joins the
// queue, so the recorder watches the queue from outside: an enqueue is
// known to have happened between the Acquire call and the reply of the
// first read of the queue that listed its waiter.
const (
	semEnqueue = "enqueue"
	semAcquire = "acquire"
	semRelease = "release"
)

type semOp struct {
	op     string
	worker int
}

// semState is the sequential specification of a fair semaphore of
// capacity semCapacity: permits held and the queue, worker numbers in
// arrival order.
type semState struct {
	held  int
	queue string // worker numbers, one byte each
}

const semCapacity = 2

// semFairModel accepts a history only if there is one order of its
// operations, consistent with real time, in which a permit goes to the
// head of the queue whenever anyone is queued, to an Acquire that did not
// queue only when nobody is, never beyond the capacity, and waiters join
// the queue at its tail.
var semFairModel = porcupine.Model{
	Init: func() any { return semState{} },
	Step: func(state, input, _ any) (bool, any) {
		s, in := state.(semState), input.(semOp)
		me := string(rune('a' + in.worker))
		switch in.op {
		case semEnqueue:
			if strings.Contains(s.queue, me) {
				return false, s
			}
			return true, semState{held: s.held, queue: s.queue + me}
		case semAcquire:
			if s.held == semCapacity {
				return false, s
			}
			switch {
			case s.queue == "":
				return true, semState{held: s.held + 1}
			case s.queue[:1] == me:
				return true, semState{held: s.held + 1, queue: s.queue[1:]}
			}
			return false, s
		case semRelease:
			if s.held == 0 {
				return false, s
			}
			return true, semState{held: s.held - 1, queue: s.queue}
		}
		return false, s
	},
	DescribeOperation: func(input, _ any) string {
		in := input.(semOp)
		return fmt.Sprintf("%s(%d)", in.op, in.worker)
	},
	DescribeState: func(state any) string {
		s := state.(semState)
		return fmt.Sprintf("%d held, queue %q", s.held, s.queue)
	},
}

func TestSemFairModel(t *testing.T) {
	op := func(w int, name string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: w, Input: semOp{name, w}, Call: call, Return: ret}
	}
	for _, c := range []struct {
		name string
		hist []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"in-order", []porcupine.Operation{
			op(0, semAcquire, 0, 1), op(1, semAcquire, 0, 1), op(2, semEnqueue, 2, 3), op(3, semEnqueue, 4, 5),
			op(0, semRelease, 6, 7), op(2, semAcquire, 2, 8), op(1, semRelease, 9, 10), op(3, semAcquire, 4, 11),
		}, porcupine.Ok},
		{"out-of-order", []porcupine.Operation{
			op(0, semAcquire, 0, 1), op(1, semAcquire, 0, 1), op(2, semEnqueue, 2, 3), op(3, semEnqueue, 4, 5),
			op(0, semRelease, 6, 7), op(3, semAcquire, 4, 8), op(1, semRelease, 9, 10), op(2, semAcquire, 2, 11),
		}, porcupine.Illegal},
		{"barging", []porcupine.Operation{
			op(0, semAcquire, 0, 1), op(1, semAcquire, 0, 1), op(2, semEnqueue, 2, 3),
			op(0, semRelease, 4, 5), op(3, semAcquire, 6, 7), op(1, semRelease, 8, 9), op(2, semAcquire, 2, 10),
		}, porcupine.Illegal},
		{"over-capacity", []porcupine.Operation{
			op(0, semAcquire, 0, 1), op(1, semAcquire, 0, 1), op(2, semAcquire, 2, 3),
		}, porcupine.Illegal},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := porcupine.CheckOperationsTimeout(semFairModel, c.hist, 10*time.Second); got != c.want {
				t.Errorf("got %s, want %s", got, c.want)
			}
		})
	}
}

// handoffs records whether a worker's last acquisition was handed over by
// a release (Event.Handoff).
type handoffs struct{ last atomic.Bool }

func (h *handoffs) Observe(e scriptcache.Event) {
	if e.Kind == scriptcache.EventAcquired {
		h.last.Store(e.Handoff)
	}
}

// recordSemFair runs workers, each with a client and fair Manager of its
// own (as processes would have), that acquire a permit of one semaphore of
// capacity semCapacity, hold it 3 ms and release it, while a
// poller reads the queue; it returns the history. Managers run the scripts
// in fsys (nil: the real ones).
func recordSemFair(t *testing.T, addrs []string, name string, fsys fs.FS) []porcupine.Operation {
	const workers, rounds = 6, 10
	base := time.Now()
	stamp := func() int64 { return int64(time.Since(base)) }

	type acquisition struct {
		id        string
		call, ret int64
		handoff   bool
	}
	acqs := make([][]acquisition, workers)
	var mu sync.Mutex
	var hist []porcupine.Operation
	var wg sync.WaitGroup
	start := make(chan struct{}) // closed once the poller has read the queue once
	for w := range workers {
		client := redistest.Client(t, addrs...)
		h := new(handoffs)
		opts := []scriptcache.Option{scriptcache.WithObserver(h)}
		if fsys != nil {
			opts = append(opts, scriptcache.WithFS(fsys))
		}
		sc, err := scriptcache.New(context.Background(), client, opts...)
		if err != nil {
			t.Fatal(err)
		}
		mgr, err := semaphore.NewManager(sc, semaphore.Options{Fair: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(mgr.Close)
		s, err := mgr.NewSemaphore(name, semCapacity)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 4*signalWait)
			defer cancel()
			var mine []porcupine.Operation
			for range rounds {
				call := stamp()
				p, err := s.Acquire(ctx, 1)
				if err != nil {
					t.Errorf("worker %d: acquire: %v", w, err)
					break
				}
				ret := stamp()
				acqs[w] = append(acqs[w], acquisition{p.ID(), call, ret, h.last.Load()})
				mine = append(mine, porcupine.Operation{ClientId: w, Input: semOp{semAcquire, w}, Call: call, Return: ret})
				time.Sleep(3 * time.Millisecond) // working: the scenario, long enough for a queue to form
				call = stamp()
				if err := p.Release(ctx); err != nil {
					t.Errorf("worker %d: release: %v", w, err)
					break
				}
				mine = append(mine, porcupine.Operation{ClientId: w, Input: semOp{semRelease, w}, Call: call, Return: stamp()})
			}
			mu.Lock()
			hist = append(hist, mine...)
			mu.Unlock()
		})
	}

	// seen: when a waiter id was first read in the queue (the reply of
	// that read).
	seen := map[string]int64{}
	poller := redistest.Client(t, addrs...)
	q := keyspace.Key(semaphore.DefaultPrefix, name, ":q")
	done := make(chan struct{})
	polled := make(chan error, 1)
	go func() {
		ctx := context.Background()
		for first := true; ; first = false {
			select {
			case <-done:
				polled <- nil
				return
			default:
			}
			ids, err := poller.Do(ctx, poller.B().Zrange().Key(q).Min("0").Max("-1").Build()).AsStrSlice()
			ret := stamp()
			if first {
				close(start) // the queue is watched from now on
			}
			if err != nil {
				polled <- err
				return
			}
			for _, id := range ids {
				if _, ok := seen[id]; !ok {
					seen[id] = ret
				}
			}
		}
	}()
	wg.Wait()
	close(done)
	if err := <-polled; err != nil {
		t.Fatal(err)
	}

	queued, inferred := 0, 0
	for w := range workers {
		for _, a := range acqs[w] {
			ret, ok := seen[a.id]
			switch {
			case ok:
				queued++
			case a.handoff:
				// Granted by a release, so it was queued, but between
				// two reads: it joined somewhere in the Acquire call.
				ret = a.ret
				inferred++
			default:
				continue
			}
			hist = append(hist, porcupine.Operation{ClientId: w, Input: semOp{semEnqueue, w}, Call: a.call, Return: ret})
		}
	}
	t.Logf("%d operations; %d enqueues read in the queue, %d inferred from a hand-off", len(hist), queued, inferred)
	if queued == 0 {
		t.Fatal("no waiter was ever read in the queue: the scenario did not make anyone wait")
	}
	return hist
}

// TestFairLinearizable checks histories of real fair semaphores against
// semFairModel, single and cluster, and requires a mutated script
// (newcomers queued at the head) to be caught.
func TestFairLinearizable(t *testing.T) {
	forTargets(t, func(t *testing.T, addrs []string) {
		hist := recordSemFair(t, addrs, uniqueName(t), nil)
		res, info := porcupine.CheckOperationsVerbose(semFairModel, hist, time.Minute)
		if res != porcupine.Ok {
			where := "(no visualization)"
			if f, err := os.CreateTemp("", "sluice-sem-fair-*.html"); err == nil {
				if porcupine.Visualize(semFairModel, info, f) == nil {
					where = f.Name()
				}
				f.Close()
			}
			t.Fatalf("history of %d operations is %s; visualization: %s", len(hist), res, where)
		}
	})
	t.Run("mutant", func(t *testing.T) {
		// A newcomer is scored one below the head instead of one above
		// the tail.
		hist := recordSemFair(t, []string{redistest.Single(t).Addr()}, uniqueName(t),
			redistest.MutatedScripts(t, "semaphore_queue",
				"redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]", "redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')[2]",
				"(tonumber(last) or 0) + 1", "(tonumber(last) or 0) - 1"))
		if res := porcupine.CheckOperationsTimeout(semFairModel, hist, time.Minute); res != porcupine.Illegal {
			t.Fatalf("history with waiters served last-come-first is %s, want Illegal: the check is vacuous", res)
		}
	})
}
