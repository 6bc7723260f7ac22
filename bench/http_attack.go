package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/ratelimit"
)

// The 65k-key attack of issue 14, over HTTP: Redis is slowed past the
// middleware's Timeout by a TCP proxy in this process, and one flooding
// client (one IPv6 /64, a new address in it per request) hides among
// 65,536 other /64s, each sending one request, four times what the local
// limiter holds. The same load runs against FallbackLocal and the default
// FallbackOpen, each on its own server, limiter and key prefix.

const (
	attackKeys    = 65_536
	attackEvery   = 16                     // one flooding request per this many
	attackBurst   = 10                     // GCRA 10/s, burst 10, per /64
	attackTimeout = 50 * time.Millisecond  // the middleware's Timeout
	attackDelay   = 200 * time.Millisecond // the proxy's added latency
)

// attackRun is what one fallback let through.
type attackRun struct {
	Fallback     string  `json:"fallback"`
	Seconds      float64 `json:"seconds"`
	Requests     int64   `json:"requests"`
	OtherKeys    int64   `json:"other_keys_sent"`
	FloodSent    int64   `json:"flood_sent"`
	FloodAllowed int64   `json:"flood_allowed"`
	FloodBound   int64   `json:"flood_bound"` // burst + rate x time, the local limiter's documented accuracy
	Failed       int64   `json:"failed"`      // 503s and transport errors
	RedisErrors  int64   `json:"redis_errors"`
	Err          string  `json:"error,omitempty"`
}

// attack is the attack section's result.
type attack struct {
	Title string      `json:"title"`
	Runs  []attackRun `json:"runs"`
}

// slowProxy forwards TCP connections to a Redis, holding back every chunk
// of its replies for delay once delay is set: a Redis slowed by an attack,
// seen from the client. Replies on one connection stay in order, so
// pipelined replies queue behind each other.
type slowProxy struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // nanoseconds
	mu     sync.Mutex
	conns  []net.Conn // guarded by mu
	wg     sync.WaitGroup
}

func newSlowProxy(target string) (*slowProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &slowProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	return p, nil
}

func (p *slowProxy) addr() string { return p.ln.Addr().String() }

func (p *slowProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(u, c); u.Close() })
		p.wg.Go(func() {
			defer c.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := u.Read(buf)
				if n > 0 {
					time.Sleep(time.Duration(p.delay.Load()))
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	}
}

// close stops the proxy and waits for its goroutines.
func (p *slowProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// runAttack runs the attack against FallbackLocal and FallbackOpen. It is
// skipped on a Redis Cluster, whose nodes the proxy cannot stand in for.
func runAttack(ctx context.Context, b *bench, quick bool) *attack {
	dur := 3 * time.Second
	if quick {
		dur = 500 * time.Millisecond
	}
	res := &attack{Title: fmt.Sprintf("65k-key attack over HTTP: Redis slowed by %s behind a proxy, middleware Timeout %s; "+
		"one flooding IPv6 /64 (1 request in %d) among %d other /64s, %d keep-alive clients, GCRA %d/s burst %d per /64, %s per fallback",
		attackDelay, attackTimeout, attackEvery, attackKeys, httpClients, attackBurst, attackBurst, dur)}
	if b.srv.cluster {
		res.Runs = append(res.Runs, attackRun{Err: "skipped on a Redis Cluster"})
		return res
	}
	for _, fb := range []ratelimit.Fallback{ratelimit.FallbackLocal, ratelimit.FallbackOpen} {
		b.prog.show("http.attack", "fallback "+fb.String(), "running")
		run, err := attackOnce(ctx, b, fb, dur)
		if err != nil {
			run.Err = err.Error()
		}
		res.Runs = append(res.Runs, run)
	}
	return res
}

func attackOnce(ctx context.Context, b *bench, fb ratelimit.Fallback, dur time.Duration) (attackRun, error) {
	run := attackRun{Fallback: fb.String()}
	proxy, err := newSlowProxy(b.srv.addrs[0])
	if err != nil {
		return run, err
	}
	defer proxy.close()
	opt := b.srv.rueidisOption()
	opt.InitAddress = []string{proxy.addr()}
	opt.ForceSingleClient = true
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return run, err
	}
	defer c.Close()
	sc, err := sluice.New(ctx, c)
	if err != nil {
		return run, err
	}
	l, err := ratelimit.New(sc, ratelimit.Options{
		Algorithm: ratelimit.GCRA, Limit: ratelimit.PerSecond(attackBurst),
		Prefix: b.ns + "attack:" + fb.String() + ":",
	})
	if err != nil {
		return run, err
	}
	// The scripts are loaded and the connection is up before Redis slows.
	if _, err := l.Allow(ctx, "warm"); err != nil {
		return run, err
	}
	proxy.delay.Store(int64(attackDelay))

	var redisErrs atomic.Int64
	mw, err := ratelimit.NewMiddleware(l, ratelimit.MiddlewareOptions{
		TrustedProxies: loopbackProxies,
		ClientIPHeader: ratelimit.XForwardedFor,
		Timeout:        attackTimeout,
		Fallback:       fb,
		OnError:        func(*http.Request, error) { redisErrs.Add(1) },
	})
	if err != nil {
		return run, err
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(okHandler)))
	defer srv.Close()
	transport := &http.Transport{MaxIdleConnsPerHost: httpClients, MaxConnsPerHost: httpClients, DisableCompression: true}
	defer transport.CloseIdleConnections()
	hc := &http.Client{Transport: transport, Timeout: 10 * time.Second}

	var next, sent, other, floodSent, floodOK, failed atomic.Int64
	start := time.Now()
	deadline := start.Add(dur)
	var wg sync.WaitGroup
	for range httpClients {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(deadline) {
				i := next.Add(1) - 1
				flood := i%attackEvery == 0
				var ip string
				if flood {
					// A new address in the flooder's /64 each time.
					ip = fmt.Sprintf("2001:db8:ffff:ffff:%x:%x::1", i>>16&0xffff, i&0xffff)
				} else {
					k := (i - i/attackEvery - 1) % attackKeys
					ip = fmt.Sprintf("2001:db8:%x:%x::1", k>>8, k&0xff)
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
				if err != nil {
					failed.Add(1)
					return
				}
				req.Header.Set("X-Forwarded-For", ip)
				sent.Add(1)
				if flood {
					floodSent.Add(1)
				} else {
					other.Add(1)
				}
				resp, err := hc.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode == http.StatusOK && flood:
					floodOK.Add(1)
				case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests:
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	run.Seconds = elapsed.Seconds()
	run.Requests, run.OtherKeys, run.FloodSent, run.FloodAllowed = sent.Load(), min(other.Load(), attackKeys), floodSent.Load(), floodOK.Load()
	run.Failed, run.RedisErrors = failed.Load(), redisErrs.Load()
	run.FloodBound = attackBurst + int64(float64(attackBurst)*elapsed.Seconds()+1)
	return run, nil
}

func printAttack(w io.Writer, a *attack) {
	if a == nil {
		return
	}
	fmt.Fprintf(w, "\n%s\n", a.Title)
	for _, r := range a.Runs {
		if r.Err != "" {
			fmt.Fprintf(w, "  fallback %-6s failed: %s\n", r.Fallback, r.Err)
			continue
		}
		fmt.Fprintf(w, "  fallback %-6s flooder: %5d of %5d requests served, %s; %d requests in %.1fs, %d other keys, %d failed, %d Redis errors\n",
			r.Fallback, r.FloodAllowed, r.FloodSent, attackVerdict(r), r.Requests, r.Seconds, r.OtherKeys, r.Failed, r.RedisErrors)
	}
}

// attackVerdict says how the flooder's share compares with what the
// fallback promises. FallbackOpen serves everyone while Redis is slow, so a
// flooder served in full is what it is meant to do, not a fault; only
// FallbackLocal promises the local bound.
func attackVerdict(r attackRun) string {
	switch {
	case r.Fallback != ratelimit.FallbackLocal.String():
		return fmt.Sprintf("as expected: %s lets every request through while Redis cannot decide (local's bound would be %d)",
			r.Fallback, r.FloodBound)
	case r.FloodAllowed > r.FloodBound:
		return fmt.Sprintf("OVER the local bound (burst + rate x time = %d): a fault", r.FloodBound)
	}
	return fmt.Sprintf("within the local bound (burst + rate x time = %d)", r.FloodBound)
}
