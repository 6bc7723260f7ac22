package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicekit/sluice/grpc/grpclimit"
	"github.com/sluicekit/sluice/ratelimit"
)

// grpcNode is a real gRPC server on loopback whose unary and stream
// interceptors (grpclimit, FallbackLocal, keyed by the "x-client"
// metadata) limit the standard health service, and a client of it: Check
// is a unary call, Watch a stream, counted when it opens.
type grpcNode struct {
	spec   limiterSpec
	prefix string
	lim    *ratelimit.Limiter
	loopbackGRPC
	health healthpb.HealthClient

	mu       sync.Mutex
	timeouts []time.Time // OnError for an outage (outageErr)
}

func (w *world) newGRPC(t testing.TB, n *node) {
	ln := n.limits
	g := &grpcNode{spec: limiterSpec{ratelimit.GCRA, ratelimit.Limit{Rate: 4, Period: w.cfg.Lease / 2, Burst: 3}}, prefix: "sluice:rl:grpc:"}
	l, err := ratelimit.New(ln.sc, ratelimit.Options{Algorithm: g.spec.algo, Limit: g.spec.limit, Prefix: g.prefix})
	if err != nil {
		t.Fatal(err)
	}
	g.lim = l
	ic, err := grpclimit.New(l, grpclimit.Options{MetadataKey: "x-client", Fallback: ratelimit.FallbackLocal,
		OnError: func(_ context.Context, _ string, err error) {
			g.mu.Lock()
			defer g.mu.Unlock()
			if outageErr(err) {
				g.timeouts = append(g.timeouts, time.Now())
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary), grpc.StreamInterceptor(ic.Stream))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	g.start(t, srv)
	g.health = healthpb.NewHealthClient(g.conn)
	ln.grpc = g
}

func (g *grpcNode) close() {
	if g == nil {
		return
	}
	g.loopbackGRPC.close()
}

// loopbackGRPC is a gRPC server on a loopback port of its own and a client
// connection to it.
type loopbackGRPC struct {
	srv    *grpc.Server
	conn   *grpc.ClientConn
	served sync.WaitGroup
}

// start serves srv (its services registered) and connects to it.
func (l *loopbackGRPC) start(t testing.TB, srv *grpc.Server) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.srv = srv
	l.served.Go(func() { _ = srv.Serve(lis) })
	if l.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		srv.Stop()
		t.Fatal(err)
	}
}

func (l *loopbackGRPC) close() {
	_ = l.conn.Close()
	l.srv.Stop()
	l.served.Wait()
}

// grpcWorker sends sequences of calls, one client key at a time (a third
// of them over 1024 bytes), to node n's gRPC server, unary and stream
// alike, and sequences of Checks to its Checker; each answer is judged
// by the exact model.
func (w *world) grpcWorker(ctx context.Context, n *node, rng *rand.Rand) {
	ln := n.limits
	period := w.cfg.Lease / 2
	for ctx.Err() == nil && !n.closed.Load() {
		c := ln.newClient(n, rng, false)
		if rng.IntN(2) == 0 {
			w.checkerSequence(ctx, n, c, rng)
			continue
		}
		g := ln.grpc
		key := "md:" + c.apikey
		k := &exactKey{key: boundKey(key), born: time.Now(), what: "gRPC", models: []*algoModel{newModel(g.spec)}}
		if rng.IntN(20) == 0 {
			w.grpcSemantic(ctx, n, g, c)
			continue
		}
		for range 4 + rng.IntN(10) {
			if ctx.Err() != nil || n.closed.Load() {
				break
			}
			stream := rng.IntN(2) == 0
			call := time.Now()
			err := g.call(ctx, c.apikey, stream)
			ret := time.Now()
			w.judgeGRPC(ctx, n, g, k, stream, call, ret, err)
			sleep(ctx, pause(rng, period))
		}
	}
}

// call makes one call with client key apikey: a health Check, or a Watch
// stream that is counted once it sends its first message.
func (g *grpcNode) call(ctx context.Context, apikey string, stream bool) error {
	cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "x-client", apikey), 2*time.Second)
	defer cancel()
	if !stream {
		_, err := g.health.Check(cctx, &healthpb.HealthCheckRequest{})
		return err
	}
	s, err := g.health.Watch(cctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	_, err = s.Recv()
	return err
}

func (w *world) judgeGRPC(ctx context.Context, n *node, g *grpcNode, k *exactKey, stream bool, call, ret time.Time, err error) {
	if n.closed.Load() || ctx.Err() != nil {
		return
	}
	if d, ok := ctx.Deadline(); ok && status.Code(err) == codes.DeadlineExceeded && time.Until(d) < 100*time.Millisecond {
		return // the workload's end, which the server may see a moment first
	}
	op := map[bool]string{true: "gRPC stream", false: "gRPC unary"}[stream]
	w.count("grpc." + strings.Fields(op)[1])
	st := status.Convert(err)
	where := fmt.Sprintf("%s for %s, called %s", op, short(k.key), w.hist.since(call))
	var delay time.Duration
	switch st.Code() {
	case codes.OK:
	case codes.ResourceExhausted:
		found := false
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				delay, found = ri.GetRetryDelay().AsDuration(), true
			}
		}
		if !found || delay <= 0 {
			w.hist.violation("%s: ResourceExhausted without a positive RetryInfo (%v)", where, st.Details())
		}
	default:
		if errors.Is(err, context.Canceled) || w.hist.faultNear(call, ret, 0) && st.Code() == codes.DeadlineExceeded {
			k.forget()
			return
		}
		// Internal is for semantic errors, Unavailable for FallbackClosed
		// (or a KeyFunc outage): neither here.
		w.hist.violation("%s: %v (FallbackLocal, no semantic error)", where, err)
		k.forget()
		return
	}
	if w.metrics.localWithin(g.prefix, call, ret) || w.outage(n.i, call, ret) {
		k.forget() // maybe decided locally
		return
	}
	allowed := st.Code() == codes.OK
	if !k.known() || w.wipedSince(k.born, ret) {
		k.forget()
		return
	}
	a, b := call.UnixMicro(), ret.UnixMicro()
	m := k.models[0]
	v := m.judge(a, b, 1)
	w.count("exact.grpc")
	switch {
	case allowed && v.mustDeny:
		w.hist.violation("exact limit: %s was let through where the algorithm refuses it (model: %s)", where, k.describe([]verdict{v}))
		k.forget()
		return
	case !allowed && v.mustAllow:
		w.hist.violation("exact limit: %s was refused where the algorithm allows it (model: %s)", where, k.describe([]verdict{v}))
		k.forget()
		return
	case !allowed && v.mustDeny:
		lo := v.lo.retry - durTolUS - m.cacheSlack
		hi := v.hi.retry + durTolUS
		if d := delay.Microseconds(); d < lo || d > hi {
			w.hist.violation("exact limit: %s: RetryInfo %v, the model's RetryAfter between %v and %v", where, delay, us(lo), us(hi))
			k.forget()
			return
		}
	}
	k.note(w, "%s called %s returned %s: %v", op, w.hist.since(call), w.hist.since(ret), err)
	if msg := m.record(a, b, 1, outcome{allowed: allowed, rem: -1, reset: -1}); msg != "" {
		w.hist.violation("exact limit: %s: %s", where, msg)
	}
}

// grpcSemantic: a call whose counter holds a string ends with
// codes.Internal, never with the local fallback.
func (w *world) grpcSemantic(ctx context.Context, n *node, g *grpcNode, c client) {
	rkey := g.lim.RedisKey(boundKey("md:" + c.apikey))
	setAt := time.Now()
	if !w.setString(rkey) {
		return
	}
	defer w.delKey(rkey)
	w.count("grpc.semantic")
	call := time.Now()
	err := g.call(ctx, c.apikey, false)
	ret := time.Now()
	// A call the run's end cut off (ctx, here the workload's) is no
	// decision: seen on go-redis, a call 3 ms before the end returned
	// DeadlineExceeded.
	if code := status.Code(err); code != codes.Internal && ctx.Err() == nil && !n.closed.Load() && !w.wipedSince(setAt, ret) && !timedOut(&g.mu, &g.timeouts, call, ret) &&
		!w.metrics.localWithin(g.prefix, call, ret) {
		w.hist.violation("gRPC unary for a client whose counter holds a string (called %s): %v, want Internal: a semantic error is never the fallback", w.hist.since(call), err)
	}
}

// checkerSequence sends a sequence of Checks for one key to node n's
// Checker (no fallback: an outage is an error the caller sees), now and
// then under a Policies set, or with the key's counter holding a string.
func (w *world) checkerSequence(ctx context.Context, n *node, c client, rng *rand.Rand) {
	ln := n.limits
	key := boundKey(c.apikey)
	k := &exactKey{key: key, born: time.Now(), what: "Checker", models: []*algoModel{newModel(ln.chkSpec)}}
	if rng.IntN(20) == 0 {
		rkey := ln.chkLim.RedisKey(key)
		setAt := time.Now()
		if !w.setString(rkey) {
			return
		}
		defer w.delKey(rkey)
		w.count("checker.semantic")
		call := time.Now()
		_, err := ln.checker.Check(context.Background(), c.apikey, nil)
		ret := time.Now()
		// An outage (a timeout, an exhausted pool) needs no fault
		// injected; a server's reply that Unavailable counts as one is
		// the semantic error sent to a fallback.
		if (err == nil || ratelimit.Unavailable(err) && !outageErr(err)) && !n.closed.Load() && !w.wipedSince(setAt, ret) {
			w.hist.violation("Checker for a key whose counter holds a string (called %s): %v, want an error Unavailable does not count as an outage", w.hist.since(call), err)
		}
		return
	}
	period := w.cfg.Lease / 2
	for range 4 + rng.IntN(10) {
		if ctx.Err() != nil || n.closed.Load() {
			break
		}
		cctx, cancel := context.WithCancel(ctx)
		gone := rng.IntN(8) == 0
		if gone {
			cancel() // the caller gone: the decision is not the caller's
		}
		call := time.Now()
		d, err := ln.checker.Check(cctx, c.apikey, nil)
		ret := time.Now()
		cancel()
		w.count("checker.check")
		if err != nil {
			if gone && errors.Is(err, context.Canceled) && ctx.Err() == nil {
				w.hist.violation("Checker for %s (called %s) with its caller gone: %v: the decision must not be the caller's", short(key), w.hist.since(call), err)
			} else if !ratelimit.Unavailable(err) && !n.closed.Load() {
				// An outage is the caller's to decide (a slow Redis, an
				// exhausted pool): Check returns it, as documented.
				w.hist.violation("Checker for %s (called %s): %v, an error that is no outage, with no semantic error", short(key), w.hist.since(call), err)
			}
			k.forget()
		} else {
			w.judge(k, call, ret, 1, d.Allowed, d.Results, "Check")
		}
		sleep(ctx, pause(rng, period))
	}
}
