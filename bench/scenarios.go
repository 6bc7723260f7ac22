package main

import (
	"context"
	"fmt"
	"io"
)

// scenario is what one end-to-end demonstration of the toolkit did. Each
// checks its own invariant; a broken one fails the run.
type scenario struct {
	Name  string   `json:"name"`
	Lines []string `json:"lines"` // what happened, for people
	OK    bool     `json:"ok"`    // the invariant held
	Err   string   `json:"error,omitempty"`
}

// scenarioRunner runs one scenario with keys starting with ns; quick asks
// for a smaller one.
type scenarioRunner struct {
	name string
	run  func(ctx context.Context, s *server, ns string, quick bool) scenario
}

// scenarioRunners are the end-to-end scenarios, in the order they run.
var scenarioRunners = []scenarioRunner{
	{"throttle", throttleScenario},
	{"workers", workersScenario},
	{"inventory", inventoryScenario},
}

func printScenarios(w io.Writer, scs []scenario) {
	for _, sc := range scs {
		status := "ok"
		if !sc.OK {
			status = "FAILED"
		}
		fmt.Fprintf(w, "\n%s: %s\n", sc.Name, status)
		for _, l := range sc.Lines {
			fmt.Fprintf(w, "  %s\n", l)
		}
		if sc.Err != "" {
			fmt.Fprintf(w, "  error: %s\n", sc.Err)
		}
	}
}
