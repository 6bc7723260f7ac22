package redistest

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

// Stacks returns the stacks of every goroutine, as runtime.Stack writes
// them: one paragraph each.
func Stacks() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// GoroutinesIn returns the stacks of the goroutines with frame (any text)
// in them: a test waits on it for a call to reach a function, or for a
// goroutine to be gone, where no signal exists.
func GoroutinesIn(frame string) []string {
	var out []string
	for g := range strings.SplitSeq(string(Stacks()), "\n\n") {
		if strings.Contains(g, frame) {
			out = append(out, g)
		}
	}
	return out
}

// ModuleStacks returns the stacks of the goroutines that have a frame of
// sluice's code, less those with a frame naming skip (if not empty). A
// stuck test's process holds thousands of goroutines (proxies, clients'
// readers), and a log that keeps only its tail loses the few that say
// where it is stuck.
func ModuleStacks(skip string) []byte {
	var out bytes.Buffer
	for _, g := range GoroutinesIn("github.com/sluicekit/sluice") {
		if skip == "" || !strings.Contains(g, skip) {
			out.WriteString(g)
			out.WriteString("\n\n")
		}
	}
	return out.Bytes()
}

// timeoutWarning arranges that, shortly before go test's -timeout ends
// the process, the stacks of sluice's goroutines are printed and the
// process panics with a line saying so: go test's own message lists
// every goroutine, and the tail of a CI log (all it keeps) then shows a
// client's reader, not the test that was stuck (CI, 2026-11-30). It
// returns the function that cancels it.
func timeoutWarning() (stop func() bool) {
	if !flag.Parsed() {
		flag.Parse()
	}
	f := flag.Lookup("test.timeout")
	if f == nil {
		return func() bool { return false }
	}
	d, err := time.ParseDuration(f.Value.String())
	if err != nil || d <= 0 {
		return func() bool { return false }
	}
	early := d - min(d/10, 30*time.Second)
	t := time.AfterFunc(early, func() {
		fmt.Fprintf(os.Stderr, "redistest: %v of the %v test timeout gone; the goroutines in sluice's code:\n\n", early, d)
		os.Stderr.Write(ModuleStacks("redistest.timeoutWarning"))
		panic(fmt.Sprintf("redistest: tests still running %v into the %v timeout (the goroutines above)", early, d))
	})
	return t.Stop
}
