// Package rls is a rate limit service for Envoy and the gateways built on
// it (Istio, Contour, Gloo/kgateway, Emissary): it answers ShouldRateLimit
// of envoy.service.ratelimit.v3.RateLimitService from a configuration in
// envoyproxy/ratelimit's YAML format, with sluice's decision: all
// descriptors of a request decided in one atomic script call, allowed only
// if every descriptor allows, and a denied request counted in none of
// them. A request refused by a tight per-user limit then leaves the
// per-organisation budget to the organisation's other users, where
// envoyproxy/ratelimit counts every descriptor of every request.
//
// Register a Service on a grpc.Server:
//
//	l, err := ratelimit.New(sc, ratelimit.Options{Prefix: "envoy:"}) // no Limit of its own
//	cfg, err := rls.Load("config/")
//	svc, err := rls.New(l, cfg, rls.Options{})
//	rlspb.RegisterRateLimitServiceServer(grpcServer, svc)
//
// The Limiter provides Redis, the key prefix and the deny cache; it needs
// no Limit of its own (the rules are the limits). Watch reloads the configuration when its files
// change. docs/envoy.md in the repository has the command, sluice-ratelimit,
// and the Envoy side.
//
// # Matching
//
// A descriptor selects a rule as envoyproxy/ratelimit selects it (see
// Config and domain.match): level by level, its key with its value first,
// then a value with '*', then its key alone; the rule of the last entry's
// level, or none. An unmatched descriptor, an unlimited one and one whose
// rule another matched rule replaces answer OK and count nothing; a rule
// of 0 requests denies without counting.
//
// # Counters
//
// A descriptor's counter is named by its entries (a share_threshold
// wildcard's pattern standing for the value it matched) under the
// domain, the algorithm and the unit: a reload that changes a rule's
// requests_per_unit keeps its counts, one that changes its unit or
// algorithm starts it afresh. All counters of one request share one Redis
// Cluster slot, so that one script decides them: by default the slot of
// the domain, so a domain's whole load is on one shard. A domain with the
// extension shard_key spreads its counters by that entry's value (the
// tenant, say): every counter of the domain then counts per value, also
// a descriptor that does not carry the key.
package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicekit/sluice/ratelimit"
)

// Headers selects the rate-limit header fields a Service asks Envoy to add
// to every response it decides.
type Headers int

const (
	// NoHeaders adds none. It is the default.
	NoHeaders Headers = iota
	// IETFHeaders adds RateLimit-Policy and RateLimit
	// (draft-ietf-httpapi-ratelimit-headers-11), one item per limited
	// descriptor, as sluice's HTTP middleware writes them.
	IETFHeaders
	// XRateLimitHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset of the descriptor closest to its limit (the first
	// that denied, if any), as Envoy's enable_x_ratelimit_headers and
	// envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED write them.
	XRateLimitHeaders
	// BothHeaders adds both sets.
	BothHeaders
)

// Defaults of Options.
const (
	// DefaultMaxRequestBytes bounds the bytes of keys and values in one
	// request.
	DefaultMaxRequestBytes = 64 << 10
)

// Options configures New. The zero value of each field means its default.
type Options struct {
	// Timeout bounds the wait for Redis per request. Default
	// ratelimit.DefaultTimeout (200ms). Keep it below the timeout of
	// Envoy's rate limit filter (20ms by default) when FallbackLocal must
	// answer before Envoy gives up.
	Timeout time.Duration
	// FallbackLocal decides with an in-process bucket per counter while
	// Redis is unavailable (see ratelimit.FallbackLocal for its accuracy:
	// per process). Without it, an outage is a codes.Unavailable error,
	// and Envoy's failure_mode_deny decides.
	FallbackLocal bool
	// LocalKeys and LocalHold are those of ratelimit.CheckerOptions.
	LocalKeys int
	LocalHold time.Duration
	// ShadowMode decides and reports every request but answers OK to all
	// (envoyproxy/ratelimit's SHADOW_MODE): counters count what they
	// would have, and a denied request still counts nowhere.
	ShadowMode bool
	// Headers adds rate-limit header fields to responses. Default none.
	Headers Headers
	// MaxRequestBytes bounds the total length of the keys and values of
	// one request's descriptors. Default DefaultMaxRequestBytes; a larger
	// request is refused with codes.InvalidArgument.
	MaxRequestBytes int
	// Logger gets a record per request refused with an error (Warn, or
	// Error for codes.Internal). Default slog.Default().
	Logger *slog.Logger
	// Metrics receives each decision, for per-domain and per-rule
	// counts. Default: none. NewMetrics makes one on OpenTelemetry.
	Metrics Recorder
}

// Recorder is told about each decision of a Service: the request's domain
// and code (the domain empty when it is not configured), and for each
// descriptor with a rule, the rule's name (or its path of configured keys
// and values) and what happened to it. It is called synchronously; keep it fast.
type Recorder interface {
	Request(domain string, code Code)
	Descriptor(domain, rule string, outcome Outcome)
}

// Code is a request's answer, for a Recorder.
type Code int

// Codes of a request.
const (
	CodeOK Code = iota
	CodeOverLimit
	CodeError
)

// String returns the code's metric value.
func (c Code) String() string {
	switch c {
	case CodeOK:
		return "ok"
	case CodeOverLimit:
		return "over_limit"
	}
	return "error"
}

// Outcome is what a request did to one descriptor's rule, for a Recorder.
type Outcome int

// Outcomes of a descriptor.
const (
	// WithinLimit: the rule had room.
	WithinLimit Outcome = iota
	// OverLimit: the rule had no room and denied the request.
	OverLimit
	// ShadowOverLimit: a shadow rule (or any rule in global shadow mode)
	// had no room and did not deny.
	ShadowOverLimit
	// Unlimited: an unlimited rule.
	Unlimited
	// Replaced: another matched rule replaced this one.
	Replaced
)

// String returns the outcome's metric value.
func (o Outcome) String() string {
	return [...]string{"within_limit", "over_limit", "shadow_over_limit", "unlimited", "replaced"}[o]
}

// Errors of New.
var (
	// ErrInvalidOptions means New was given a nil Limiter or Config, or an
	// option out of range.
	ErrInvalidOptions = errors.New("rls: invalid options")
)

// Service answers ShouldRateLimit. It is safe for concurrent use and
// starts no goroutine.
type Service struct {
	rlspb.UnimplementedRateLimitServiceServer
	checker *ratelimit.Checker
	opts    Options
	log     *slog.Logger
	config  atomic.Pointer[Config]
}

// New returns a Service deciding with l under cfg.
func New(l *ratelimit.Limiter, cfg *Config, opts Options) (*Service, error) {
	switch {
	case l == nil:
		return nil, fmt.Errorf("%w: nil *ratelimit.Limiter", ErrInvalidOptions)
	case cfg == nil:
		return nil, fmt.Errorf("%w: nil *Config", ErrInvalidOptions)
	case opts.Headers < NoHeaders || opts.Headers > BothHeaders:
		return nil, fmt.Errorf("%w: Headers %d", ErrInvalidOptions, opts.Headers)
	case opts.MaxRequestBytes < 0:
		return nil, fmt.Errorf("%w: negative MaxRequestBytes", ErrInvalidOptions)
	}
	if opts.MaxRequestBytes == 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	s := &Service{opts: opts, log: opts.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	checker, err := ratelimit.NewChecker(l, ratelimit.CheckerOptions{
		Timeout: opts.Timeout, FallbackLocal: opts.FallbackLocal,
		LocalKeys: opts.LocalKeys, LocalHold: opts.LocalHold,
		OnLocal: func(ctx context.Context, err error) {
			s.log.WarnContext(ctx, "rls: redis unavailable, decided locally", "err", err)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	s.checker = checker
	s.config.Store(cfg)
	return s, nil
}

// SetConfig makes cfg the configuration of every request that starts from
// now on; requests in flight finish under the one they started with.
func (s *Service) SetConfig(cfg *Config) {
	if cfg != nil {
		s.config.Store(cfg)
	}
}

// Config returns the configuration in force.
func (s *Service) Config() *Config { return s.config.Load() }

// limited is one descriptor of a request that has a rule: its counter and
// where its answer goes.
type limited struct {
	index   int // in the request
	rule    *rule
	counter int // in the call's counters, or overAlways or peekZero
	shadow  bool
}

// Counters of descriptors decided without Redis.
const (
	overAlways = -1 // a rule of 0 requests, or hits above the rule's capacity
	peekZero   = -2 // hits 0 on a rule of 0 requests
)

// ShouldRateLimit decides a request. Its gRPC errors:
//   - codes.InvalidArgument: an empty domain, no descriptors, a
//     descriptor without entries or with an entry without a key, more
//     than ratelimit.MaxCounters limited descriptors, keys and values over
//     MaxRequestBytes, is_negative_hits, or descriptors that disagree on
//     the domain's shard_key;
//   - codes.NotFound: a domain the configuration does not have;
//   - codes.Unavailable: Redis could not answer in time and FallbackLocal
//     is off;
//   - codes.Internal: Redis answered with an error (a key holding another
//     type of value, say).
//
// Nothing is counted for a request answered with an error. Envoy treats
// every error alike: it lets the request through, or refuses it when its
// failure_mode_deny is set.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	resp, code, err := s.decide(ctx, req)
	if rec := s.opts.Metrics; rec != nil {
		// A domain the configuration lacks is any string a client sent:
		// not a label.
		dom := req.GetDomain()
		if s.config.Load().domains[dom] == nil {
			dom = ""
		}
		rec.Request(dom, code)
	}
	if err != nil {
		st, _ := status.FromError(err)
		lvl := slog.LevelWarn
		if st.Code() == codes.Internal {
			lvl = slog.LevelError
		}
		s.log.Log(ctx, lvl, "rls: request refused", "domain", req.GetDomain(), "code", st.Code().String(), "err", st.Message())
		return nil, err
	}
	return resp, nil
}

func (s *Service) decide(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, Code, error) {
	cfg := s.config.Load()
	if err := s.validate(req); err != nil {
		return nil, CodeError, err
	}
	dom := cfg.domains[req.Domain]
	if dom == nil {
		return nil, CodeError, status.Errorf(codes.NotFound, "domain %q is not configured", req.Domain)
	}
	descs := req.Descriptors
	statuses := make([]*rlspb.RateLimitResponse_DescriptorStatus, len(descs))
	matches := make([]match, len(descs))
	replaced := make(map[string]bool)
	group := req.Domain
	shardValue, sharded := "", false
	for i, d := range descs {
		entries := entriesOf(d)
		if d.GetLimit() != nil {
			m, err := overrideRule(d.GetLimit(), entries)
			if err != nil {
				return nil, CodeError, err
			}
			matches[i] = m
		} else {
			matches[i] = dom.match(entries)
		}
		if r := matches[i].rule; r != nil {
			for _, name := range r.Replaces {
				replaced[name] = true
			}
		}
		if dom.shardKey != "" {
			for _, e := range entries {
				if e.key != dom.shardKey {
					continue
				}
				if sharded && e.value != shardValue {
					return nil, CodeError, status.Errorf(codes.InvalidArgument, "descriptors disagree on shard key %q", dom.shardKey)
				}
				shardValue, sharded = e.value, true
			}
		}
	}
	if sharded {
		group = req.Domain + "\x00" + shardValue
	}
	var (
		counters     []ratelimit.Counter
		lims         []limited
		byKey        = make(map[string]int) // counter key and kind: its index in counters
		deniedAtOnce bool
	)
	for i, d := range descs {
		r := matches[i].rule
		switch {
		case r == nil:
			statuses[i] = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
			continue
		case r.Name != "" && replaced[r.Name]:
			statuses[i] = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
			s.record(req.Domain, r, Replaced)
			continue
		case r.Unlimited:
			statuses[i] = &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
			s.record(req.Domain, r, Unlimited)
			continue
		}
		shadow := r.Shadow || s.opts.ShadowMode
		cost, peek := hitsOf(req, d)
		pol, aligned, ok := r.policy()
		switch {
		case !ok && peek:
			// A look at a rule of 0 requests: nothing to count, nothing
			// over.
			lims = append(lims, limited{index: i, rule: r, counter: peekZero, shadow: shadow})
			continue
		case !ok, !peek && cost > r.capacity():
			// A rule of 0 requests, or more hits than the rule could ever
			// allow at once: over its limit, as envoyproxy/ratelimit finds
			// it, without asking Redis; the request is counted nowhere.
			lims = append(lims, limited{index: i, rule: r, counter: overAlways, shadow: shadow})
			deniedAtOnce = deniedAtOnce || !shadow
			continue
		}
		key := counterName(entriesOf(d), matches[i].shared)
		kind := strconv.Itoa(int(r.Algorithm)) + ":" + strconv.FormatInt(int64(r.period), 10) + ":" + key
		if j, dup := byKey[kind]; dup {
			// The same descriptor twice counts its hits twice, in one
			// counter, as envoyproxy/ratelimit's two increments would.
			c := &counters[j]
			switch {
			case peek:
			case c.Peek:
				c.Cost, c.Peek = cost, false
			default:
				c.Cost += cost
			}
			c.Shadow = c.Shadow && shadow
			lims = append(lims, limited{index: i, rule: r, counter: j, shadow: shadow})
			continue
		}
		byKey[kind] = len(counters)
		lims = append(lims, limited{index: i, rule: r, counter: len(counters), shadow: shadow})
		counters = append(counters, ratelimit.Counter{Key: key, Policy: pol, Aligned: aligned, Cost: cost, Peek: peek, Shadow: shadow})
	}
	if len(counters) > ratelimit.MaxCounters {
		return nil, CodeError, status.Errorf(codes.InvalidArgument, "%d limited descriptors; at most %d", len(counters), ratelimit.MaxCounters)
	}
	var dec ratelimit.Decision
	if len(counters) > 0 && !deniedAtOnce {
		var err error
		dec, err = s.checker.CheckCounters(ctx, group, counters)
		if err != nil {
			return nil, CodeError, s.statusOf(err)
		}
	}
	allowed := !deniedAtOnce && (len(counters) == 0 || dec.Allowed)
	for _, lm := range lims {
		st := &rlspb.RateLimitResponse_DescriptorStatus{
			Code:         rlspb.RateLimitResponse_OK,
			CurrentLimit: &rlspb.RateLimitResponse_RateLimit{Name: lm.rule.Name, RequestsPerUnit: lm.rule.RequestsPerUnit, Unit: lm.rule.Unit},
		}
		room := false
		switch {
		case lm.counter == peekZero:
			room = true
		case lm.counter == overAlways:
		case len(dec.Results) == 0: // not asked: another descriptor was over at once
			room = true
		default:
			res := dec.Results[lm.counter]
			room = res.Allowed
			st.LimitRemaining = uint32(min(res.Remaining, math.MaxUint32))
			if res.ResetAfter > 0 {
				st.DurationUntilReset = durationpb.New(res.ResetAfter.Round(time.Millisecond))
			}
		}
		switch {
		case room:
			s.record(req.Domain, lm.rule, WithinLimit)
		case lm.shadow:
			s.record(req.Domain, lm.rule, ShadowOverLimit)
		default:
			st.Code = rlspb.RateLimitResponse_OVER_LIMIT
			s.record(req.Domain, lm.rule, OverLimit)
		}
		statuses[lm.index] = st
	}
	resp := &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK, Statuses: statuses}
	code := CodeOK
	if !allowed && !s.opts.ShadowMode {
		resp.OverallCode, code = rlspb.RateLimitResponse_OVER_LIMIT, CodeOverLimit
	}
	if s.opts.Headers != NoHeaders {
		resp.ResponseHeadersToAdd = s.headers(lims, statuses)
	}
	return resp, code, nil
}

// record tells the Recorder about one descriptor.
func (s *Service) record(domain string, r *rule, o Outcome) {
	if s.opts.Metrics != nil {
		s.opts.Metrics.Descriptor(domain, r.Metric, o)
	}
}

// validate refuses the requests no configuration can answer.
func (s *Service) validate(req *rlspb.RateLimitRequest) error {
	if req.GetDomain() == "" {
		return status.Error(codes.InvalidArgument, "the domain is empty")
	}
	if len(req.Descriptors) == 0 {
		return status.Error(codes.InvalidArgument, "the request has no descriptors")
	}
	size := len(req.Domain)
	for i, d := range req.Descriptors {
		if len(d.GetEntries()) == 0 {
			return status.Errorf(codes.InvalidArgument, "descriptor %d has no entries", i)
		}
		if d.GetIsNegativeHits() {
			return status.Errorf(codes.InvalidArgument, "descriptor %d: is_negative_hits is not supported", i)
		}
		for _, e := range d.Entries {
			if e.GetKey() == "" {
				return status.Errorf(codes.InvalidArgument, "descriptor %d has an entry without a key", i)
			}
			size += len(e.Key) + len(e.Value)
		}
		if size > s.opts.MaxRequestBytes {
			return status.Errorf(codes.InvalidArgument, "descriptors over %d bytes", s.opts.MaxRequestBytes)
		}
	}
	return nil
}

// statusOf turns a decision's error into the gRPC status Envoy gets.
func (s *Service) statusOf(err error) error {
	switch {
	case ratelimit.Unavailable(err):
		return status.Errorf(codes.Unavailable, "redis unavailable: %v", err)
	case errors.Is(err, ratelimit.ErrCostTooHigh), errors.Is(err, ratelimit.ErrInvalidCost), errors.Is(err, ratelimit.ErrInvalidKey):
		return status.Errorf(codes.InvalidArgument, "%v", err)
	}
	return status.Errorf(codes.Internal, "%v", err)
}

// hitsOf is a descriptor's cost: its own hits_addend if set (0 only reads
// the counter), else the request's, where 0 means 1.
func hitsOf(req *rlspb.RateLimitRequest, d *rlcommon.RateLimitDescriptor) (cost int, peek bool) {
	if h := d.GetHitsAddend(); h != nil {
		if h.GetValue() == 0 {
			return 0, true
		}
		return int(min(h.GetValue(), math.MaxInt32)), false
	}
	return int(max(req.GetHitsAddend(), 1)), false
}

func entriesOf(d *rlcommon.RateLimitDescriptor) []entry {
	es := make([]entry, len(d.GetEntries()))
	for i, e := range d.GetEntries() {
		es[i] = entry{e.GetKey(), e.GetValue()}
	}
	return es
}

// overrideRule is the rule of a descriptor that carries its own limit:
// that limit, counted in the aligned window, in no shadow mode, as
// envoyproxy/ratelimit applies it whatever the configuration says.
func overrideRule(o *rlcommon.RateLimitDescriptor_RateLimitOverride, entries []entry) (match, error) {
	unit, ok := overrideUnits[o.GetUnit()]
	if !ok {
		return match{}, status.Errorf(codes.InvalidArgument, "limit override unit %v", o.GetUnit())
	}
	r := &rule{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: unit, period: unitPeriods[unit]}
	if m := o.GetUnitMultiplier(); m != nil && m.GetValue() > 1 {
		r.period *= time.Duration(m.GetValue())
	}
	if r.period > 366*24*time.Hour {
		return match{}, status.Errorf(codes.InvalidArgument, "limit override of %v: periods above 366 days are not supported", r.period)
	}
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = e.key
	}
	r.Metric = "override:" + strings.Join(keys, ".")
	return match{rule: r}, nil
}

var overrideUnits = map[typepb.RateLimitUnit]rlspb.RateLimitResponse_RateLimit_Unit{
	typepb.RateLimitUnit_SECOND: rlspb.RateLimitResponse_RateLimit_SECOND,
	typepb.RateLimitUnit_MINUTE: rlspb.RateLimitResponse_RateLimit_MINUTE,
	typepb.RateLimitUnit_HOUR:   rlspb.RateLimitResponse_RateLimit_HOUR,
	typepb.RateLimitUnit_DAY:    rlspb.RateLimitResponse_RateLimit_DAY,
	typepb.RateLimitUnit_MONTH:  rlspb.RateLimitResponse_RateLimit_MONTH,
	typepb.RateLimitUnit_YEAR:   rlspb.RateLimitResponse_RateLimit_YEAR,
}

// counterName names a descriptor's counter: its entries as key=value,
// joined by '|', with '%', '|', '=' and '*' percent-encoded so that no two
// descriptors share a name; an entry matched by a share_threshold wildcard
// is written key*=pattern, so that every value it matches shares one.
func counterName(entries []entry, shared map[int]string) string {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('|')
		}
		escape(&b, e.key)
		if p, ok := shared[i]; ok {
			b.WriteString("*=")
			escape(&b, p)
			continue
		}
		b.WriteByte('=')
		escape(&b, e.value)
	}
	return b.String()
}

func escape(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', '|', '=', '*':
			fmt.Fprintf(b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
}

// headers builds the response header fields Options.Headers asks for.
func (s *Service) headers(lims []limited, statuses []*rlspb.RateLimitResponse_DescriptorStatus) []*corepb.HeaderValue {
	if len(lims) == 0 {
		return nil
	}
	var out []*corepb.HeaderValue
	if s.opts.Headers == IETFHeaders || s.opts.Headers == BothHeaders {
		var policy, state []string
		for _, lm := range lims {
			st := statuses[lm.index]
			name := sfString(lm.rule.Metric)
			window := int64(lm.rule.period / time.Second)
			policy = append(policy, name+";q="+strconv.FormatUint(uint64(lm.rule.RequestsPerUnit), 10)+";w="+strconv.FormatInt(max(window, 1), 10))
			state = append(state, name+";r="+strconv.FormatUint(uint64(st.LimitRemaining), 10)+";t="+strconv.FormatInt(resetSeconds(st), 10))
		}
		out = append(out,
			&corepb.HeaderValue{Key: "RateLimit-Policy", Value: strings.Join(policy, ", ")},
			&corepb.HeaderValue{Key: "RateLimit", Value: strings.Join(state, ", ")})
	}
	if s.opts.Headers == XRateLimitHeaders || s.opts.Headers == BothHeaders {
		// The first descriptor that denied, else the one with the least
		// remaining.
		var pick *limited
		for i := range lims {
			lm := &lims[i]
			st := statuses[lm.index]
			if st.Code == rlspb.RateLimitResponse_OVER_LIMIT {
				pick = lm
				break
			}
			if pick == nil || st.LimitRemaining < statuses[pick.index].LimitRemaining {
				pick = lm
			}
		}
		st := statuses[pick.index]
		window := max(int64(pick.rule.period/time.Second), 1)
		limit := strconv.FormatUint(uint64(pick.rule.RequestsPerUnit), 10)
		out = append(out,
			&corepb.HeaderValue{Key: "X-RateLimit-Limit", Value: limit + ", " + limit + ";w=" + strconv.FormatInt(window, 10)},
			&corepb.HeaderValue{Key: "X-RateLimit-Remaining", Value: strconv.FormatUint(uint64(st.LimitRemaining), 10)},
			&corepb.HeaderValue{Key: "X-RateLimit-Reset", Value: strconv.FormatInt(resetSeconds(st), 10)})
	}
	return out
}

// resetSeconds is a status's time to reset in whole seconds, rounded up.
func resetSeconds(st *rlspb.RateLimitResponse_DescriptorStatus) int64 {
	d := st.GetDurationUntilReset().AsDuration()
	return int64((d + time.Second - 1) / time.Second)
}

// sfString quotes s as a structured-field string (RFC 8941): printable
// ASCII, with '"' and '\' escaped; other bytes are dropped.
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e {
			continue
		}
		if c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	b.WriteByte('"')
	return b.String()
}
