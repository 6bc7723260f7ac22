package chaos

import (
	"strings"
	"testing"
	"time"
)

// TestJudgeFairWaiterAfterRelease checks the liveness oracle's choice of
// bound for a fair waiter that a view shows due just after a release of
// the workload: the wake-up's quarter lease when the release freed the
// lock, the polling bound (a quarter and a third of a lease) when the
// release handed the lock to a queued waiter that is no hold of the
// history (a crashed client's entry) and the end of that grant's lease
// freed it. The waiter is served 650 ms after it became due, between the
// two bounds (500 ms and 1.17 s with the run's 2 s lease).
func TestJudgeFairWaiterAfterRelease(t *testing.T) {
	const (
		lease    = 2 * time.Second
		released = 100 // the released hold's token
		dead     = 200 // the token of the grant to a crashed client's entry
	)
	tests := []struct {
		name string
		// view returns the lock's owner and the record's token at d after
		// the release.
		view      func(d time.Duration) (string, int64)
		violation bool
	}{
		{
			// The release freed the lock and its wake-up never reached the
			// waiter: what a lost wake-up looks like.
			name:      "freed by the release",
			view:      func(time.Duration) (string, int64) { return "", released },
			violation: true,
		},
		{
			// The release handed the lock to a crashed client's entry; the
			// grant's lease ran out 60 ms later and took the record with
			// it (go-redis single-deadlines seed 1 in CI).
			name: "handed to a dead entry",
			view: func(d time.Duration) (string, int64) {
				if d < 60*time.Millisecond {
					return "m0.1", dead
				}
				return "", 0
			},
		},
		{
			// As above, with a grant shorter than a poll: no view shows it
			// held, the record tells.
			name: "handed to a dead entry between two views",
			view: func(time.Duration) (string, int64) { return "", 0 },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &world{cfg: Config{Lease: lease}, hist: newHistory(lease)}
			rel := w.hist.epoch.Add(2 * time.Second) // the release
			o := &hold{kind: "mutex", res: laneFair, owner: "n0lf1.8", node: 0, weight: 1, token: released,
				call: rel.Add(-30 * time.Millisecond), start: rel.Add(-20 * time.Millisecond), end: rel, ended: true}
			served := rel.Add(700 * time.Millisecond)
			wt := &laneWait{prim: "fair", res: laneFair, owner: "n1lf0.6", node: 1, weight: 1,
				call: rel.Add(-150 * time.Millisecond), ret: served,
				x: &hold{kind: "mutex", res: laneFair, owner: "n1lf0.6", start: served}}
			var views []snap
			for d := 10 * time.Millisecond; d < 700*time.Millisecond; d += 10 * time.Millisecond {
				at := rel.Add(d)
				now := at.UnixMilli()
				owner, token := tt.view(d)
				views = append(views, snap{call: at, ret: at.Add(2 * time.Millisecond), now: now, owner: owner, token: token,
					queue: []entry{{id: "x.6", owner: wt.owner, expiry: now + lease.Milliseconds()}}})
			}
			w.checkWaitDue(wt, views, nil, []*hold{o}, nil)
			got := w.hist.viol
			if (len(got) > 0) != tt.violation || len(got) > 0 && !strings.Contains(got[0], "liveness: fair waiter n1lf0.6") {
				t.Errorf("violations %q, want one: %v", got, tt.violation)
			}
		})
	}
}
