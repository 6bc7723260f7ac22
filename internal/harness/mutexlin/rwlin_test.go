package mutexlin_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

// Operations of a read-write lock history.
const (
	rwAcquire  = "lock"    // tok: the fencing token
	rwRelease  = "unlock"  // tok: the token given back
	rwBusy     = "trylock" // a TryLock turned away
	rwRAcquire = "rlock"
	rwRRelease = "runlock"
)

type rwOp struct {
	op  string
	tok int64
}

// rwState is the sequential specification of a read-write lock with
// fencing tokens: the writer's token (0: none), the number of readers and
// the last token issued.
type rwState struct {
	writer, readers, last int64
}

// rwModel accepts a history only if there is one order of its operations,
// consistent with real time, in which a writer acquires only when there is
// no writer and no reader, with a token above every earlier one; a reader
// only when there is no writer; releases match holds; and a TryLock is
// turned away only while someone holds. A failed TryRLock is not recorded:
// the writer-waiting mark may refuse it while the lock is free, by design.
var rwModel = porcupine.Model{
	Init: func() any { return rwState{} },
	Step: func(state, input, _ any) (bool, any) {
		s, in := state.(rwState), input.(rwOp)
		switch in.op {
		case rwAcquire:
			if s.writer != 0 || s.readers != 0 || in.tok <= s.last {
				return false, s
			}
			return true, rwState{writer: in.tok, last: in.tok}
		case rwRelease:
			if s.writer == 0 || s.writer != in.tok {
				return false, s
			}
			return true, rwState{readers: s.readers, last: s.last}
		case rwRAcquire:
			if s.writer != 0 {
				return false, s
			}
			return true, rwState{readers: s.readers + 1, last: s.last}
		case rwRRelease:
			if s.readers == 0 {
				return false, s
			}
			return true, rwState{writer: s.writer, readers: s.readers - 1, last: s.last}
		case rwBusy:
			return s.writer != 0 || s.readers != 0, s
		}
		return false, s
	},
	DescribeOperation: func(input, _ any) string {
		in := input.(rwOp)
		return fmt.Sprintf("%s(%d)", in.op, in.tok)
	},
	DescribeState: func(state any) string {
		s := state.(rwState)
		return fmt.Sprintf("writer %d, %d readers, last token %d", s.writer, s.readers, s.last)
	},
}

func TestRWModel(t *testing.T) {
	op := func(client int, name string, tok, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: rwOp{name, tok}, Call: call, Return: ret}
	}
	for _, c := range []struct {
		name string
		hist []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"readers-share", []porcupine.Operation{
			op(0, rwRAcquire, 0, 0, 1), op(1, rwRAcquire, 0, 0, 1), op(2, rwBusy, 0, 2, 3),
			op(0, rwRRelease, 0, 4, 5), op(1, rwRRelease, 0, 4, 5), op(2, rwAcquire, 7, 6, 7),
		}, porcupine.Ok},
		{"reader-under-writer", []porcupine.Operation{
			op(0, rwAcquire, 7, 0, 1), op(1, rwRAcquire, 0, 2, 3), op(0, rwRelease, 7, 4, 5),
		}, porcupine.Illegal},
		{"writer-under-reader", []porcupine.Operation{
			op(0, rwRAcquire, 0, 0, 1), op(1, rwAcquire, 7, 2, 3), op(0, rwRRelease, 0, 4, 5),
		}, porcupine.Illegal},
		{"token-goes-back", []porcupine.Operation{
			op(0, rwAcquire, 9, 0, 1), op(0, rwRelease, 9, 2, 3), op(1, rwAcquire, 8, 4, 5),
		}, porcupine.Illegal},
		{"busy-while-free", []porcupine.Operation{
			op(0, rwRAcquire, 0, 0, 1), op(0, rwRRelease, 0, 2, 3), op(1, rwBusy, 0, 4, 5),
		}, porcupine.Illegal},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := porcupine.CheckOperationsTimeout(rwModel, c.hist, 10*time.Second); got != c.want {
				t.Errorf("got %s, want %s", got, c.want)
			}
		})
	}
}

// recordRW runs goroutines, each with a Locker and client of its own (as
// processes would have), that take write and read holds of one name, and
// returns the history. Locks run the scripts in fsys (nil: the real ones).
func recordRW(t *testing.T, addrs []string, name string, fsys fs.FS) []porcupine.Operation {
	const workers, ops = 6, 24
	base := time.Now()
	stamp := func() int64 { return int64(time.Since(base)) }
	var mu sync.Mutex
	var hist []porcupine.Operation
	var wg sync.WaitGroup
	for w := range workers {
		client := redistest.Client(t, addrs...)
		var opts []scriptcache.Option
		if fsys != nil {
			opts = append(opts, scriptcache.WithFS(fsys))
		}
		sc, err := scriptcache.New(context.Background(), client, opts...)
		if err != nil {
			t.Fatal(err)
		}
		l, err := mutex.NewLocker(sc, mutex.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		rw := newRW(t, l, name)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 4*signal)
			defer cancel()
			var mine []porcupine.Operation
			do := func(op string, fn func() (int64, error)) bool {
				call := stamp()
				tok, err := fn()
				if err != nil {
					t.Errorf("worker %d: %s: %v", w, op, err)
					return false
				}
				mine = append(mine, porcupine.Operation{ClientId: w, Input: rwOp{op, tok}, Call: call, Return: stamp()})
				return true
			}
			for i := range ops {
				if (w+i)%3 != 0 {
					if !do(rwRAcquire, func() (int64, error) { return 0, rw.RLock(ctx) }) {
						break
					}
					time.Sleep(time.Millisecond) // reading: the scenario
					if !do(rwRRelease, func() (int64, error) { return 0, rw.RUnlock(ctx) }) {
						break
					}
					continue
				}
				if i%2 == 0 {
					call := stamp()
					err := rw.TryLock(ctx)
					//nolint:gocritic // ifElseChain: a switch would make each break leave the switch, not the loop
					if errors.Is(err, mutex.ErrNotObtained) {
						mine = append(mine, porcupine.Operation{ClientId: w, Input: rwOp{rwBusy, 0}, Call: call, Return: stamp()})
						if !do(rwAcquire, func() (int64, error) { err := rw.Lock(ctx); return rw.Token(), err }) {
							break
						}
					} else if err != nil {
						t.Errorf("worker %d: TryLock: %v", w, err)
						break
					} else {
						mine = append(mine, porcupine.Operation{ClientId: w, Input: rwOp{rwAcquire, rw.Token()}, Call: call, Return: stamp()})
					}
				} else if !do(rwAcquire, func() (int64, error) { err := rw.Lock(ctx); return rw.Token(), err }) {
					break
				}
				time.Sleep(time.Millisecond) // writing: the scenario
				tok := rw.Token()
				if !do(rwRelease, func() (int64, error) { return tok, rw.Unlock(ctx) }) {
					break
				}
			}
			mu.Lock()
			hist = append(hist, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return hist
}

// TestRWLinearizable checks histories of the real RWMutex against rwModel,
// and requires a mutated script (readers let in under a writer) to be
// caught, so that a passing check means something.
func TestRWLinearizable(t *testing.T) {
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			hist := recordRW(t, tg.addrs(t), "rw-lin:"+t.Name(), nil)
			res, info := porcupine.CheckOperationsVerbose(rwModel, hist, time.Minute)
			if res != porcupine.Ok {
				where := "(no visualization)"
				if f, err := os.CreateTemp("", "sluice-rw-linearizability-*.html"); err == nil {
					if porcupine.Visualize(rwModel, info, f) == nil {
						where = f.Name()
					}
					f.Close()
				}
				t.Fatalf("history of %d operations is %s; visualization: %s", len(hist), res, where)
			}
		})
	}
	t.Run("mutant", func(t *testing.T) {
		const cut = "  if held then\n    return {0, e - now, 0}\n  end\n"
		hist := recordRW(t, []string{redistest.Single(t).Addr()}, "rw-lin-mutant", redistest.MutatedScripts(t, "rwmutex_rlock", cut, ""))
		if res := porcupine.CheckOperationsTimeout(rwModel, hist, time.Minute); res != porcupine.Illegal {
			t.Fatalf("history with readers let in under a writer is %s, want Illegal: the check is vacuous", res)
		}
	})
}

// TestMultiLinearizable: goroutines with Lockers of their own lock
// overlapping sets, listed in different orders, and single names through
// plain Mutexes. Each name's history (its acquisitions and releases, with
// the tokens, timed by the calls that made them) must be that of one lock
// with increasing tokens: sets and single locks exclude each other.
func TestMultiLinearizable(t *testing.T) {
	const workers, rounds, ring = 6, 12, 4
	for _, tg := range realTargets {
		t.Run(tg.name, func(t *testing.T) {
			addrs := tg.addrs(t)
			p := "multi-lin:" + t.Name() + ":"
			base := time.Now()
			stamp := func() int64 { return int64(time.Since(base)) }
			var mu sync.Mutex
			hists := map[string][]porcupine.Operation{}
			var wg sync.WaitGroup
			for w := range workers {
				l := newLocker(t, redistest.Client(t, addrs...), mutex.Options{})
				// lock, unlock and tokens of this worker's set (one name
				// for every third worker, through a plain Mutex).
				var lock, unlock func(context.Context) error
				var names func() []string
				var tokens func() []int64
				if w%3 == 2 {
					m := newMutex(t, l, p+strconv.Itoa(w%ring))
					lock, unlock = m.Lock, m.Unlock
					names = func() []string { return []string{m.Name()} }
					tokens = func() []int64 { return []int64{m.Token()} }
				} else {
					set := []string{p + strconv.Itoa(w%ring), p + strconv.Itoa((w+1)%ring), p + strconv.Itoa((w+2)%ring)}
					if w%2 == 1 {
						slices.Reverse(set)
					}
					mm := newMulti(t, l, set)
					lock, unlock, names, tokens = mm.Lock, mm.Unlock, mm.Names, mm.Tokens
				}
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 4*signal)
					defer cancel()
					mine := map[string][]porcupine.Operation{}
					record := func(op string, call int64, toks []int64) {
						ret := stamp()
						for i, name := range names() {
							mine[name] = append(mine[name], porcupine.Operation{ClientId: w, Input: rwOp{op, toks[i]}, Call: call, Return: ret})
						}
					}
					for range rounds {
						call := stamp()
						if err := lock(ctx); err != nil {
							t.Errorf("worker %d: lock: %v", w, err)
							break
						}
						toks := tokens()
						record(rwAcquire, call, toks)
						time.Sleep(time.Millisecond) // working: the scenario
						call = stamp()
						if err := unlock(ctx); err != nil {
							t.Errorf("worker %d: unlock: %v", w, err)
							break
						}
						record(rwRelease, call, toks)
					}
					mu.Lock()
					for name, ops := range mine {
						hists[name] = append(hists[name], ops...)
					}
					mu.Unlock()
				})
			}
			wg.Wait()
			if len(hists) != ring {
				t.Fatalf("histories of %d names, want %d", len(hists), ring)
			}
			for name, hist := range hists {
				if res := porcupine.CheckOperationsTimeout(rwModel, hist, time.Minute); res != porcupine.Ok {
					t.Errorf("%s: history of %d operations is %s", name, len(hist), res)
				}
			}
		})
	}
}
