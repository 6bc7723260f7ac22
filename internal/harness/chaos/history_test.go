package chaos

import (
	"strings"
	"testing"
	"time"
)

// TestLostAtStart checks the oracle of late grants: a hold whose loss
// signal had closed when the harness began it is a late grant taken as a
// hold, unless the holder's Valid said true right after the acquisition
// returned (the lease ran out in the moment between).
func TestLostAtStart(t *testing.T) {
	tests := []struct {
		name      string
		valid     bool
		violation bool
	}{
		{name: "not valid at the return", valid: false, violation: true},
		{name: "valid at the return", valid: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistory(2 * time.Second)
			lost := make(chan struct{})
			close(lost)
			call := time.Now().Add(-time.Second)
			x := &hold{kind: "mutex", res: "le", owner: "n2le0.7", node: 2, weight: 1, note: "plain lane",
				call: call, start: call.Add(111 * time.Millisecond), valid: tt.valid, lostCh: lost, lease: 120 * time.Millisecond}
			h.begin(x)
			x.expect = "left to expire" // as abandonLane says
			h.end(x, true, "left to expire")
			h.settle()
			if (len(h.viol) > 0) != tt.violation || len(h.viol) > 0 && !strings.Contains(h.viol[0], "late grant taken as a hold") {
				t.Errorf("violations %q, want one: %v", h.viol, tt.violation)
			}
		})
	}
}
