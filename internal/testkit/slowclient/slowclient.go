// Package slowclient is a test-only scriptcache.Client wrapper that holds
// up a process's script calls and grant messages on the test's command, as
// a slow network would, so that a test can order a grant's message after
// a later call's answer deterministically.
package slowclient

import (
	"context"
	"strings"
	"sync"

	"github.com/sluicekit/sluice/scriptcache"
)

// Client wraps a scriptcache.Client. It counts the answered calls that
// Attempt recognises, can hold script calls with keys until they are let
// through (a call held so has been sent, as its caller sees it, and runs on
// the server only later), and can hold grant messages ("g ID PAYLOAD") back
// until they are let through.
type Client struct {
	scriptcache.Client
	// Attempt tells the acquisition attempts the test counts and waits
	// for by their arguments. Set it before the first call.
	Attempt func(args []string) bool

	mu       sync.Mutex
	answered int                   // attempts answered
	tell     map[int]chan struct{} // closed when answered reaches the key
	gate     chan struct{}         // non-nil: calls with keys wait until it closes
	sentHeld chan struct{}         // closed when an attempt waits at the gate
	holding  bool
	held     []string // grant messages held back
	deliver  func(string)
}

// At returns a channel closed when the n-th attempt has been answered.
func (c *Client) At(n int) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tell == nil {
		c.tell = make(map[int]chan struct{})
	}
	ch := make(chan struct{})
	if c.answered >= n {
		close(ch)
	} else {
		c.tell[n] = ch
	}
	return ch
}

// Eval runs the call, held while Hold is in force.
func (c *Client) Eval(ctx context.Context, sha, body string, keys, args []string) scriptcache.Reply {
	attempt := len(keys) > 0 && c.Attempt != nil && c.Attempt(args)
	c.mu.Lock()
	gate := c.gate
	if gate != nil && attempt && c.sentHeld != nil {
		close(c.sentHeld)
		c.sentHeld = nil
	}
	c.mu.Unlock()
	if gate != nil && len(keys) > 0 {
		select {
		case <-gate:
		case <-ctx.Done():
			return scriptcache.ErrorReply(ctx.Err())
		}
	}
	r := c.Client.Eval(ctx, sha, body, keys, args)
	if attempt {
		c.mu.Lock()
		c.answered++
		if ch := c.tell[c.answered]; ch != nil {
			close(ch)
			delete(c.tell, c.answered)
		}
		c.mu.Unlock()
	}
	return r
}

// Subscribe subscribes, holding grant messages back while Hold is in
// force.
func (c *Client) Subscribe(ctx context.Context, channel string, sharded bool, subscribed func(), message func(string)) error {
	return c.Client.Subscribe(ctx, channel, sharded, subscribed, func(payload string) {
		c.mu.Lock()
		if c.holding && strings.HasPrefix(payload, "g ") {
			c.held, c.deliver = append(c.held, payload), message
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		message(payload)
	})
}

// Hold holds back script calls and grant messages from now on. The
// channel it returns is closed when an attempt is held.
func (c *Client) Hold() (attemptSent <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gate, c.holding = make(chan struct{}), true
	c.sentHeld = make(chan struct{})
	return c.sentHeld
}

// HoldGrants holds back grant messages from now on, and nothing else.
func (c *Client) HoldGrants() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.holding = true
}

// LetCallsThrough lets the held script calls run, and calls from now on.
func (c *Client) LetCallsThrough() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gate != nil {
		close(c.gate)
		c.gate = nil
	}
}

// LetGrantsThrough delivers the held grant messages, and messages from now
// on.
func (c *Client) LetGrantsThrough() {
	c.mu.Lock()
	held, deliver := c.held, c.deliver
	c.held, c.holding = nil, false
	c.mu.Unlock()
	for _, p := range held {
		deliver(p)
	}
}
