// Package grpclimit limits the calls a gRPC server accepts with a
// ratelimit.Limiter: unary and stream server interceptors, keyed by the
// peer's IP address or by a metadata value, that refuse a call over its
// limit with codes.ResourceExhausted and a google.rpc.RetryInfo detail
// saying when to try again.
//
//	ic, err := grpclimit.New(limiter, grpclimit.Options{})
//	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary), grpc.StreamInterceptor(ic.Stream))
//
// A stream is one request: it is counted when it opens, whatever it sends
// afterwards. As in the HTTP middleware, the decision does not depend on
// the client: Redis is asked under a context that the client's
// cancellation does not end, bounded by Options.Timeout, so a client cannot
// turn a check into an error (and a fail-open pass) by cancelling its call.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicekit/sluice/ratelimit"
)

// ErrNoKey means a call carried neither the configured metadata key nor
// an IP peer address.
var ErrNoKey = errors.New("grpclimit: no key for the call")

// Options configures New. The zero value of each field means its default;
// negative or out-of-range values are errors.
type Options struct {
	// KeyFunc returns the limiter key of a call. An empty key with a nil
	// error lets the call through unlimited; an error is told to OnError
	// and handled as a Redis error is: by the Fallback if
	// ratelimit.Unavailable(err), else by codes.Internal (ErrNoKey, say: a
	// call without the metadata key over a listener without IP peers).
	// Default: the value of
	// MetadataKey if set and present, else the peer's IP address grouped
	// by IPv4PrefixLen and IPv6PrefixLen.
	KeyFunc func(ctx context.Context, fullMethod string) (string, error)
	// MetadataKey keys calls by the last value of this incoming metadata
	// key (an API key, a tenant id), falling back to the peer address when
	// the call has none. It is ignored when KeyFunc is set. A client picks
	// its metadata: key by it only where the value is checked before
	// (by an authenticating interceptor running first) or where a new
	// value per call buys nothing.
	MetadataKey string
	// IPv4PrefixLen and IPv6PrefixLen group peer addresses into networks,
	// as ratelimit.IPKey does. Defaults 32 and 64.
	IPv4PrefixLen int
	IPv6PrefixLen int
	// PolicyFunc returns the policies a call is checked against (per
	// method or per tenant); nil means the Limiter's own Limit. An error
	// is handled as KeyFunc's is. Default nil: the Limiter's own Limit for
	// every call.
	PolicyFunc func(ctx context.Context, fullMethod string) (*ratelimit.Policies, error)
	// Timeout bounds the wait for Redis. Default ratelimit.DefaultTimeout.
	Timeout time.Duration
	// Fallback says what happens to a call while Redis fails:
	// ratelimit.FallbackOpen (the default) passes it unchecked,
	// ratelimit.FallbackClosed ends it with codes.Unavailable, and
	// ratelimit.FallbackLocal decides it with an in-process limiter (see
	// ratelimit.FallbackLocal for its accuracy), so that whoever can slow
	// Redis cannot switch limiting off. A call whose client has gone never
	// passes unchecked.
	//
	// Only errors that ratelimit.Unavailable counts as an outage (timeouts,
	// failed connections, a server refusing service for a while) reach the
	// Fallback. Any other error is a configuration or semantic error: the
	// call ends with codes.Internal whatever the Fallback, the error goes
	// to OnError (and, when Redis was asked, the Checker reports it to the
	// Cache's observer), and limiting is never switched off for it.
	Fallback ratelimit.Fallback
	// LocalKeys and LocalHold configure FallbackLocal, as in
	// ratelimit.MiddlewareOptions; they must be 0 without it.
	LocalKeys int
	LocalHold time.Duration
	// OnError is told about every error, including Redis errors the local
	// fallback answered and the errors answered with codes.Internal.
	// Default: nothing.
	OnError func(ctx context.Context, fullMethod string, err error)
}

// Interceptors holds the unary and stream server interceptors of one
// Limiter; both share its deny cache.
type Interceptors struct {
	c    *ratelimit.Checker
	opts Options
}

// New returns the interceptors limiting calls with l. It returns an error
// wrapping ratelimit.ErrInvalidOptions for a nil l or an option out of
// range.
func New(l *ratelimit.Limiter, opts Options) (*Interceptors, error) {
	switch {
	case l == nil:
		return nil, fmt.Errorf("%w: nil *ratelimit.Limiter", ratelimit.ErrInvalidOptions)
	case l.Limit() == (ratelimit.Limit{}) && opts.PolicyFunc == nil:
		return nil, fmt.Errorf("%w: a Limiter without a Limit needs a PolicyFunc", ratelimit.ErrInvalidOptions)
	case opts.Timeout < 0:
		return nil, fmt.Errorf("%w: negative Timeout %v", ratelimit.ErrInvalidOptions, opts.Timeout)
	case opts.Fallback < ratelimit.FallbackOpen || opts.Fallback > ratelimit.FallbackLocal:
		return nil, fmt.Errorf("%w: grpclimit Fallback %v", ratelimit.ErrInvalidOptions, opts.Fallback)
	case opts.IPv4PrefixLen < 0 || opts.IPv4PrefixLen > 32:
		return nil, fmt.Errorf("%w: IPv4PrefixLen %d is not between 0 and 32", ratelimit.ErrInvalidOptions, opts.IPv4PrefixLen)
	case opts.IPv6PrefixLen < 0 || opts.IPv6PrefixLen > 128:
		return nil, fmt.Errorf("%w: IPv6PrefixLen %d is not between 0 and 128", ratelimit.ErrInvalidOptions, opts.IPv6PrefixLen)
	}
	ic := &Interceptors{opts: opts}
	c, err := ratelimit.NewChecker(l, ratelimit.CheckerOptions{
		Timeout:       opts.Timeout,
		FallbackLocal: opts.Fallback == ratelimit.FallbackLocal,
		LocalKeys:     opts.LocalKeys,
		LocalHold:     opts.LocalHold,
		OnLocal: func(ctx context.Context, err error) {
			method, _ := grpc.Method(ctx)
			ic.opts.OnError(ctx, method, err)
		},
	})
	if err != nil {
		return nil, err
	}
	ic.c = c
	if ic.opts.KeyFunc == nil {
		md, v4, v6 := strings.ToLower(opts.MetadataKey), opts.IPv4PrefixLen, opts.IPv6PrefixLen
		ic.opts.KeyFunc = func(ctx context.Context, _ string) (string, error) {
			if md != "" {
				if vs := metadata.ValueFromIncomingContext(ctx, md); len(vs) > 0 && vs[len(vs)-1] != "" {
					return "md:" + vs[len(vs)-1], nil
				}
			}
			if ip, ok := PeerIP(ctx); ok {
				return ratelimit.IPKey(ip, v4, v6), nil
			}
			return "", ErrNoKey
		}
	}
	if ic.opts.OnError == nil {
		ic.opts.OnError = func(context.Context, string, error) {}
	}
	return ic, nil
}

// PeerIP returns the IP address of the call's peer, if it has one.
func PeerIP(ctx context.Context) (netip.Addr, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}, false
	}
	if tcp, ok := p.Addr.(*net.TCPAddr); ok {
		ip, ok := netip.AddrFromSlice(tcp.IP)
		return ip.Unmap(), ok
	}
	ap, err := netip.ParseAddrPort(p.Addr.String())
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap().WithZone(""), true
}

// Unary is a grpc.UnaryServerInterceptor.
func (ic *Interceptors) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := ic.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// Stream is a grpc.StreamServerInterceptor. A stream is counted once, when
// it opens.
func (ic *Interceptors) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := ic.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// check returns nil when the call may proceed, or the status error to end
// it with.
func (ic *Interceptors) check(ctx context.Context, method string) error {
	key, err := ic.opts.KeyFunc(ctx, method)
	if err == nil && key == "" {
		return nil
	}
	var ps *ratelimit.Policies
	if err == nil && ic.opts.PolicyFunc != nil {
		ps, err = ic.opts.PolicyFunc(ctx, method)
	}
	var d ratelimit.Decision
	if err == nil {
		d, err = ic.c.Check(ctx, key, ps)
	}
	if err != nil {
		ic.opts.OnError(ctx, method, err)
		if !ratelimit.Unavailable(err) {
			// A configuration or semantic error: never a fallback.
			return status.Error(codes.Internal, "rate limit not checked")
		}
		if ic.opts.Fallback != ratelimit.FallbackOpen || ctx.Err() != nil {
			return status.Error(codes.Unavailable, "rate limiter unavailable")
		}
		return nil
	}
	if d.Allowed {
		return nil
	}
	return denial(d, ps)
}

// denial is the ResourceExhausted status of a denied call, with RetryInfo
// and, for policies, a QuotaFailure naming those without room.
func denial(d ratelimit.Decision, ps *ratelimit.Policies) error {
	st := status.New(codes.ResourceExhausted, "rate limit exceeded")
	details := []protoadapt.MessageV1{&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)}}
	if ps != nil {
		qf := &errdetails.QuotaFailure{}
		for i, p := range ps.List() {
			if i < len(d.Results) && !d.Results[i].Allowed {
				qf.Violations = append(qf.Violations, &errdetails.QuotaFailure_Violation{Subject: "policy:" + p.Name, Description: p.Limit.String()})
			}
		}
		details = append(details, qf)
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}
