//go:build sluice_mutation

package scriptcache

import (
	"os"
	"sync"
)

// TraceEnv names the file a mutation test binary appends the name of each
// script it runs to, once per name: the mutation runner runs each test
// alone once to learn which scripts it reaches, and then runs a script's
// mutants against those tests only.
const TraceEnv = "SLUICE_MUTATION_TRACE"

var trace struct {
	once sync.Once
	mu   sync.Mutex
	f    *os.File
	seen map[string]bool
}

// traced records that the script name ran, in a mutation test binary only.
func traced(name string) {
	trace.once.Do(func() {
		if p := os.Getenv(TraceEnv); p != "" {
			trace.f, _ = os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			trace.seen = map[string]bool{}
		}
	})
	if trace.f == nil {
		return
	}
	trace.mu.Lock()
	defer trace.mu.Unlock()
	if !trace.seen[name] {
		trace.seen[name] = true
		_, _ = trace.f.WriteString(name + "\n")
	}
}
