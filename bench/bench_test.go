package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestQuickEmbedded runs what CI runs, go run . -quick, in process: every
// scenario must hold and every workload must measure something without
// errors, and nothing may be left running.
func TestQuickEmbedded(t *testing.T) {
	defer goleak.VerifyNone(t)
	var out bytes.Buffer
	rep, err := run(context.Background(), config{quick: true}, &out, nil)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if len(rep.Scenarios) != len(scenarioRunners) {
		t.Errorf("got %d scenarios, want %d", len(rep.Scenarios), len(scenarioRunners))
	}
	for _, r := range rep.Results {
		if r.Ops == 0 || r.Errors > 0 {
			t.Errorf("%s / %s: %d ops, %d errors (%s)", r.Workload, r.Impl, r.Ops, r.Errors, r.Err)
		}
	}
	for _, want := range []string{"not Redis timings", "ceiling", "done in"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", out.String())
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {1, time.Millisecond}} {
		got := h.quantile(c.q)
		if d := float64(got-c.want) / float64(c.want); d < -0.04 || d > 0.04 {
			t.Errorf("quantile(%v) = %v, want %v within 4%%", c.q, got, c.want)
		}
	}
	for _, ns := range []uint64{0, 1, 63, 64, 65, 1000, 1 << 20, 1<<40 + 12345} {
		if mid := bucketMid(bucketOf(ns)); ns > 64 && (float64(mid) < float64(ns)*0.96 || float64(mid) > float64(ns)*1.04) {
			t.Errorf("bucketMid(bucketOf(%d)) = %d, off by more than 4%%", ns, mid)
		}
	}
	var empty histogram
	if got := empty.quantile(0.5); got != 0 {
		t.Errorf("empty quantile = %v, want 0", got)
	}
}

// TestSummarize checks the median round and the ratio to the best peer, for
// throughput and for latency workloads.
func TestSummarize(t *testing.T) {
	round := func(ops int64, p50 time.Duration) sample {
		s := sample{ops: ops, elapsed: time.Second}
		for range ops {
			s.lat.record(p50)
		}
		return s
	}
	mk := func(name string, k kind, s ...sample) *entry[limiter] {
		return &entry[limiter]{impl: impl[limiter]{name: name, kind: k}, samples: s}
	}
	entries := []*entry[limiter]{
		mk("ours", ours, round(300, 3*time.Millisecond), round(100, time.Millisecond), round(200, 2*time.Millisecond)),
		mk("peer-a", peer, round(50, 4*time.Millisecond)),
		mk("peer-b", peer, round(100, 8*time.Millisecond)),
	}

	got := summarize(workload[limiter]{name: "w"}, entries)
	if got[0].OpsPerSec != 200 {
		t.Errorf("median ops/s = %v, want 200 (the middle round)", got[0].OpsPerSec)
	}
	if got[0].VsBestPeer != 2 || got[2].VsBestPeer != 1 || got[1].VsBestPeer != 0.5 {
		t.Errorf("throughput ratios = %v %v %v, want 2 0.5 1", got[0].VsBestPeer, got[1].VsBestPeer, got[2].VsBestPeer)
	}

	got = summarize(workload[limiter]{name: "w", judge: byP50}, entries)
	if p := got[0].P50; p < 1900*time.Microsecond || p > 2100*time.Microsecond {
		t.Errorf("median p50 = %v, want about 2ms (the middle round)", p)
	}
	// The best peer is the one with the lowest p50, peer-a at 4ms.
	if r := got[0].VsBestPeer; r < 1.9 || r > 2.1 {
		t.Errorf("latency ratio = %v, want about 2", r)
	}
}

// TestDemoOnly pins what the bare command runs: the use cases alone, and
// every workload as soon as a flag asks for measurements.
func TestDemoOnly(t *testing.T) {
	for _, c := range []struct {
		c    config
		want bool
	}{
		{config{}, false}, {config{redis: "127.0.0.1:6379"}, false}, {config{json: "r.json"}, false},
		{config{full: true}, true}, {config{peers: true}, true}, {config{quick: true}, true},
		{config{run: "lock"}, true}, {config{svg: "r.svg"}, true},
	} {
		if got := c.c.measures(); got != c.want {
			t.Errorf("%+v: measures() = %v, want %v", c.c, got, c.want)
		}
	}
}

// TestDrawSVG checks that the picture is well-formed XML with a bar of
// three segments per measured row, and leaves out rows that failed.
func TestDrawSVG(t *testing.T) {
	rep := &report{Server: "test <server>", ServerKind: "single", Rounds: 1, Duration: 0.1, Results: []result{
		{Title: "w1", Impl: "sluice", Kind: ours, Ops: 10, OpsPerSec: 100, P50: time.Millisecond, P90: 2 * time.Millisecond, P99: 5 * time.Millisecond},
		{Title: "w1", Impl: "peer & co", Kind: peer, Ops: 10, OpsPerSec: 50, P50: 3 * time.Millisecond, P90: 4 * time.Millisecond, P99: 90 * time.Millisecond},
		{Title: "w1", Impl: "broken", Kind: peer, Err: "open: refused"},
		{Title: "w2", Impl: "sluice", Kind: ours, Ops: 10, OpsPerSec: 1e6, P50: 400, P90: 500, P99: 900},
	}}
	out := drawSVG(rep)
	dec := xml.NewDecoder(bytes.NewReader(out))
	bars := map[string]int{}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, out)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "title" {
			var s string
			if err := dec.DecodeElement(&s, &se); err != nil {
				t.Fatal(err)
			}
			bars[strings.Fields(s)[0]]++
		}
	}
	if bars["sluice"] != 6 || bars["peer"] != 3 || bars["broken"] != 0 {
		t.Errorf("bar segments per impl = %v, want sluice 6 (two workloads), peer 3, broken 0", bars)
	}
}

// TestRedraw checks that -from draws from a -json file the picture the
// run itself would have drawn.
func TestRedraw(t *testing.T) {
	rep := &report{Server: "s", ServerKind: "single", Rounds: 5, Duration: 0.3, Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Results: []result{{Title: "w", Impl: "sluice", Kind: ours, Ops: 10, OpsPerSec: 100, P50: 1e5, P90: 2e5, P99: 3e5, VsBestPeer: 1.5}}}
	dir := t.TempDir()
	if err := writeJSON(dir+"/r.json", rep); err != nil {
		t.Fatal(err)
	}
	if err := redraw(dir+"/r.json", dir+"/r.svg"); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dir + "/r.svg")
	if err != nil {
		t.Fatal(err)
	}
	if want := drawSVG(rep); !bytes.Equal(got, want) {
		t.Errorf("redrawn picture differs from the run's:\n%s\nwant:\n%s", got, want)
	}
	if err := redraw(dir+"/r.json", ""); err == nil {
		t.Error("redraw without -svg: no error")
	}
}
