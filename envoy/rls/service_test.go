package rls_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/rueidis"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/envoy/rls"
	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/ratelimit"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// target is a Redis deployment the tests run against.
type target struct {
	name  string
	addrs func(t *testing.T) []string
}

var targets = []target{
	{"single", func(t *testing.T) []string { return []string{redistest.Single(t).Addr()} }},
	{"cluster", func(t *testing.T) []string { return redistest.SharedCluster(t).Addrs() }},
}

var runs atomic.Int64

// env is a Service behind a real gRPC server on loopback, with the
// generated client stub Envoy's own is made from.
type env struct {
	client rlspb.RateLimitServiceClient
	svc    *rls.Service
	raw    rueidis.Client
	prefix string
}

// start serves yaml on a Service over Redis at addrs. Each call has its
// own key prefix unless prefix is given.
func start(t *testing.T, addrs []string, yaml string, opts rls.Options, prefix ...string) *env {
	t.Helper()
	cfg, err := rls.Parse(rls.File{Name: "test.yaml", Data: []byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	return startConfig(t, addrs, cfg, opts, prefix...)
}

func startConfig(t *testing.T, addrs []string, cfg *rls.Config, opts rls.Options, prefix ...string) *env {
	t.Helper()
	return startLimiter(t, redistest.Client(t, addrs...), cfg, opts, ratelimit.Options{}, prefix...)
}

// startLimiter is startConfig on a client of the caller's, with the
// Limiter's options (Limit and Prefix are set here).
func startLimiter(t *testing.T, client rueidis.Client, cfg *rls.Config, opts rls.Options, lopts ratelimit.Options, prefix ...string) *env {
	t.Helper()
	e := &env{raw: client}
	if len(prefix) > 0 {
		e.prefix = prefix[0]
	} else {
		e.prefix = fmt.Sprintf("t%d:", runs.Add(1))
	}
	sc, err := sluice.New(context.Background(), e.raw)
	if err != nil {
		t.Fatal(err)
	}
	lopts.Prefix = e.prefix
	l, err := ratelimit.New(sc, lopts)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Timeout == 0 {
		// Generous: these tests are not about a slow Redis, and the
		// machine may be loaded.
		opts.Timeout = 10 * time.Second
	}
	if e.svc, err = rls.New(l, cfg, opts); err != nil {
		t.Fatal(err)
	}
	e.client = serve(t, e.svc)
	return e
}

// serve runs svc on a gRPC server on a loopback port and returns a
// client of it.
func serve(t *testing.T, svc *rls.Service) rlspb.RateLimitServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlspb.RegisterRateLimitServiceServer(gs, svc)
	done := make(chan struct{})
	go func() { defer close(done); gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); <-done })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlspb.NewRateLimitServiceClient(conn)
}

// desc is a descriptor of key, value pairs.
func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func req(domain string, ds ...*rlcommon.RateLimitDescriptor) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: domain, Descriptors: ds}
}

func (e *env) ask(t *testing.T, r *rlspb.RateLimitRequest) *rlspb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.client.ShouldRateLimit(ctx, r)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// allowed counts how many of n sends of r are answered OK.
func (e *env) allowed(t *testing.T, r *rlspb.RateLimitRequest, n int) int {
	t.Helper()
	ok := 0
	for range n {
		if e.ask(t, r).OverallCode == rlspb.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

// remaining peeks at descriptor d's counter (hits_addend 0): its
// limit_remaining.
func (e *env) remaining(t *testing.T, domain string, d *rlcommon.RateLimitDescriptor) uint32 {
	t.Helper()
	p := &rlcommon.RateLimitDescriptor{Entries: d.Entries, HitsAddend: wrapperspb.UInt64(0)}
	st := e.ask(t, req(domain, p)).Statuses[0]
	if st.CurrentLimit == nil {
		t.Fatalf("peek at %v: no limit", d)
	}
	return st.LimitRemaining
}

// keys returns the keys under e's prefix on a single server.
func (e *env) keys(t *testing.T) []string {
	t.Helper()
	ks, err := e.raw.Do(context.Background(), e.raw.B().Keys().Pattern(e.prefix+"*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

const orgConfig = `
domain: api
descriptors:
  - key: org
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 4}
`

// TestDeniedCountsNowhere is the point of the service: a request that a
// user's limit refuses does not eat its organisation's budget, so the
// organisation's other users get all of it. envoyproxy/ratelimit would
// have counted alice's six refused requests against acme too, and refused
// bob after two.
func TestDeniedCountsNowhere(t *testing.T) {
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			e := start(t, tg.addrs(t), orgConfig, rls.Options{})
			alice := req("api", desc("org", "acme"), desc("user", "alice"))
			if got := e.allowed(t, alice, 10); got != 4 {
				t.Fatalf("alice: %d of 10 allowed, want 4", got)
			}
			resp := e.ask(t, alice)
			if resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlspb.RateLimitResponse_OK ||
				resp.Statuses[1].Code != rlspb.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].LimitRemaining != 6 {
				t.Fatalf("alice over her limit: %v, want OVER_LIMIT by user, org OK with 6 left", resp)
			}
			if got := e.remaining(t, "api", desc("org", "acme")); got != 6 {
				t.Fatalf("acme has %d left after alice's 4 allowed and 7 refused, want 6", got)
			}
			bob := req("api", desc("org", "acme"), desc("user", "bob"))
			carol := req("api", desc("org", "acme"), desc("user", "carol"))
			if got := e.allowed(t, bob, 4) + e.allowed(t, carol, 4); got != 6 {
				t.Fatalf("bob and carol: %d allowed, want acme's 6", got)
			}
			// Carol's refusals by the organisation cost carol nothing.
			if got := e.remaining(t, "api", desc("user", "carol")); got != 2 {
				t.Fatalf("carol has %d left, want 2 (2 allowed, 2 refused by acme)", got)
			}
		})
	}
}

// TestEnvoyproxyExamples runs examples of envoyproxy/ratelimit's README
// through the service: the same answers, but for counting the denied
// nowhere.
func TestEnvoyproxyExamples(t *testing.T) {
	addrs := []string{redistest.Single(t).Addr()}
	t.Run("2: nested and flat rules in one request", func(t *testing.T) {
		e := start(t, addrs, `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
`, rls.Options{})
		r := req("messaging", desc("message_type", "marketing", "to_number", "2061111111"), desc("to_number", "2061111111"))
		if got := e.allowed(t, r, 8); got != 5 {
			t.Fatalf("%d marketing messages allowed, want 5", got)
		}
		if got := e.remaining(t, "messaging", desc("to_number", "2061111111")); got != 95 {
			t.Fatalf("the number's daily counter has %d left, want 95 (the 3 refused not counted)", got)
		}
		if got := e.allowed(t, req("messaging", desc("to_number", "2062222222")), 3); got != 3 {
			t.Fatalf("another number: %d of 3", got)
		}
	})
	t.Run("3: a value of 0 requests refuses at once", func(t *testing.T) {
		e := start(t, addrs, `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
`, rls.Options{})
		resp := e.ask(t, req("edge", desc("remote_address", "50.0.0.5")))
		if resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 0 {
			t.Fatalf("blocked address: %v", resp)
		}
		if got := e.allowed(t, req("edge", desc("remote_address", "50.0.0.1")), 1); got != 1 {
			t.Fatal("another address refused")
		}
		// A look (hits 0) at the blocked address adds nothing and is not
		// over: 0 + 0 is not above 0.
		peek := desc("remote_address", "50.0.0.5")
		peek.HitsAddend = wrapperspb.UInt64(0)
		if resp := e.ask(t, req("edge", peek)); resp.OverallCode != rlspb.RateLimitResponse_OK {
			t.Fatalf("a look at the blocked address: %v", resp)
		}
		if ks := e.keys(t); len(ks) != 1 {
			t.Fatalf("keys %v, want one (the refused address counted nowhere)", ks)
		}
	})
	t.Run("5: unlimited", func(t *testing.T) {
		e := start(t, addrs, "domain: internal\ndescriptors:\n  - key: ldap\n    rate_limit: {unlimited: true}\n", rls.Options{})
		st := e.ask(t, req("internal", desc("ldap", "x"))).Statuses[0]
		if st.Code != rlspb.RateLimitResponse_OK || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
			t.Fatalf("unlimited: %v", st)
		}
		if ks := e.keys(t); len(ks) != 0 {
			t.Fatalf("unlimited counted: %v", ks)
		}
	})
	t.Run("6: shadow_mode never refuses", func(t *testing.T) {
		e := start(t, addrs, `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit: {requests_per_unit: 3, unit: hour}
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit: {requests_per_unit: 3, unit: hour}
`, rls.Options{})
		a := req("example6", desc("service", "auth", "user", "user-a"))
		if got := e.allowed(t, a, 6); got != 6 {
			t.Fatalf("shadow user-a: %d of 6", got)
		}
		if st := e.ask(t, a).Statuses[0]; st.Code != rlspb.RateLimitResponse_OK || st.LimitRemaining != 0 {
			t.Fatalf("shadow status over its limit: %v, want OK with 0 left", st)
		}
		if got := e.allowed(t, req("example6", desc("service", "auth", "user", "user-b")), 6); got != 3 {
			t.Fatalf("user-b: %d of 6, want 3", got)
		}
	})
	t.Run("7: replaces", func(t *testing.T) {
		e := start(t, addrs, `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 2, unit: hour}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces: [{name: specific_limit}]
          requests_per_unit: 4
          unit: hour
`, rls.Options{})
		both := req("example7", desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps"))
		if got := e.allowed(t, both, 6); got != 4 {
			t.Fatalf("both: %d of 6, want 4 (the 2 per hour replaced)", got)
		}
		if st := e.ask(t, both).Statuses[0]; st.Code != rlspb.RateLimitResponse_OK || st.CurrentLimit != nil {
			t.Fatalf("replaced descriptor: %v, want OK without a limit", st)
		}
		// The replaced limit was not touched.
		if got := e.allowed(t, req("example7", desc("key_1", "value_1", "user", "bkthomps")), 3); got != 2 {
			t.Fatalf("the replaced limit alone: %d of 3, want 2", got)
		}
	})
	t.Run("11: share_threshold", func(t *testing.T) {
		e := start(t, addrs, `
domain: example11
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: other
    value: other/*
    rate_limit: {unit: hour, requests_per_unit: 3}
`, rls.Options{})
		got := e.allowed(t, req("example11", desc("files", "files/a.pdf")), 2) + e.allowed(t, req("example11", desc("files", "files/b.csv")), 2)
		if got != 3 {
			t.Fatalf("files/*: %d of 4 allowed, want the shared 3", got)
		}
		got = e.allowed(t, req("example11", desc("other", "other/a")), 2) + e.allowed(t, req("example11", desc("other", "other/b")), 2)
		if got != 4 {
			t.Fatalf("other/*: %d of 4 allowed, want 4 (a counter each)", got)
		}
	})
	t.Run("unmatched descriptors pass", func(t *testing.T) {
		e := start(t, addrs, orgConfig, rls.Options{})
		resp := e.ask(t, req("api", desc("nothing", "here"), desc("org", "acme", "extra", "x")))
		if resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].CurrentLimit != nil {
			t.Fatalf("unmatched: %v", resp)
		}
	})
}

// TestAlignedWindow: the default window ends where envoyproxy/ratelimit's
// does, at the next whole unit of the epoch.
func TestAlignedWindow(t *testing.T) {
	e := start(t, []string{redistest.Single(t).Addr()}, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n", rls.Options{})
	before := time.Now()
	st := e.ask(t, req("d", desc("k", "v"))).Statuses[0]
	after := time.Now()
	lo := before.Truncate(time.Minute).Add(time.Minute).Sub(after) - time.Second // clocks of one machine
	hi := after.Truncate(time.Minute).Add(time.Minute).Sub(before) + time.Second
	if r := st.DurationUntilReset.AsDuration(); r < lo || r > hi {
		t.Fatalf("duration_until_reset %v, want the time to the next whole minute, in [%v, %v]", r, lo, hi)
	}
}

func TestHitsAddend(t *testing.T) {
	e := start(t, []string{redistest.Single(t).Addr()}, orgConfig, rls.Options{})
	r := req("api", desc("org", "acme"))
	r.HitsAddend = 3
	e.ask(t, r)
	if got := e.remaining(t, "api", desc("org", "acme")); got != 7 {
		t.Fatalf("after hits_addend 3: %d left, want 7", got)
	}
	// A descriptor's own hits_addend overrides the request's.
	d := desc("org", "acme")
	d.HitsAddend = wrapperspb.UInt64(2)
	r = req("api", d, desc("user", "u"))
	r.HitsAddend = 3
	resp := e.ask(t, r)
	if resp.OverallCode != rlspb.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 5 || resp.Statuses[1].LimitRemaining != 1 {
		t.Fatalf("per-descriptor hits: %v, want org at 7-2=5, user at 4-3=1", resp)
	}
	// Hits above a limit are refused, not an error: user's limit is 4.
	r = req("api", desc("user", "v"))
	r.HitsAddend = 5
	if resp := e.ask(t, r); resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("hits above the limit: %v", resp)
	}
	// The same descriptor twice counts twice.
	e.ask(t, req("api", desc("user", "w"), desc("user", "w")))
	if got := e.remaining(t, "api", desc("user", "w")); got != 2 {
		t.Fatalf("a descriptor sent twice: %d left, want 2", got)
	}
}

func TestLimitOverride(t *testing.T) {
	e := start(t, []string{redistest.Single(t).Addr()}, orgConfig, rls.Options{})
	d := desc("org", "big")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typepb.RateLimitUnit_HOUR}
	if got := e.allowed(t, req("api", d), 4); got != 2 {
		t.Fatalf("override of 2 per hour: %d of 4", got)
	}
	// Even for a descriptor no rule matches.
	d = desc("unknown", "x")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typepb.RateLimitUnit_MINUTE}
	if got := e.allowed(t, req("api", d), 3); got != 1 {
		t.Fatalf("override on an unmatched descriptor: %d of 3", got)
	}
}

// TestMalformed: requests no configuration can answer get a clear gRPC
// status, and nothing is counted for them.
func TestMalformed(t *testing.T) {
	e := start(t, []string{redistest.Single(t).Addr()}, orgConfig+"shard_key: org\n", rls.Options{})
	huge := strings.Repeat("x", 1<<20)
	neg := desc("org", "acme")
	neg.IsNegativeHits = true
	var many []*rlcommon.RateLimitDescriptor
	for i := range ratelimit.MaxCounters + 1 {
		many = append(many, desc("user", fmt.Sprint(i)))
	}
	for _, tc := range []struct {
		name string
		r    *rlspb.RateLimitRequest
		want codes.Code
	}{
		{"empty domain", req("", desc("org", "acme")), codes.InvalidArgument},
		{"no descriptors", req("api"), codes.InvalidArgument},
		{"a descriptor without entries", req("api", desc("org", "acme"), desc()), codes.InvalidArgument},
		{"an entry without a key", req("api", desc("org", "acme"), desc("", "x")), codes.InvalidArgument},
		{"a huge value", req("api", desc("org", "acme"), desc("user", huge)), codes.InvalidArgument},
		{"a huge key", req("api", desc("org", "acme"), desc(huge, "x")), codes.InvalidArgument},
		{"unknown domain", req("nope", desc("org", "acme")), codes.NotFound},
		{"negative hits", req("api", neg), codes.InvalidArgument},
		{"too many limited descriptors", req("api", many...), codes.InvalidArgument},
		{"descriptors disagree on the shard key", req("api", desc("org", "acme"), desc("org", "other")), codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.ShouldRateLimit(context.Background(), tc.r)
			if status.Code(err) != tc.want {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if ks := e.keys(t); len(ks) != 0 {
				t.Fatalf("counted: %v", ks)
			}
		})
	}
}

// TestHeaders checks both header sets against the statuses.
func TestHeaders(t *testing.T) {
	e := start(t, []string{redistest.Single(t).Addr()}, orgConfig, rls.Options{Headers: rls.BothHeaders})
	resp := e.ask(t, req("api", desc("org", "acme"), desc("user", "alice")))
	h := map[string]string{}
	for _, hv := range resp.ResponseHeadersToAdd {
		h[hv.Key] = hv.Value
	}
	if h["X-RateLimit-Limit"] != "4, 4;w=3600" || h["X-RateLimit-Remaining"] != "3" {
		t.Fatalf("x-ratelimit: %v, want the user's (least remaining)", h)
	}
	if h["RateLimit-Policy"] != `"org";q=10;w=3600, "user";q=4;w=3600` || !strings.HasPrefix(h["RateLimit"], `"org";r=9;t=`) {
		t.Fatalf("ietf: %v", h)
	}
	for range 4 {
		resp = e.ask(t, req("api", desc("org", "acme"), desc("user", "alice")))
	}
	for _, hv := range resp.ResponseHeadersToAdd {
		h[hv.Key] = hv.Value
	}
	if resp.OverallCode != rlspb.RateLimitResponse_OVER_LIMIT || h["X-RateLimit-Remaining"] != "0" || !strings.Contains(h["RateLimit"], `"user";r=0`) {
		t.Fatalf("denied: %v", h)
	}
}

func TestGlobalShadowMode(t *testing.T) {
	e := start(t, []string{redistest.Single(t).Addr()}, orgConfig, rls.Options{ShadowMode: true})
	r := req("api", desc("user", "alice"))
	if got := e.allowed(t, r, 6); got != 6 {
		t.Fatalf("global shadow: %d of 6", got)
	}
	if st := e.ask(t, r).Statuses[0]; st.LimitRemaining != 0 {
		t.Fatalf("counted as if enforced: %v", st)
	}
}

// TestShardKey: by default every counter of a domain is in the domain's
// slot; with shard_key, a tenant's counters are in the tenant's, and
// tenants spread over the cluster.
func TestShardKey(t *testing.T) {
	cluster := redistest.SharedCluster(t)
	yaml := orgConfig + "shard_key: org\n"
	e := start(t, cluster.Addrs(), yaml, rls.Options{})
	slots := map[uint16]bool{}
	for i := range 20 {
		org := fmt.Sprint("org", i)
		e.ask(t, req("api", desc("org", org), desc("user", "u"+org)))
		// A peek names the tenant too: its counters live under it.
		peek := desc("user", "u"+org)
		peek.HitsAddend = wrapperspb.UInt64(0)
		if got := e.ask(t, req("api", desc("org", org), peek)).Statuses[1].LimitRemaining; got != 3 {
			t.Fatalf("%s's user: %d left, want 3", org, got)
		}
	}
	// Read the keys of every master, on a connection of its own (a
	// cluster client sends KEYS to any node).
	for _, n := range cluster.Nodes {
		out, err := n.Do("KEYS", e.prefix+"*")
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range strings.Fields(out) {
			slots[keyspace.Slot(k)] = true
		}
	}
	if len(slots) < 10 {
		t.Fatalf("40 counters of 20 tenants in %d slots, want them spread", len(slots))
	}
}

// TestOutage: with Redis stopped, a request is codes.Unavailable (Envoy's
// failure_mode_deny decides), or with FallbackLocal answered locally.
func TestOutage(t *testing.T) {
	srv := redistest.NewServer(t)
	plain := start(t, []string{srv.Addr()}, orgConfig, rls.Options{Timeout: 2 * time.Second})
	local := start(t, []string{srv.Addr()}, orgConfig, rls.Options{Timeout: 2 * time.Second, FallbackLocal: true})
	plain.ask(t, req("api", desc("user", "a")))
	srv.Kill()
	_, err := plain.client.ShouldRateLimit(context.Background(), req("api", desc("user", "a")))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("redis down: %v, want Unavailable", err)
	}
	if got := local.allowed(t, req("api", desc("org", "acme"), desc("user", "a")), 6); got != 4 {
		t.Fatalf("local fallback: %d of 6 allowed, want the user's 4", got)
	}
	got := local.allowed(t, req("api", desc("org", "acme"), desc("user", "b")), 5) + local.allowed(t, req("api", desc("org", "acme"), desc("user", "c")), 5)
	if got != 6 {
		t.Fatalf("local fallback: %d of 10 for b and c, want acme's 6 left (a's refusals not counted)", got)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	ok := redistest.WaitFor(context.Background(), 10*time.Second, func() bool {
		_, err := plain.client.ShouldRateLimit(context.Background(), req("api", desc("user", "a")))
		return err == nil
	})
	if !ok {
		t.Fatal("no answer after the restart")
	}
}

// TestReloadUnderLoad rewrites the configuration while 8 clients send
// requests: every request is answered, and the counts carry over a change
// of requests_per_unit, so exactly the new limit passes in all.
func TestReloadUnderLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(limit int) {
		t.Helper()
		y := fmt.Sprintf("domain: api\ndescriptors:\n  - key: org\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", limit)
		if err := writeFile(dir+"/api.yaml", y); err != nil {
			t.Fatal(err)
		}
	}
	write(100)
	var e *env
	w, err := rls.Watch([]string{dir}, rls.WatchOptions{Interval: time.Hour, OnLoad: func(c *rls.Config) {
		if e != nil {
			e.svc.SetConfig(c)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	e = startConfig(t, []string{redistest.Single(t).Addr()}, w.Config(), rls.Options{})
	var passed atomic.Int64
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	answered, failed := 0, false // guarded by mu
	waitAnswered := func(n int) {
		mu.Lock()
		for answered < n && !failed {
			cond.Wait()
		}
		mu.Unlock()
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := e.client.ShouldRateLimit(context.Background(), req("api", desc("org", "acme")))
				if err != nil {
					t.Error(err)
					mu.Lock()
					failed = true
					cond.Broadcast()
					mu.Unlock()
					return
				}
				mu.Lock()
				answered++
				cond.Broadcast()
				mu.Unlock()
				if resp.OverallCode == rlspb.RateLimitResponse_OK {
					passed.Add(1)
				}
			}
		})
	}
	waitAnswered(50)
	write(150)
	if changed, err := w.Reload(); !changed || err != nil {
		t.Fatalf("reload: %v %v", changed, err)
	}
	// A bad file keeps the last good configuration.
	if err := writeFile(dir+"/api.yaml", "domain: api\ndescriptors:\n  - key: org\n    rate_limit: {unit: fortnight}\n"); err != nil {
		t.Fatal(err)
	}
	if changed, err := w.Reload(); changed || err == nil || !strings.Contains(err.Error(), "fortnight") {
		t.Fatalf("bad file: %v %v, want an error naming the unit", changed, err)
	}
	mu.Lock()
	target := answered + 300
	mu.Unlock()
	waitAnswered(target)
	close(stop)
	wg.Wait()
	if got := passed.Load(); got != 150 {
		t.Fatalf("%d passed over the reload, want 150 (counts carried over)", got)
	}
}

// writeFile replaces a file's contents at once, as a configuration
// management tool would (a new file renamed over the old).
func writeFile(name, data string) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}
