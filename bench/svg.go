package main

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"os"
	"time"
)

// The comparison drawn: one panel per workload, one row per library, each
// row a latency distribution on a log scale (a bar to the p50, then lighter
// segments to the p90 and the p99) with the throughput written beside it.
// The picture is plain SVG with no script, font or style sheet from
// elsewhere, so it opens offline in any browser or viewer.

const (
	svgWidth  = 1040
	svgLabelW = 200 // the library names, left of the plot
	svgTextW  = 110 // room right of the plot for a bar's p50 / p99 text
	svgRightW = 130 // ops/s and vs-peer figures, right of that
	svgRowH   = 22
	svgTitleH = 44 // a panel's title and its axis labels
	svgGapH   = 14
)

// svgColors are the bar colours per kind of implementation: p50, p90, p99.
var svgColors = map[kind][3]string{
	ours:      {"#1f5fa8", "#6b9bd1", "#b9d0ea"},
	reference: {"#555555", "#999999", "#d0d0d0"},
	peer:      {"#c0561b", "#e39563", "#f4cdb2"},
}

func writeSVG(path string, rep *report) error {
	return os.WriteFile(path, drawSVG(rep), 0o644)
}

// drawSVG draws the workloads of rep; a workload none of whose rows has
// latencies is left out.
func drawSVG(rep *report) []byte {
	type panel struct {
		title string
		rows  []result
	}
	var panels []panel
	for _, r := range rep.Results {
		if len(panels) == 0 || panels[len(panels)-1].title != r.Title {
			panels = append(panels, panel{title: r.Title})
		}
		if r.Ops > 0 && r.P50 > 0 {
			p := &panels[len(panels)-1]
			p.rows = append(p.rows, r)
		}
	}

	height := 96
	for _, p := range panels {
		if len(p.rows) > 0 {
			height += svgTitleH + len(p.rows)*svgRowH + svgGapH
		}
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="12" y="24" font-size="17" font-weight="bold">sluice bench: latency per operation, by library (log scale; shorter is better)</text>`+"\n")
	sub := fmt.Sprintf("%s · %d round(s) of %.2gs, median round · %s · %s", rep.Server, rep.Rounds, rep.Duration,
		rep.Started.Format(time.DateOnly), rep.GoVersion)
	if rep.ServerKind == "embedded" {
		sub += " · embedded miniredis: not Redis timings"
	}
	fmt.Fprintf(&b, `<text x="12" y="44" fill="#444">%s</text>`+"\n", html.EscapeString(sub))
	// The legend.
	x := 12
	for _, k := range []kind{ours, reference, peer} {
		c := svgColors[k]
		for i := range 3 {
			fmt.Fprintf(&b, `<rect x="%d" y="56" width="14" height="12" fill="%s"/>`, x+i*14, c[i])
		}
		name := map[kind]string{ours: "sluice", reference: "bare script (no library)", peer: "peer library"}[k]
		fmt.Fprintf(&b, `<text x="%d" y="66">%s</text>`+"\n", x+48, html.EscapeString(name))
		x += 48 + 8*len(name) + 24
	}
	fmt.Fprintf(&b, `<text x="%d" y="66" fill="#444">each bar: p50 · p90 · p99</text>`+"\n", x)

	y := 96
	plotX0, plotX1 := svgLabelW, svgWidth-svgRightW-svgTextW
	for _, p := range panels {
		if len(p.rows) == 0 {
			continue
		}
		lo, hi := p.rows[0].P50, p.rows[0].P99
		for _, r := range p.rows {
			lo, hi = min(lo, r.P50), max(hi, r.P99, r.P90)
		}
		// Whole decades around the data, so the gridlines read 10µs, 100µs, ...
		d0 := math.Floor(math.Log10(float64(lo)))
		d1 := math.Ceil(math.Log10(float64(hi)))
		if d1 <= d0 {
			d1 = d0 + 1
		}
		xOf := func(d time.Duration) float64 {
			f := (math.Log10(float64(max(d, 1))) - d0) / (d1 - d0)
			return float64(plotX0) + math.Max(0, math.Min(1, f))*float64(plotX1-plotX0)
		}
		fmt.Fprintf(&b, `<text x="12" y="%d" font-size="14"><tspan font-weight="bold">%s</tspan><tspan dx="12" fill="#666" font-size="11">vs peer by %s</tspan></text>`+"\n",
			y+14, html.EscapeString(p.title), html.EscapeString(string(p.rows[0].JudgedBy.orOps())))
		top, bottom := y+svgTitleH-8, y+svgTitleH+len(p.rows)*svgRowH
		for e := d0; e <= d1; e++ {
			for _, m := range []float64{1, 2, 5} {
				v := m * math.Pow(10, e)
				if v > math.Pow(10, d1) {
					break
				}
				gx := xOf(time.Duration(v))
				stroke, label := "#eeeeee", ""
				if m == 1 {
					stroke, label = "#cccccc", latString(time.Duration(v))
				}
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s"/>`, gx, top, gx, bottom, stroke)
				if label != "" {
					fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#666" font-size="11">%s</text>`, gx, top-3, label)
				}
			}
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" fill="#666" font-size="11">ops/s</text>`, svgWidth-70, top-3)
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#666" font-size="11">vs peer</text>`+"\n", svgWidth-64, top-3)
		b.WriteString("\n")
		for i, r := range p.rows {
			ry := y + svgTitleH + i*svgRowH
			c := svgColors[r.Kind]
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, plotX0-8, ry+15, html.EscapeString(r.Impl))
			// Back to front: the p99 segment spans the whole bar, the p50
			// one is drawn last, on top.
			for j, q := range []time.Duration{r.P99, max(r.P90, r.P50), r.P50} {
				fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s %s %s</title></rect>`,
					plotX0, ry+4, xOf(q)-float64(plotX0), svgRowH-8, c[2-j], html.EscapeString(r.Impl), []string{"p99", "p90", "p50"}[j], latString(q))
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10" fill="#222">%s</text>`, xOf(r.P99)+4, ry+15,
				html.EscapeString(latString(r.P50)+" / "+latString(r.P99)))
			vs := ""
			if r.VsBestPeer > 0 && r.Kind != peer {
				vs = fmt.Sprintf("  %.2fx", r.VsBestPeer)
			}
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, svgWidth-70, ry+15, rateString(r.OpsPerSec))
			fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#444">%s</text>`+"\n", svgWidth-64, ry+15, html.EscapeString(vs))
		}
		y = bottom + svgGapH
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}
