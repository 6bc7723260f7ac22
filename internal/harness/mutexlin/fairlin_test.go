package mutexlin_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// Operations of a fair lock's history. The API does not show when a
// waiting Lock joins the queue, so the recorder watches the queue from
// outside: an enqueue is known to have happened between the Lock call and
// the reply of the first read of the queue that listed its attempt.
const (
	fairEnqueue = "enqueue"
	fairAcquire = "lock"
	fairRelease = "unlock"
)

type fairOp struct {
	op     string
	worker int
}

// fairState is the sequential specification of a fair lock: who holds it
// (-1: nobody) and the queue, worker numbers in arrival order.
type fairState struct {
	holder int
	queue  string // worker numbers, one byte each
}

// fairModel accepts a history only if there is one order of its operations,
// consistent with real time, in which the lock goes to the head of the
// queue whenever anyone is queued, to a Lock that did not queue only when
// nobody is, never to two holders at once, and waiters join the queue at
// its tail. So it rejects barging (a newcomer taking the lock past queued
// waiters), grants out of arrival order, and double grants.
var fairModel = porcupine.Model{
	Init: func() any { return fairState{holder: -1} },
	Step: func(state, input, _ any) (bool, any) {
		s, in := state.(fairState), input.(fairOp)
		me := string(rune('a' + in.worker))
		switch in.op {
		case fairEnqueue:
			if s.holder == in.worker || strings.Contains(s.queue, me) {
				return false, s
			}
			return true, fairState{holder: s.holder, queue: s.queue + me}
		case fairAcquire:
			if s.holder != -1 {
				return false, s
			}
			switch {
			case s.queue == "":
				return true, fairState{holder: in.worker}
			case s.queue[:1] == me:
				return true, fairState{holder: in.worker, queue: s.queue[1:]}
			}
			return false, s
		case fairRelease:
			if s.holder != in.worker {
				return false, s
			}
			return true, fairState{holder: -1, queue: s.queue}
		}
		return false, s
	},
	DescribeOperation: func(input, _ any) string {
		in := input.(fairOp)
		return fmt.Sprintf("%s(%d)", in.op, in.worker)
	},
	DescribeState: func(state any) string {
		s := state.(fairState)
		return fmt.Sprintf("holder %d, queue %q", s.holder, s.queue)
	},
}

func TestFairModel(t *testing.T) {
	op := func(w int, name string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: w, Input: fairOp{name, w}, Call: call, Return: ret}
	}
	for _, c := range []struct {
		name string
		hist []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"in-order", []porcupine.Operation{
			op(0, fairAcquire, 0, 1), op(1, fairEnqueue, 2, 3), op(2, fairEnqueue, 4, 5),
			op(0, fairRelease, 6, 7), op(1, fairAcquire, 2, 8), op(1, fairRelease, 9, 10), op(2, fairAcquire, 4, 11),
		}, porcupine.Ok},
		{"out-of-order", []porcupine.Operation{
			op(0, fairAcquire, 0, 1), op(1, fairEnqueue, 2, 3), op(2, fairEnqueue, 4, 5),
			op(0, fairRelease, 6, 7), op(2, fairAcquire, 4, 8), op(2, fairRelease, 9, 10), op(1, fairAcquire, 2, 11),
		}, porcupine.Illegal},
		{"barging", []porcupine.Operation{
			op(0, fairAcquire, 0, 1), op(1, fairEnqueue, 2, 3),
			op(0, fairRelease, 4, 5), op(2, fairAcquire, 6, 7), op(2, fairRelease, 8, 9), op(1, fairAcquire, 2, 10),
		}, porcupine.Illegal},
		{"overlapping-enqueues-either-order", []porcupine.Operation{
			op(0, fairAcquire, 0, 1), op(1, fairEnqueue, 2, 5), op(2, fairEnqueue, 3, 4),
			op(0, fairRelease, 6, 7), op(2, fairAcquire, 3, 8), op(2, fairRelease, 9, 10), op(1, fairAcquire, 2, 11),
		}, porcupine.Ok},
		{"two-holders", []porcupine.Operation{
			op(0, fairAcquire, 0, 1), op(1, fairAcquire, 2, 3), op(0, fairRelease, 4, 5),
		}, porcupine.Illegal},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := porcupine.CheckOperationsTimeout(fairModel, c.hist, 10*time.Second); got != c.want {
				t.Errorf("got %s, want %s", got, c.want)
			}
		})
	}
}

// fairPoll reads a fair lock's queue in one step: the attempt ids in queue
// order, each followed by its entry ("expiry_ms owner", false if none).
const fairPoll = `local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
local out = {}
for i, id in ipairs(ids) do
  out[2 * i - 1] = id
  out[2 * i] = redis.call('HGET', KEYS[2], id)
end
return out`

// handoffs records, per worker, whether its last acquisition was handed
// over by a release (Event.Handoff).
type handoffs struct{ last atomic.Bool }

func (h *handoffs) Observe(e scriptcache.Event) {
	if e.Kind == scriptcache.EventAcquired {
		h.last.Store(e.Handoff)
	}
}

// recordFair runs workers, each with a client and fair Locker of its own
// (as processes would have), that lock one name, hold it 3 ms and
// unlock it, while a poller reads the queue; it returns the history. Locks
// run the scripts in fsys (nil: the real ones).
func recordFair(t *testing.T, addrs []string, name string, fsys fs.FS) []porcupine.Operation {
	const workers, rounds = 5, 12
	base := time.Now()
	stamp := func() int64 { return int64(time.Since(base)) }

	type lockCall struct{ call, ret int64 }
	calls := make([][]lockCall, workers)
	handed := make([][]bool, workers)
	var mu sync.Mutex
	var hist []porcupine.Operation
	var wg sync.WaitGroup
	done := make(chan struct{})
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
		l, err := mutex.NewLocker(sc, mutex.Options{Fair: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		m := newMutex(t, l, name, mutex.WithOwner("w"+strconv.Itoa(w)))
		wg.Go(func() {
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 4*signal)
			defer cancel()
			var mine []porcupine.Operation
			for range rounds {
				call := stamp()
				if err := m.Lock(ctx); err != nil {
					t.Errorf("worker %d: lock: %v", w, err)
					break
				}
				ret := stamp()
				calls[w] = append(calls[w], lockCall{call, ret})
				handed[w] = append(handed[w], h.last.Load())
				mine = append(mine, porcupine.Operation{ClientId: w, Input: fairOp{fairAcquire, w}, Call: call, Return: ret})
				time.Sleep(3 * time.Millisecond) // working: the scenario, long enough for a queue to form
				call = stamp()
				if err := m.Unlock(ctx); err != nil {
					t.Errorf("worker %d: unlock: %v", w, err)
					break
				}
				mine = append(mine, porcupine.Operation{ClientId: w, Input: fairOp{fairRelease, w}, Call: call, Return: stamp()})
			}
			mu.Lock()
			hist = append(hist, mine...)
			mu.Unlock()
		})
	}

	// seen: when an attempt was first read in the queue (the reply of that
	// read), by owner and attempt number (Lock calls of a Mutex number
	// their attempts 1, 2, ...).
	type attempt struct {
		owner string
		seq   int
	}
	seen := map[attempt]int64{}
	poller := redistest.Client(t, addrs...)
	k := lockKey(name)
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
			vals, err := poller.Do(ctx, poller.B().Eval().Script(fairPoll).Numkeys(2).Key(k+":q", k+":e").Build()).ToArray()
			ret := stamp()
			if first {
				close(start) // the queue is watched from now on
			}
			if err != nil {
				polled <- err
				return
			}
			for i := 0; i+1 < len(vals); i += 2 {
				id, _ := vals[i].ToString()
				entry, err := vals[i+1].ToString()
				if err != nil {
					continue // no entry: being granted or dropped
				}
				_, owner, _ := strings.Cut(entry, " ")
				dot := strings.LastIndexByte(id, '.')
				seq, err := strconv.Atoi(id[dot+1:])
				if dot < 0 || err != nil {
					polled <- fmt.Errorf("attempt id %q", id)
					return
				}
				if _, ok := seen[attempt{owner, seq}]; !ok {
					seen[attempt{owner, seq}] = ret
				}
			}
		}
	}()
	wg.Wait()
	close(done)
	if err := <-polled; err != nil {
		t.Fatal(err)
	}

	queued, synthesized := 0, 0
	for w := range workers {
		for i, c := range calls[w] {
			ret, ok := seen[attempt{"w" + strconv.Itoa(w), i + 1}]
			switch {
			case ok:
				queued++
			case handed[w][i]:
				// Handed over, so it was queued, but between two reads:
				// it joined somewhere in the Lock call.
				ret = c.ret
				synthesized++
			default:
				continue
			}
			hist = append(hist, porcupine.Operation{ClientId: w, Input: fairOp{fairEnqueue, w}, Call: c.call, Return: ret})
		}
	}
	t.Logf("%d operations; %d enqueues read in the queue, %d inferred from a hand-off", len(hist), queued, synthesized)
	if queued == 0 {
		t.Fatal("no waiter was ever read in the queue: the scenario did not make anyone wait")
	}
	return hist
}

// TestFairLinearizable checks histories of real fair Mutexes against
// fairModel, single and cluster, and requires a mutated script (newcomers
// queued at the head, so the last to come is served first) to be caught.
func TestFairLinearizable(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			hist := recordFair(t, tg.addrs(t), "fair-lin:"+t.Name(), nil)
			res, info := porcupine.CheckOperationsVerbose(fairModel, hist, time.Minute)
			if res != porcupine.Ok {
				where := "(no visualization)"
				if f, err := os.CreateTemp("", "sluice-fair-linearizability-*.html"); err == nil {
					if porcupine.Visualize(fairModel, info, f) == nil {
						where = f.Name()
					}
					f.Close()
				}
				t.Fatalf("history of %d operations is %s; visualization: %s", len(hist), res, where)
			}
		})
	}
	t.Run("mutant", func(t *testing.T) {
		// A newcomer's entry is scored one below the head's instead of
		// one above the tail's.
		hist := recordFair(t, []string{redistest.Single(t).Addr()}, "fair-lin-mutant",
			redistest.MutatedScripts(t, "mutex_lock",
				"redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]", "redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')[2]",
				"(tonumber(last) or 0) + 1", "(tonumber(last) or 0) - 1"))
		if res := porcupine.CheckOperationsTimeout(fairModel, hist, time.Minute); res != porcupine.Illegal {
			t.Fatalf("history with waiters served last-come-first is %s, want Illegal: the check is vacuous", res)
		}
	})
}
