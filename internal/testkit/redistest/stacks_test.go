package redistest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMain runs the tests under Main, as every real-server package does,
// so that TestTimeoutWarning's child meets timeoutWarning.
func TestMain(m *testing.M) { Main(m) }

// TestTimeoutWarning: a test still running as -timeout nears ends with
// the stacks of sluice's goroutines (the stuck test's among them) and
// this package's panic, not go test's own listing of every goroutine.
func TestTimeoutWarning(t *testing.T) {
	if os.Getenv("REDISTEST_STUCK") == "1" {
		stuckForever()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTimeoutWarning$", "-test.timeout=2s")
	cmd.Env = append(os.Environ(), "REDISTEST_STUCK=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the stuck child passed:\n%s", out)
	}
	for _, want := range []string{"redistest: tests still running", "redistest.stuckForever"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the child's output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "panic: test timed out") {
		t.Errorf("go test's timeout came first:\n%s", out)
	}
}

func stuckForever() { select {} }
