package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progress keeps one status line on a terminal, rewritten in place. When
// stderr is not a terminal (CI logs) it prints a line per workload instead.
type progress struct {
	w     io.Writer
	tty   bool
	start time.Time
	last  string // workload of the last line printed, off a terminal
}

func newProgress(f *os.File) *progress {
	fi, err := f.Stat()
	tty := err == nil && fi.Mode()&os.ModeCharDevice != 0
	return &progress{w: f, tty: tty, start: time.Now()}
}

func (p *progress) show(workload, impl, phase string) {
	if p == nil {
		return
	}
	el := time.Since(p.start).Truncate(time.Second)
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K[%s] %s · %s · %s", el, workload, impl, phase)
		return
	}
	if workload != p.last {
		p.last = workload
		fmt.Fprintf(p.w, "[%s] %s\n", el, workload)
	}
}

// clear removes the status line before the results are printed.
func (p *progress) clear() {
	if p != nil && p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

// report is everything one run found; it is also the -json document.
type report struct {
	Server     string     `json:"server"`
	ServerKind string     `json:"server_kind"`
	Started    time.Time  `json:"started"`
	Elapsed    float64    `json:"elapsed_seconds"`
	Rounds     int        `json:"rounds"`
	Duration   float64    `json:"round_seconds"`
	Peers      bool       `json:"peers"`
	Quick      bool       `json:"quick"`
	Scenarios  []scenario `json:"scenarios"`
	Results    []result   `json:"results"`
	Ceiling    []ceiling  `json:"ceiling"`
	Fractions  []fraction `json:"ceiling_fractions"`
	HTTP       []httpLoad `json:"http_load,omitempty"`
	Attack     *attack    `json:"http_attack,omitempty"`
	Notes      []string   `json:"notes"`
	GoVersion  string     `json:"go_version"`
}

func writeJSON(path string, rep *report) error {
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// printResults writes the workload table: a block per workload, a row per
// implementation.
func printResults(w io.Writer, results []result) {
	width := len("impl")
	for _, r := range results {
		width = max(width, len(r.Impl))
	}
	title := ""
	for _, r := range results {
		if r.Title != title {
			title = r.Title
			fmt.Fprintf(w, "\n%s [vs peer by %s]\n", title, r.JudgedBy)
			fmt.Fprintf(w, "  %-*s %10s %9s %9s %10s %13s %8s  %s\n", width, "impl", "ops/s", "p50", "p99", "allocs/op", "cpu/op c+s", "vs peer", "notes")
		}
		if r.Ops == 0 {
			fmt.Fprintf(w, "  %-*s %10s %9s %9s %10s %13s %8s  %s\n", width, r.Impl, "-", "-", "-", "-", "-", "-", "failed: "+r.Err)
			continue
		}
		vs := "-"
		if r.VsBestPeer > 0 {
			vs = fmt.Sprintf("%.2fx", r.VsBestPeer)
		}
		var notes []string
		if r.Kind == reference {
			notes = append(notes, "no library: the bare script")
		}
		if r.Mark != "" {
			notes = append(notes, fmt.Sprintf("%s %s", r.Mark, percent(r.MarkShare)))
		}
		if r.Errors > 0 {
			notes = append(notes, fmt.Sprintf("%d errors, first: %s", r.Errors, r.Err))
		}
		fmt.Fprintf(w, "  %-*s %10s %9s %9s %10.1f %13s %8s  %s\n", width, r.Impl,
			rateString(r.OpsPerSec), latString(r.P50), latString(r.P99), r.AllocsPerOp, cpuString(r), vs, strings.Join(notes, "; "))
		printCmdStats(w, r)
	}
}

// cpuString prints the CPU time per operation in microseconds, client and
// server ("c+s"), or the client's alone when the server's is unknown.
func cpuString(r result) string {
	us := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e3) }
	if r.ServerCPU == nil {
		return us(r.ClientCPU)
	}
	return us(r.ClientCPU) + "+" + us(*r.ServerCPU)
}

// percent prints a share with two significant digits below 1%, so that a
// flood's tiny allowed share does not show as 0%.
func percent(f float64) string {
	if f > 0 && f < 0.01 {
		return fmt.Sprintf("%.2g%%", f*100)
	}
	return fmt.Sprintf("%.0f%%", f*100)
}

// rateString prints ops/s with three significant digits.
func rateString(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e5:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v >= 1e3:
		return fmt.Sprintf("%.2fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// latString prints a latency with two or three significant digits.
func latString(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	case d >= 10*time.Microsecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	}
	return fmt.Sprintf("%.1fµs", float64(d)/1e3)
}
