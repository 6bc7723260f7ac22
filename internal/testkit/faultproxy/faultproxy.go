// Package faultproxy is a test-only TCP proxy that injects network faults
// between a Redis client and redis-server: added latency with jitter, a
// blackhole, lost replies and reset connections. Modes change at runtime and
// apply at once to every connection, current and future.
//
// Faults are modelled on what TCP can actually do to a byte stream. TCP
// never loses bytes in the middle of a connection that stays up: it delivers
// them late (retransmission) or the connection dies. A proxy that silently
// discarded part of a RESP stream would desynchronise the client's
// request/reply matching and produce failures no real network produces. So:
//
//   - Latency delays each chunk read from one side by base plus a uniform
//     random [0, jitter) before writing it to the other side, in order: one
//     goroutine per direction per connection writes the chunks in the order
//     they were read, so jitter never reorders bytes.
//   - Blackhole stops forwarding in both directions while keeping the
//     connections open, like a partition: the client's writes succeed (into
//     buffers) and nothing comes back. Bytes are held, not dropped, and flow
//     when the blackhole ends, as TCP retransmission would deliver them.
//     New connections are accepted and stalled the same way.
//   - DropReplies forwards requests to the server and discards what the
//     server answers: the request ran, the reply was lost. Because the
//     stream of a connection that lost a reply can never be matched up
//     again, DropReplies(false) resets every connection that lost bytes, as
//     the network would eventually have done.
//   - ResetAll closes every current connection with a TCP RST on both sides.
//
// Memory is bounded: each direction of each connection queues at most
// queueChunks chunks of at most chunkSize bytes; beyond that the proxy stops
// reading and TCP flow control pushes back on the sender.
package faultproxy

import (
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

const (
	chunkSize   = 16 << 10
	queueChunks = 64
	dialTimeout = 2 * time.Second
)

// Proxy forwards TCP connections from its listen address to one target.
// Its methods are safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup // accept loop and every forwarding goroutine

	mu          sync.Mutex
	links       map[*link]struct{} // guarded by mu
	base        time.Duration      // latency per direction
	jitter      time.Duration
	blackhole   bool
	dropReplies bool
	changed     chan struct{} // closed (and replaced) when blackhole changes
	closed      bool
	accepted    int
	heldReplies int // reply chunks a blackhole has held back
}

// New starts a proxy listening on 127.0.0.1 on a free port that forwards
// every connection to target (host:port). Close stops it.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, ln: ln, links: make(map[*link]struct{}), changed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address clients should connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetLatency delays every chunk, in each direction, by base plus a uniform
// random duration in [0, jitter). A round trip therefore gains between
// 2*base and 2*(base+jitter). It applies to bytes read from now on.
func (p *Proxy) SetLatency(base, jitter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.base, p.jitter = max(base, 0), max(jitter, 0)
}

// Blackhole stops (on) or resumes (off) forwarding in both directions. The
// connections stay open and held bytes are delivered when it ends.
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackhole == on {
		return
	}
	p.blackhole = on
	close(p.changed)
	p.changed = make(chan struct{})
}

// HeldReplies returns how many chunks of server replies a blackhole has
// held back so far. A reply held back is one whose request reached the
// server before the blackhole: it took effect there, and the client does
// not know.
func (p *Proxy) HeldReplies() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.heldReplies
}

// DropReplies makes the proxy discard (on) every byte the server sends
// while requests still reach it. Turning it off resets the connections that
// lost bytes (see the package doc).
func (p *Proxy) DropReplies(on bool) {
	p.mu.Lock()
	p.dropReplies = on
	var tainted []*link
	if !on {
		for l := range p.links {
			if l.tainted {
				tainted = append(tainted, l)
			}
		}
	}
	p.mu.Unlock()
	for _, l := range tainted {
		l.reset()
	}
}

// ResetAll closes every current connection with a TCP RST on both the
// client and the server side. New connections are accepted as usual.
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.reset()
	}
}

// Conns returns the number of connections currently open through the
// proxy.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Accepted returns how many client connections the proxy has accepted.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Close stops accepting, resets every connection and waits for every
// goroutine of the proxy to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.ResetAll()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary failure (out of file descriptors): try again shortly.
			time.Sleep(5 * time.Millisecond)
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve dials the target for client connection c and starts forwarding.
func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	s, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		// The server is down: the client sees its connection reset, as it
		// would see a refused connection without the proxy.
		rst(c)
		return
	}
	l := &link{p: p, client: c, server: s, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		rst(c)
		rst(s)
		return
	}
	p.links[l] = struct{}{}
	p.accepted++
	p.mu.Unlock()

	var fw sync.WaitGroup
	for _, d := range []struct {
		src, dst net.Conn
		reply    bool
	}{{c, s, false}, {s, c, true}} {
		q := make(chan chunk, queueChunks)
		fw.Add(2)
		go func() { defer fw.Done(); l.read(d.src, q, d.reply) }()
		go func() { defer fw.Done(); l.write(d.dst, q, d.reply) }()
	}
	fw.Wait()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// link is one proxied connection: the client's side and the server's.
type link struct {
	p              *Proxy
	client, server net.Conn
	tainted        bool // lost server bytes to DropReplies; guarded by p.mu
	done           chan struct{}
	once           sync.Once
}

// chunk is bytes read from one side and when they may be written out.
type chunk struct {
	data    []byte
	release time.Time
}

// close ends the link: both connections closed, every goroutine of the
// link unblocked. graceful closes with FIN, otherwise RST.
func (l *link) close(graceful bool) {
	l.once.Do(func() {
		close(l.done)
		if graceful {
			l.client.Close()
			l.server.Close()
		} else {
			rst(l.client)
			rst(l.server)
		}
	})
}

func (l *link) reset() { l.close(false) }

// rst closes c so that the peer gets a RST instead of a FIN.
func rst(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // best effort: a plain close still ends the connection
	}
	c.Close()
}

// read copies src into q, stamping each chunk with its release time, until
// src fails; then it closes q so the writer can flush and end the link.
func (l *link) read(src net.Conn, q chan<- chunk, reply bool) {
	defer close(q)
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p := l.p
			p.mu.Lock()
			// A link that lost server bytes never forwards any again:
			// DropReplies(false) resets it, but bytes read between the
			// switch and the reset would reach the client after a gap,
			// and it would take them for the replies of earlier requests
			// (a real connection loses nothing in its middle).
			drop := reply && (p.dropReplies || l.tainted)
			if drop {
				l.tainted = true
			}
			delay := p.base
			if p.jitter > 0 {
				delay += rand.N(p.jitter)
			}
			p.mu.Unlock()
			if !drop {
				c := chunk{data: append([]byte(nil), buf[:n]...), release: time.Now().Add(delay)}
				select {
				case q <- c:
				case <-l.done:
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// write sends the chunks of q to dst in order, each no earlier than its
// release time and only while no blackhole is on. When q is closed (the
// other side closed) it ends the link after the last chunk. reply says that
// dst is the client.
func (l *link) write(dst net.Conn, q <-chan chunk, reply bool) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var c chunk
		var ok bool
		select {
		case c, ok = <-q:
		case <-l.done:
			return
		}
		if !ok {
			l.close(true)
			return
		}
		if d := time.Until(c.release); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-l.done:
				return
			}
		}
		if !l.waitOpen(reply) {
			return
		}
		if _, err := dst.Write(c.data); err != nil {
			l.reset()
			return
		}
	}
}

// waitOpen waits while a blackhole is on, counting a held reply chunk. It
// reports false if the link ended meanwhile.
func (l *link) waitOpen(reply bool) bool {
	for counted := false; ; {
		l.p.mu.Lock()
		on, changed := l.p.blackhole, l.p.changed
		if on && reply && !counted {
			l.p.heldReplies++
			counted = true
		}
		l.p.mu.Unlock()
		if !on {
			return true
		}
		select {
		case <-changed:
		case <-l.done:
			return false
		}
	}
}
