package goredis

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Script calls are coalesced on a client of one server (issue 33): go-redis
// sends each command on a pooled connection of its own, one write and one
// read each way, and those round trips were most of the adapter's cost. So
// a Client has at most maxInFlight round trips of script calls under way at
// once; a call that comes while they are waits in a queue, and when a round
// trip ends, everything queued goes out as one pipeline (go-redis's
// Pipeline: one write, one read, for up to maxBatch calls). Under load that
// is one round trip for many calls; a call alone goes out at once, as
// before.
//
// Every contract of the adapter holds for a queued call: its caller
// returns as soon as its context ends (the pipeline, in a goroutine of the
// adapter's, goes on as a lone call would, until go-redis's ReadTimeout);
// nothing is sent twice (a pipeline of commands that are not retryable is
// not retried by go-redis, whatever broke); each call gets its own reply,
// NOSCRIPT included, for the cache to reload. A cluster client is not
// coalesced: a pipeline spanning nodes would make every call of a batch
// wait for the slowest node, and a shard that stops answering would hold
// up calls to the others; its calls go out one by one, routed and
// redirected by go-redis as before.

// maxInFlight bounds the round trips of script calls a Client of one
// server has under way at once (and its pool's PoolSize, if smaller). Four
// keep the queue short enough that a watchdog renewal waits less than a
// round trip more than it would alone, and leave most of the pool to the
// application; one would coalesce more, for no clear gain in the bench.
const maxInFlight = 4

// maxBatch bounds the calls of one pipeline.
const maxBatch = 512

// coalescer is the queue of a Client's calls that wait for a pipeline.
type coalescer struct {
	max      int // round trips in flight at most; 0: no coalescing
	mu       sync.Mutex
	inFlight int       // guarded by mu
	queue    []*queued // guarded by mu
}

// queued is a call that waits in the queue; done is buffered, so the
// pipeline never waits for the caller, and reused (queuedPool) when the
// caller saw the call through.
type queued struct {
	cmd  noRetry
	done chan struct{}
}

var queuedPool = sync.Pool{New: func() any { return &queued{done: make(chan struct{}, 1)} }}

// enter reports whether the caller may send cmd itself now (it must then
// call leave once the call has run, from whichever goroutine ran it), or
// returns the queue entry to wait on.
func (co *coalescer) enter(cmd noRetry) (*queued, bool) {
	if co.max == 0 {
		return nil, true
	}
	co.mu.Lock()
	if co.inFlight < co.max {
		co.inFlight++
		co.mu.Unlock()
		return nil, true
	}
	q := queuedPool.Get().(*queued)
	q.cmd = cmd
	co.queue = append(co.queue, q)
	co.mu.Unlock()
	return q, false
}

// leave ends a round trip that enter let through: the calls queued
// meanwhile, if any, go out as a pipeline, in a goroutine of the adapter's.
func (c *Client) leave() {
	if c.co.max == 0 {
		return
	}
	if batch := c.co.next(); batch != nil {
		go c.flush(batch)
	}
}

// next returns the next batch of queued calls, or nil, taking the round
// trip that ended off the count, when there is none.
func (co *coalescer) next() []*queued {
	co.mu.Lock()
	defer co.mu.Unlock()
	if len(co.queue) == 0 {
		co.inFlight--
		return nil
	}
	n := min(len(co.queue), maxBatch)
	batch := make([]*queued, n)
	copy(batch, co.queue)
	rest := copy(co.queue, co.queue[n:])
	clear(co.queue[rest:])
	co.queue = co.queue[:rest]
	return batch
}

// flush sends batch as one pipeline, then the batches queued meanwhile,
// until the queue is empty. The pipeline runs under no caller's context:
// each caller waits for its own call, and only as long as its context
// lets it (await); go-redis's ReadTimeout and WriteTimeout bound the rest.
func (c *Client) flush(batch []*queued) {
	ctx := context.Background()
	for batch != nil {
		p := c.single.Pipeline()
		for _, q := range batch {
			_ = p.Process(ctx, q.cmd)
		}
		_, _ = p.Exec(ctx) // each command holds its own reply or error
		for _, q := range batch {
			q.done <- struct{}{}
		}
		batch = c.co.next()
	}
}

// awaitQueued waits for the pipeline that carries q, or for ctx to end.
func awaitQueued(ctx context.Context, q *queued) (*redis.Cmd, error) {
	select {
	case <-q.done:
	case <-ctx.Done():
		select {
		case <-q.done: // it came at the same moment
		default:
			return nil, ctx.Err() // q is the pipeline's now, never reused
		}
	}
	cmd := q.cmd.Cmd
	*q = queued{done: q.done}
	queuedPool.Put(q)
	return cmd, nil
}
