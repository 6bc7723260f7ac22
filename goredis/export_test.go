package goredis

import (
	"context"
	"time"

	"github.com/sluicekit/sluice/scriptcache"
)

// SetMaxInFlight sets how many round trips of script calls c, a client of
// one server, has under way at once: 1 makes every call that comes while
// another is under way go out in a pipeline, which tests use to run
// their suites through that path.
func SetMaxInFlight(c *Client, n int) {
	if c.single != nil {
		c.co.max = n
	}
}

// EvalPipelined sends body once per key, as one pipeline of calls that
// queued for it, and returns their replies: the path of a coalesced call,
// without the timing that puts calls in a queue.
func EvalPipelined(c *Client, body string, keys ...string) []scriptcache.Reply {
	batch := make([]*queued, len(keys))
	for i, k := range keys {
		batch[i] = &queued{cmd: evalCmd(context.Background(), "", body, []string{k}, nil), done: make(chan struct{}, 1)}
	}
	c.co.mu.Lock()
	c.co.inFlight++ // the round trip flush ends
	c.co.mu.Unlock()
	c.flush(batch)
	out := make([]scriptcache.Reply, len(keys))
	for i, q := range batch {
		<-q.done
		out[i] = reply(q.cmd.Cmd)
	}
	return out
}

// SetSubscriptionQuiet sets how long a subscription's connection may be
// silent before Subscribe sends a PING, and then before it gives the
// connection up.
func SetSubscriptionQuiet(c *Client, d time.Duration) { c.quiet = d }

// SetClock sets the clock c reads when a call with a deadline returns.
func SetClock(c *Client, now func() time.Time) { c.now = now }
