//go:build linux

// Package procs_test runs the mutex across several OS processes and stops
// them (SIGSTOP) while they hold the lock, for longer than its lease: the
// pause of a garbage collector, a VM or a swapped-out process, which no
// goroutine of one process can stage. The randomized harness runs every
// client in one process; here each worker is a process of its own (this
// test binary again), and the checks need no common clock but the
// machine's wall clock, which every process reads alike.
//
// What a stopped holder may not do once it runs again (mutex package doc,
// "Loss" and "Fencing tokens"):
//   - Valid reports true after another holder got the lock: Valid reads
//     the client clock, so a process resumed past its lease must see at
//     once that it holds nothing;
//   - Unlock returns nil after another holder got the lock: it would have
//     released a lock it did not hold;
//   - a later acquisition gets a token that is not greater.
//
// Each check holds whatever the scheduler does, so none depends on timing:
// "after" is judged by the wall-clock reading taken before a call and the
// one taken after the other process's call returned.
package procs_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// The worker's environment: the server, the primitive and the process's
// number. A process started with workerEnv set runs a worker, not the tests.
const (
	workerEnv = "SLUICE_PROCS_WORKER"
	addrEnv   = "SLUICE_PROCS_ADDR"
	kindEnv   = "SLUICE_PROCS_KIND"
)

// kind is what the workers contend for.
type kind struct {
	name     string
	sem      bool // a semaphore of capacity (else a Mutex)
	fair     bool
	capacity int // at most this many holds at once (1 for a Mutex)
}

var kinds = []kind{
	{name: "mutex", capacity: 1},
	{name: "fair-mutex", fair: true, capacity: 1},
	{name: "semaphore", sem: true, capacity: 2},
	{name: "fair-semaphore", sem: true, fair: true, capacity: 2},
}

// holdOf is one hold in a worker: a Mutex's or a Permit's.
type holdOf interface {
	Valid() bool
	token() int64 // the fencing token; 0 for a Permit
	release(ctx context.Context) error
}

type mutexHold struct{ *mutex.Mutex }

func (h mutexHold) token() int64                      { return h.Token() }
func (h mutexHold) release(ctx context.Context) error { return h.Unlock(ctx) }

type permitHold struct{ *semaphore.Permit }

func (h permitHold) token() int64                      { return 0 }
func (h permitHold) release(ctx context.Context) error { return h.Release(ctx) }

// lease is the workers' watchdog lease: short, so that a stop of a few
// leases is short too, and long enough (a renewal every 133 ms) for a
// loaded machine with -race to keep a running holder's lock.
const lease = 400 * time.Millisecond

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(worker())
	}
	redistest.Main(m)
}

// event is one call of a worker, as a JSON line on its stdout. Times are
// wall-clock Unix nanoseconds read before the call and after it returned.
type event struct {
	Proc  int    `json:"p"`
	Hold  int    `json:"h"` // the worker goroutine's hold number, with its G
	G     int    `json:"g"`
	Kind  string `json:"k"` // "lock", "valid" or "unlock"
	Call  int64  `json:"c"`
	Ret   int64  `json:"r"`
	OK    bool   `json:"ok"` // lock: acquired; valid: Valid's result; unlock: nil error
	Token int64  `json:"t,omitempty"`
	Err   string `json:"e,omitempty"`
}

// worker takes holds of the name "k" from two goroutines, each with a
// Mutex of its own per hold (or a permit of weight 1), until its stdin
// closes, and writes an event per call.
func worker() int {
	proc, _ := strconv.Atoi(os.Getenv(workerEnv))
	var k kind
	for _, x := range kinds {
		if x.name == os.Getenv(kindEnv) {
			k = x
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // the parent closes it to stop the run
		stop()
	}()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{os.Getenv(addrEnv)}, DisableCache: true})
	if err != nil {
		return fail(err)
	}
	defer client.Close()
	sc, err := scriptcache.New(ctx, client)
	if err != nil {
		return fail(err)
	}
	var acquire func(ctx context.Context) (holdOf, error)
	if k.sem {
		m, err := semaphore.NewManager(sc, semaphore.Options{WatchdogLease: lease, Fair: k.fair})
		if err != nil {
			return fail(err)
		}
		defer m.Close()
		sem, err := m.NewSemaphore("k", int64(k.capacity))
		if err != nil {
			return fail(err)
		}
		acquire = func(ctx context.Context) (holdOf, error) {
			p, err := sem.Acquire(ctx, 1)
			if err != nil {
				return nil, err
			}
			return permitHold{p}, nil
		}
	} else {
		l, err := mutex.NewLocker(sc, mutex.Options{WatchdogLease: lease, Fair: k.fair})
		if err != nil {
			return fail(err)
		}
		defer l.Close()
		acquire = func(ctx context.Context) (holdOf, error) {
			m, err := l.NewMutex("k")
			if err != nil {
				return nil, err
			}
			if err := m.Lock(ctx); err != nil {
				return nil, err
			}
			return mutexHold{m}, nil
		}
	}
	var out sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	emit := func(e event) {
		out.Lock()
		defer out.Unlock()
		_ = enc.Encode(e) // unbuffered: the parent reacts to each lock
	}
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() { holds(ctx, acquire, proc, g, emit) })
	}
	wg.Wait()
	return 0
}

func holds(ctx context.Context, acquire func(context.Context) (holdOf, error), proc, g int, emit func(event)) {
	now := func() int64 { return time.Now().UnixNano() }
	for hold := 0; ctx.Err() == nil; hold++ {
		e := event{Proc: proc, G: g, Hold: hold, Kind: "lock", Call: now()}
		actx, cancel := context.WithTimeout(ctx, 10*lease)
		h, err := acquire(actx)
		cancel()
		e.Ret, e.OK = now(), err == nil
		if err != nil {
			e.Err = err.Error()
			emit(e)
			continue
		}
		e.Token = h.token()
		emit(e)
		for range 1 + rand.IntN(4) {
			time.Sleep(time.Duration(20+rand.IntN(40)) * time.Millisecond)
			v := event{Proc: proc, G: g, Hold: hold, Kind: "valid", Call: now()}
			v.OK = h.Valid()
			v.Ret = now()
			emit(v)
		}
		// A release that fails for another reason than a loss leaves a
		// Mutex's hold counted and renewed: try again until it is settled.
		for try := 0; ; try++ {
			u := event{Proc: proc, G: g, Hold: hold, Kind: "unlock", Call: now()}
			err = h.release(context.Background())
			u.Ret, u.OK = now(), err == nil
			if err != nil {
				u.Err = err.Error()
			}
			if err == nil || errors.Is(err, mutex.ErrNotHeld) || errors.Is(err, semaphore.ErrNotHeld) || try == 20 {
				emit(u)
				break
			}
		}
	}
}

// hold is one acquisition as the parent reads it back.
type hold struct {
	lock   event
	valids []event
	unlock *event
}

func (h *hold) String() string {
	if h.lock.Token == 0 {
		return fmt.Sprintf("hold %d.%d.%d", h.lock.Proc, h.lock.G, h.lock.Hold)
	}
	return fmt.Sprintf("hold %d.%d.%d (token %d)", h.lock.Proc, h.lock.G, h.lock.Hold, h.lock.Token)
}

// reporter reports the first few violations of a run and counts the rest.
type reporter struct {
	t *testing.T
	n int
}

func (r *reporter) Errorf(format string, args ...any) {
	r.t.Helper()
	if r.n++; r.n <= 8 {
		r.t.Errorf(format, args...)
	}
}

func (r *reporter) done() {
	if r.n > 8 {
		r.t.Errorf("and %d more violations", r.n-8)
	}
}

func TestStoppedHolder(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel() // the pauses are most of a run: wait for them together
			run(t, redistest.NewServer(t).Addr(), k)
		})
	}
}

// run starts three workers and stops one of them for 1.5 to 4 leases
// right after it reports a lock, a pause at a time, until there have been
// minPauses such pauses and the workers have found at least minLost of
// their holds invalid (or the run's cap); then it checks every pair of
// holds.
func run(t *testing.T, addr string, k kind) {
	const (
		procs     = 3
		minLost   = 6
		minPauses = 8
		maxRun    = 40 * time.Second
	)
	type line struct {
		e   event
		err error
	}
	lines := make(chan line, 1024)
	var readers sync.WaitGroup
	cmds := make([]*exec.Cmd, procs)
	stdins := make([]io.WriteCloser, procs)
	stderrs := make([]*lockedBuffer, procs)
	for p := range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), workerEnv+"="+strconv.Itoa(p), addrEnv+"="+addr, kindEnv+"="+k.name)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		stderrs[p] = &lockedBuffer{}
		cmd.Stderr = stderrs[p]
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if stdins[p], err = cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[p] = cmd
		readers.Go(func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var e event
				err := json.Unmarshal(sc.Bytes(), &e)
				lines <- line{e, err}
			}
		})
	}
	go func() {
		readers.Wait()
		close(lines)
	}()
	stopped := make(map[int]bool) // processes stopped now; guarded by the loop
	resume := make(chan int)
	var pauses sync.WaitGroup
	var events []event
	lost, nPauses := 0, 0
	deadline := time.After(maxRun)
	ending := false
	end := func() {
		if !ending {
			ending = true
			for _, in := range stdins {
				_ = in.Close()
			}
		}
	}
	for in := (<-chan line)(lines); in != nil; {
		select {
		case l, ok := <-in:
			if !ok {
				in = nil
				continue
			}
			if l.err != nil {
				t.Errorf("worker output: %v", l.err)
				continue
			}
			events = append(events, l.e)
			switch {
			case l.e.Kind == "valid" && !l.e.OK:
				if lost++; lost >= minLost && nPauses >= minPauses {
					end()
				}
			case l.e.Kind == "lock" && l.e.OK && !ending && len(stopped) == 0:
				p := l.e.Proc
				d := time.Duration(float64(lease) * (1.5 + 2.5*rand.Float64()))
				if err := cmds[p].Process.Signal(syscall.SIGSTOP); err != nil {
					t.Fatalf("SIGSTOP worker %d: %v", p, err)
				}
				stopped[p] = true
				nPauses++
				pauses.Go(func() {
					time.Sleep(d) // the length of the pause is the fault itself
					resume <- p
				})
			}
		case p := <-resume:
			if err := cmds[p].Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatalf("SIGCONT worker %d: %v", p, err)
			}
			delete(stopped, p)
		case <-deadline:
			end()
		}
		if ending {
			// Resume every stopped worker so that it can see its stdin close.
			for p := range stopped {
				_ = cmds[p].Process.Signal(syscall.SIGCONT)
				delete(stopped, p)
			}
		}
	}
	go func() {
		for range resume { // pauses that ended after the loop
		}
	}()
	for p, cmd := range cmds {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		if err := cmd.Wait(); err != nil {
			t.Errorf("worker %d: %v\n%s", p, err, stderrs[p].String())
		}
	}
	pauses.Wait()
	close(resume)
	holds := collect(t, events, !k.sem)
	t.Logf("%s: %d holds, %d pauses of a holder, %d Valid calls that found the hold gone", k.name, len(holds), nPauses, lost)
	if lost == 0 {
		t.Errorf("no hold was found invalid in %v: the run never tested a stopped holder", maxRun)
	}
	r := &reporter{t: t}
	if !k.sem {
		checkTokens(r, holds)
	}
	checkCapacity(r, holds, k.capacity)
	r.done()
}

// collect groups the events by hold, in the order of their locks. With
// tokens, every hold has one.
func collect(t *testing.T, events []event, tokens bool) []*hold {
	type id struct{ p, g, h int }
	byID := make(map[id]*hold)
	var holds []*hold
	for _, e := range events {
		k := id{e.Proc, e.G, e.Hold}
		switch e.Kind {
		case "lock":
			if !e.OK {
				continue
			}
			if tokens && e.Token == 0 {
				t.Errorf("lock %d.%d.%d returned nil with token 0", e.Proc, e.G, e.Hold)
			}
			h := &hold{lock: e}
			byID[k] = h
			holds = append(holds, h)
		case "valid":
			if h := byID[k]; h != nil {
				h.valids = append(h.valids, e)
			}
		case "unlock":
			if h := byID[k]; h != nil {
				h.unlock = &e
			}
		}
	}
	return holds
}

// checkTokens judges every pair of holds a, b where b's lock was granted after
// a's: by token (a stopped holder's Lock may return after a later one), or,
// for the token check itself, by a's Lock returning before b's was called.
// It reports each kind of fault once per hold, with the earliest b.
func checkTokens(t *reporter, holds []*hold) {
	for _, a := range holds {
		var validAfter, unlockAfter *hold
		for _, b := range holds {
			if a == b {
				continue
			}
			if a.lock.Ret < b.lock.Call && a.lock.Token >= b.lock.Token {
				t.Errorf("fencing: %v was granted after %v returned, with a token not greater", b, a)
			}
			if b.lock.Token <= a.lock.Token {
				continue
			}
			// b got the lock after a, and held it from b.lock.Ret on.
			for _, v := range a.valids {
				if v.OK && v.Call > b.lock.Ret && (validAfter == nil || b.lock.Ret < validAfter.lock.Ret) {
					validAfter = b
				}
			}
			if u := a.unlock; u != nil && u.OK && u.Call > b.lock.Ret && (unlockAfter == nil || b.lock.Ret < unlockAfter.lock.Ret) {
				unlockAfter = b
			}
		}
		if validAfter != nil {
			t.Errorf("%v: Valid returned true after %v had the lock", a, validAfter)
		}
		if unlockAfter != nil {
			t.Errorf("%v: Unlock returned nil after %v had the lock", a, unlockAfter)
		}
	}
}

// checkCapacity judges what each hold was certainly holding at the
// server: from the return of its Lock or Acquire (the grant came before)
// to the call of its last Valid that returned true (the server's lease
// ends after the client's) or of a release that returned nil (the release
// ran after). A Valid that returned true while capacity other holds were
// certainly held, or a hold that began inside capacity others, puts more
// holders than the capacity at the server at once.
func checkCapacity(t *reporter, holds []*hold, capacity int) {
	type span struct {
		h          *hold
		start, end int64
	}
	var spans []span
	for _, h := range holds {
		end := int64(0)
		for _, v := range h.valids {
			if v.OK {
				end = max(end, v.Call)
			}
		}
		if u := h.unlock; u != nil && u.OK {
			end = max(end, u.Call)
		}
		if end > h.lock.Ret {
			spans = append(spans, span{h, h.lock.Ret, end})
		}
	}
	inside := func(self *hold, from, to int64) []*hold {
		var in []*hold
		for _, s := range spans {
			if s.h != self && s.start < from && s.end > to {
				in = append(in, s.h)
			}
		}
		return in
	}
	for _, h := range holds {
		for _, v := range h.valids {
			if in := inside(h, v.Call, v.Ret); v.OK && len(in) >= capacity {
				t.Errorf("%v: Valid returned true while %v held (capacity %d)", h, in, capacity)
				break
			}
		}
	}
	for _, s := range spans {
		if in := inside(s.h, s.start, s.start); len(in) >= capacity {
			t.Errorf("%v held while %v held (capacity %d)", s.h, in, capacity)
		}
	}
}

// lockedBuffer is a worker's stderr, read after it exits.
type lockedBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
