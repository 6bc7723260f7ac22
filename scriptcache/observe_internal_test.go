package scriptcache

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestLogSampling: records that can come with every request are logged at
// most once a second per kind, the next one counting those suppressed;
// decisions are not logged at all, and the observer sees every event.
func TestLogSampling(t *testing.T) {
	var buf bytes.Buffer
	seen := 0
	o := newObserver(ObserverFunc(func(Event) { seen++ }), slog.New(slog.NewTextHandler(&buf, nil))).(*logObserver)
	now := time.Unix(1000, 0)
	o.now = func() time.Time { return now }
	redisDown := errors.New("i/o timeout")
	open := Event{Kind: EventFallback, Primitive: PrimitiveRateLimit, Name: "api", Source: SourceFailOpen, Err: redisDown}
	for range 5 {
		o.Observe(open)
		o.Observe(Event{Kind: EventDecision, Primitive: PrimitiveRateLimit, Allowed: true, Source: SourceRedis})
	}
	o.Observe(Event{Kind: EventFallback, Primitive: PrimitiveRateLimit, Source: SourceFailClosed, Err: redisDown})
	now = now.Add(time.Second)
	o.Observe(open)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d records:\n%s\nwant 3", len(lines), buf.String())
	}
	for i, want := range []string{"source=fail_open", "source=fail_closed", "suppressed=4"} {
		if !strings.Contains(lines[i], want) || !strings.Contains(lines[i], "level=WARN") {
			t.Errorf("record %d = %s; want a warning with %s", i, lines[i], want)
		}
	}
	if strings.Contains(buf.String(), "decision") {
		t.Errorf("a decision was logged:\n%s", buf.String())
	}
	if seen != 12 {
		t.Errorf("the observer saw %d events, want 12", seen)
	}

	// Losses: ten a second; refusals are errors.
	buf.Reset()
	for range 12 {
		o.Observe(Event{Kind: EventLost, Primitive: PrimitiveMutex, Name: "m", Reason: ReasonGone, Hold: time.Second})
	}
	o.Observe(Event{Kind: EventSubscription, Primitive: PrimitiveMutex, Name: "ch", Reason: ReasonRefused, Err: errors.New("NOPERM")})
	out := buf.String()
	if n := strings.Count(out, "hold lost"); n != 10 {
		t.Errorf("%d loss records, want 10:\n%s", n, out)
	}
	if !strings.Contains(out, "level=ERROR msg=\"sluice: subscription refused\"") {
		t.Errorf("no refusal error in:\n%s", out)
	}

	// A logger alone is an observer too; nothing at all is none.
	if newObserver(nil, slog.New(slog.NewTextHandler(&buf, nil))) == nil || newObserver(nil, nil) != nil {
		t.Error("newObserver: want an observer for a logger alone and nil for nothing")
	}
}

// TestLogRecordAttrs: a logged record carries the event's fields that are
// set, by name, and leaves out those that are not (no reason="" on a
// fallback, which has none).
func TestLogRecordAttrs(t *testing.T) {
	redisDown := errors.New("i/o timeout")
	tests := []struct {
		name    string
		e       Event
		want    []string
		wantNot []string
	}{
		{"loss with a reason", Event{Kind: EventLost, Primitive: PrimitiveMutex, Name: "m", Reason: ReasonGone, Hold: time.Second},
			[]string{"primitive=mutex", "name=m", "reason=gone", "held=1s"}, []string{"source=", "err="}},
		{"fallback without a reason", Event{Kind: EventFallback, Primitive: PrimitiveRateLimit, Name: "api", Source: SourceFailOpen, Err: redisDown},
			[]string{"primitive=ratelimit", "name=api", "source=fail_open", `err="i/o timeout"`}, []string{"reason=", "held="}},
		{"drop", Event{Kind: EventSubscription, Reason: ReasonDropped, Err: redisDown},
			[]string{"reason=dropped", `err="i/o timeout"`}, []string{"primitive=", "name=", "source="}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			o := newObserver(nil, slog.New(slog.NewTextHandler(&buf, nil)))
			o.Observe(tt.e)
			line := strings.TrimSpace(buf.String())
			if strings.Count(line, "\n") != 0 || line == "" {
				t.Fatalf("records:\n%s\nwant one", buf.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(line, " "+w) {
					t.Errorf("record %s lacks %s", line, w)
				}
			}
			for _, w := range tt.wantNot {
				if strings.Contains(line, " "+w) {
					t.Errorf("record %s has %s, which the event does not set", line, w)
				}
			}
		})
	}
}
