package mutex_test

import (
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
)

// commandCalls returns the calls= count of each command in INFO
// commandstats (commands scripts run are counted too).
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
		n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		calls[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return calls
}

func writeHeapProfile(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		t.Fatal(err)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// rss returns the process's resident set size as /proc reports it, or
// "unknown".
func rss() string {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// envOr reads a setting of the held-leases workload.
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

// TestHeldLeases is the held-leases workload of issue 12: N locks held on
// one server for a period at a given watchdog lease, reporting renewal
// script calls/s, leases renewed/s, false losses, heap per held lock and
// goroutines. It runs only with SLUICE_LONG=1:
//
//	SLUICE_LONG=1 SLUICE_REQUIRE_REDIS=1 go test -run TestHeldLeases -v ./mutex/
//
// SLUICE_HELD (default 100000), SLUICE_HELD_LEASE (3s) and SLUICE_HELD_FOR
// (10s) change the workload; for the held-leases target of issue 26 (at
// most 500 B of heap per held lock with its Mutex, no false loss),
// SLUICE_HELD=1000000 SLUICE_HELD_LEASE=30s SLUICE_HELD_FOR=40s.
// SLUICE_HELD_PROFILE=FILE writes a heap profile while the locks are held
// (go tool pprof -sample_index=inuse_space -top FILE).
func TestHeldLeases(t *testing.T) {
	if os.Getenv("SLUICE_LONG") == "" {
		t.Skip("a long workload: set SLUICE_LONG=1")
	}
	n := envOr(t, "SLUICE_HELD", 100000, strconv.Atoi)
	watchdog := envOr(t, "SLUICE_HELD_LEASE", 3*time.Second, time.ParseDuration)
	holdFor := envOr(t, "SLUICE_HELD_FOR", 10*time.Second, time.ParseDuration)

	srv := redistest.NewServer(t)
	client := redistest.Client(t, srv.Addr())
	l := newLocker(t, client, mutex.Options{WatchdogLease: watchdog})
	goroutines := runtime.NumGoroutine()
	names := heldNames("held:", n, false)
	heap0 := heapInUse()
	ms := make([]*mutex.Mutex, n)
	for i, name := range names {
		ms[i] = newMutex(t, l, name)
	}
	heap1 := heapInUse()
	start := time.Now()
	lockAllOf(t, ms)
	t.Logf("%d locks taken in %v", n, time.Since(start).Round(time.Millisecond))
	heap2 := heapInUse()
	if path := os.Getenv("SLUICE_HELD_PROFILE"); path != "" {
		writeHeapProfile(t, path) // what the held locks keep, for go tool pprof
	}
	t.Logf("heap per lock: %d B for the Mutex, %d B for holding it (%d B in all); goroutines: %d before, %d holding; RSS %s",
		(heap1-heap0)/uint64(n), (heap2-heap1)/uint64(n), (heap2-heap0)/uint64(n), goroutines, runtime.NumGoroutine(), rss())

	before := commandCalls(t, srv)
	holdStart := time.Now()
	time.Sleep(holdFor) // the workload: holding
	held := time.Since(holdStart)
	after := commandCalls(t, srv)
	lost := lostOf(ms)
	scripts := after["evalsha"] + after["eval"] - before["evalsha"] - before["eval"]
	renewed := after["pexpire"] - before["pexpire"]
	t.Logf("held %d locks at a %v watchdog lease for %v: %.0f renewal script calls/s, %.0f leases renewed/s (%.0f per call), %d false losses; goroutines %d",
		n, watchdog, held.Round(time.Millisecond), float64(scripts)/held.Seconds(), float64(renewed)/held.Seconds(),
		float64(renewed)/max(1, float64(scripts)), len(lost), runtime.NumGoroutine())
	if len(lost) > 0 {
		t.Errorf("%d of %d held locks lost, first %s: %v", len(lost), n, ms[lost[0]].Name(), ms[lost[0]].Err())
	}
	if scripts*20 > renewed {
		t.Errorf("%d renewal calls for %d leases renewed, want at least 20x fewer", scripts, renewed)
	}
	if perLock := (heap2 - heap0) / uint64(n); perLock > 500 {
		t.Errorf("a held lock costs %d B of heap with its Mutex, want at most 500", perLock)
	}
	start = time.Now()
	unlockAll(ms)
	t.Logf("unlocked in %v", time.Since(start).Round(time.Millisecond))
}
