package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/rueidis"
)

// cpuTime is CPU time used so far by this process and by the Redis servers
// the bench talks to. A ratio of two implementations' throughput says which
// is faster on this machine; where client and server share two cores it is
// their CPU per operation that decides it, and the split says on which side
// an implementation spends it.
type cpuTime struct {
	client time.Duration // this process: every implementation's client, and the harness
	server time.Duration // the Redis servers' threads
	seen   bool          // whether server was read: the servers run on this machine
}

// cpuNow reads the CPU time of this process and of the servers in pids.
func cpuNow(pids []int) cpuTime {
	var t cpuTime
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		t.client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for _, pid := range pids {
		t.server += threadsCPU(pid)
	}
	t.seen = len(pids) > 0
	return t
}

// threadsCPU adds up the time on CPU of every thread of process pid, from
// /proc/PID/task/*/schedstat (nanoseconds, unlike the clock ticks of
// /proc/PID/stat, which are too coarse for a 300 ms round).
func threadsCPU(pid int) time.Duration {
	files, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/schedstat")
	var sum time.Duration
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		first, _, _ := strings.Cut(string(b), " ")
		ns, err := strconv.ParseInt(first, 10, 64)
		if err == nil {
			sum += time.Duration(ns)
		}
	}
	return sum
}

// serverPIDs returns the process ids of every node of c, when every node
// listens on loopback and is a redis-server process this bench can see in
// /proc; nil otherwise, and the table then shows no server CPU.
func serverPIDs(ctx context.Context, c rueidis.Client) []int {
	var pids []int
	for addr, node := range c.Nodes() {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil
		}
		if ip := net.ParseIP(host); (ip == nil && host != "localhost") || (ip != nil && !ip.IsLoopback()) {
			return nil
		}
		info, err := node.Do(ctx, node.B().Info().Section("server").Build()).ToString()
		if err != nil {
			return nil
		}
		pid := 0
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
				pid, _ = strconv.Atoi(v)
			}
		}
		comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		if pid == 0 || err != nil || !strings.HasPrefix(string(comm), "redis") {
			return nil
		}
		pids = append(pids, pid)
	}
	return pids
}
