package semaphore_test

import (
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/semaphore"
)

// commandCalls returns the calls= count of each command in INFO
// commandstats (commands scripts run are counted too), and as NAME:usec
// the microseconds the server spent in it.
func commandCalls(t testing.TB, srv *redistest.Server) map[string]int64 {
	t.Helper()
	info, err := srv.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	calls := make(map[string]int64)
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		calls[name] = n
		if _, usec, ok := strings.Cut(rest, "usec="); ok {
			n, _ = strconv.ParseInt(usec[:strings.IndexByte(usec, ',')], 10, 64)
			calls[name+":usec"] = n
		}
	}
	return calls
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// envOr reads a setting of the held-permits workload.
func envOr[T any](t *testing.T, name string, def T, parse func(string) (T, error)) T {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := parse(s)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return v
}

// TestHeldPermits is the held-permits workload of issue 12, the
// semaphore's TestHeldLeases: N permits of one each, of N/PER semaphores,
// held on one server for a period at a given watchdog lease, reporting
// renewal script calls/s, permits renewed/s, false losses, heap per held
// permit and goroutines. It runs only with SLUICE_LONG=1:
//
//	SLUICE_LONG=1 SLUICE_REQUIRE_REDIS=1 go test -run TestHeldPermits -v ./semaphore/
//
// SLUICE_HELD (default 100000), SLUICE_HELD_PER_SEM (permits per
// semaphore, 100), SLUICE_HELD_LEASE (3s) and SLUICE_HELD_FOR (10s) change
// the workload. SLUICE_HELD_PROFILE=FILE writes a heap profile while the
// permits are held.
func TestHeldPermits(t *testing.T) {
	if os.Getenv("SLUICE_LONG") == "" {
		t.Skip("a long workload: set SLUICE_LONG=1")
	}
	n := envOr(t, "SLUICE_HELD", 100000, strconv.Atoi)
	perSem := envOr(t, "SLUICE_HELD_PER_SEM", 100, strconv.Atoi)
	watchdog := envOr(t, "SLUICE_HELD_LEASE", 3*time.Second, time.ParseDuration)
	holdFor := envOr(t, "SLUICE_HELD_FOR", 10*time.Second, time.ParseDuration)
	if perSem < 1 || n%perSem != 0 {
		t.Fatalf("SLUICE_HELD=%d is not a multiple of SLUICE_HELD_PER_SEM=%d", n, perSem)
	}

	srv := redistest.NewServer(t)
	e := newEnv(t, []string{srv.Addr()}, semaphore.Options{WatchdogLease: watchdog})
	goroutines := runtime.NumGoroutine()
	heap0 := heapInUse()
	ss := make([]*semaphore.Semaphore, n/perSem)
	for i, name := range batchNames("held:", len(ss), false) {
		ss[i] = e.sem(t, name, int64(perSem))
	}
	heap1 := heapInUse()
	start := time.Now()
	ps := acquireEach(t, ss, perSem)
	t.Logf("%d permits of %d semaphores taken in %v", n, len(ss), time.Since(start).Round(time.Millisecond))
	heap2 := heapInUse()
	if path := os.Getenv("SLUICE_HELD_PROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.WriteHeapProfile(f); err != nil { // what the held permits keep, for go tool pprof
			t.Fatal(err)
		}
		f.Close()
	}
	t.Logf("heap: %d B per Semaphore, %d B per held permit; goroutines: %d before, %d holding",
		(heap1-heap0)/uint64(len(ss)), (heap2-heap1)/uint64(n), goroutines, runtime.NumGoroutine())

	before := commandCalls(t, srv)
	holdStart := time.Now()
	time.Sleep(holdFor) // the workload: holding
	held := time.Since(holdStart)
	after := commandCalls(t, srv)
	lost := lostPermits(ps)
	scripts := after["evalsha"] + after["eval"] - before["evalsha"] - before["eval"]
	renewed := after["zadd"] - before["zadd"] // one ZADD per permit renewed, nothing else runs
	usec := after["evalsha:usec"] + after["eval:usec"] - before["evalsha:usec"] - before["eval:usec"]
	t.Logf("held %d permits at a %v watchdog lease for %v: %.0f renewal script calls/s, %.0f permits renewed/s (%.0f per call), %d false losses; goroutines %d",
		n, watchdog, held.Round(time.Millisecond), float64(scripts)/held.Seconds(), float64(renewed)/held.Seconds(),
		float64(renewed)/max(1, float64(scripts)), len(lost), runtime.NumGoroutine())
	t.Logf("server time in renewal scripts: %.0f us per call, %.1f%% of the period",
		float64(usec)/max(1, float64(scripts)), float64(usec)/float64(held.Microseconds())*100)
	if len(lost) > 0 {
		t.Errorf("%d of %d held permits lost, first %s: %v", len(lost), n, ps[lost[0]].ID(), ps[lost[0]].Err())
	}
	if scripts*20 > renewed {
		t.Errorf("%d renewal calls for %d permits renewed, want at least 20x fewer", scripts, renewed)
	}
	if perPermit := (heap2 - heap1) / uint64(n); perPermit > 1000 {
		t.Errorf("holding costs %d B of heap per permit, want at most 1000", perPermit)
	}
	start = time.Now()
	releaseEach(ps)
	t.Logf("released in %v", time.Since(start).Round(time.Millisecond))
}
