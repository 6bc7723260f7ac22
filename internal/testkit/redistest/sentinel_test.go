package redistest

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestSentinelFailover starts a Sentinel setup, fails over with SENTINEL
// FAILOVER, and checks that every process is gone once the test that owned
// the setup has ended.
func TestSentinelFailover(t *testing.T) {
	var pids []int
	skipped := false
	t.Run("setup", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }() // no server binary
		s := NewSentinel(t)
		for _, n := range append([]*Server{s.Primary, s.Replica}, s.Sentinels...) {
			n.mu.Lock()
			pids = append(pids, n.cmd.Process.Pid)
			n.mu.Unlock()
		}
		for _, pid := range pids {
			if !isChild(pid) {
				t.Fatalf("process %d is not a running child of the test", pid)
			}
		}
		for i := range s.Sentinels {
			addr, err := s.PrimaryAddr(i)
			if err != nil || addr != s.Primary.Addr() {
				t.Fatalf("sentinel %d reports primary %q (%v), want %s", i, addr, err, s.Primary.Addr())
			}
		}
		if err := s.Failover(); err != nil {
			t.Fatal(err)
		}
		took, err := s.WaitPrimary(s.Replica, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("SENTINEL FAILOVER: the replica was primary for every sentinel after %v", took.Round(time.Millisecond))
		if _, err := s.Replica.Do("SET", "k", "v"); err != nil {
			t.Fatalf("write to the promoted replica: %v", err)
		}
	})
	if skipped {
		t.Skip("the setup was skipped")
	}
	if len(pids) != 5 {
		t.Fatalf("%d processes started, want 5", len(pids))
	}
	for _, pid := range pids {
		if isChild(pid) {
			t.Errorf("process %d still running after the test ended", pid)
		}
	}
}

// isChild reports whether pid is a live (or unreaped) child of this
// process, from /proc.
func isChild(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) state ppid ...": the fields after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return false
	}
	var state string
	var ppid int
	if _, err := fmt.Sscan(s[i+1:], &state, &ppid); err != nil {
		return false
	}
	return ppid == os.Getpid()
}
