package ratelimit

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
)

var testProxies = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("fd00::/8"),
}

func request(remote string, headers ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

func TestClientIP(t *testing.T) {
	tests := []struct {
		name    string
		header  ClientIPHeader
		r       *http.Request
		want    string
		wantErr bool
	}{
		{"peer", XForwardedFor, request("203.0.113.7:1234"), "203.0.113.7", false},
		{"peer without port", XForwardedFor, request("203.0.113.7"), "203.0.113.7", false},
		{"ipv6 peer", XForwardedFor, request("[2001:db8::1]:443"), "2001:db8::1", false},
		{"mapped peer", XForwardedFor, request("[::ffff:203.0.113.7]:443"), "203.0.113.7", false},
		{"zoned peer", XForwardedFor, request("[fe80::1%eth0]:443"), "fe80::1", false},
		{"untrusted peer ignores XFF", XForwardedFor, request("203.0.113.7:1", "X-Forwarded-For", "1.2.3.4"), "203.0.113.7", false},
		{"untrusted peer ignores X-Real-IP", XRealIP, request("203.0.113.7:1", "X-Real-IP", "1.2.3.4"), "203.0.113.7", false},
		{"untrusted peer ignores Forwarded", Forwarded, request("203.0.113.7:1", "Forwarded", "for=1.2.3.4"), "203.0.113.7", false},
		{"trusted proxy", XForwardedFor, request("10.0.0.1:1", "X-Forwarded-For", "198.51.100.9"), "198.51.100.9", false},
		{"mapped trusted peer", XForwardedFor, request("[::ffff:10.0.0.1]:1", "X-Forwarded-For", "198.51.100.9"), "198.51.100.9", false},
		{"proxy chain", XForwardedFor, request("10.0.0.1:1", "X-Forwarded-For", "198.51.100.9, 10.0.0.2, 10.0.0.3"), "198.51.100.9", false},
		{"spoofed left-most entry", XForwardedFor, request("10.0.0.1:1", "X-Forwarded-For", "6.6.6.6, 198.51.100.9, 10.0.0.2"), "198.51.100.9", false},
		{"several header lines", XForwardedFor, request("10.0.0.1:1", "X-Forwarded-For", "6.6.6.6", "X-Forwarded-For", "198.51.100.9,10.0.0.2"), "198.51.100.9", false},
		{"entry with port", XForwardedFor, request("10.0.0.1:1", "X-Forwarded-For", "198.51.100.9:5555"), "198.51.100.9", false},
		{"ipv6 entry in brackets", XForwardedFor, request("10.0.0.1:1", "X-Forwarded-For", "[2001:db8::9]"), "2001:db8::9", false},
		{"ipv6 proxy", XForwardedFor, request("[fd00::1]:1", "X-Forwarded-For", "2001:db8::9, fd00::2"), "2001:db8::9", false},
		{"all proxies", XForwardedFor, request("10.0.0.1:1", "X-Forwarded-For", "10.0.0.5, 10.0.0.2"), "10.0.0.5", false},
		{"garbage stops the walk", XForwardedFor, request("10.0.0.1:1", "X-Forwarded-For", "6.6.6.6, garbage, 10.0.0.2"), "10.0.0.2", false},
		{"garbage right after the peer", XForwardedFor, request("10.0.0.1:1", "X-Forwarded-For", "6.6.6.6, unknown"), "10.0.0.1", false},
		{"empty XFF", XForwardedFor, request("10.0.0.1:1", "X-Forwarded-For", ""), "10.0.0.1", false},
		// Only the configured header counts: a proxy that sets one header
		// passes the others through from the client.
		{"XFF ignores X-Real-IP", XForwardedFor, request("10.0.0.1:1", "X-Real-IP", "198.51.100.9"), "10.0.0.1", false},
		{"XFF ignores Forwarded", XForwardedFor, request("10.0.0.1:1", "Forwarded", "for=198.51.100.9"), "10.0.0.1", false},
		{"X-Real-IP from proxy", XRealIP, request("10.0.0.1:1", "X-Real-IP", "198.51.100.9"), "198.51.100.9", false},
		{"X-Real-IP not overridden by forged XFF", XRealIP, request("10.0.0.1:1", "X-Real-IP", "198.51.100.9", "X-Forwarded-For", "6.6.6.6"), "198.51.100.9", false},
		{"X-Real-IP last line", XRealIP, request("10.0.0.1:1", "X-Real-IP", "6.6.6.6", "X-Real-IP", "198.51.100.9"), "198.51.100.9", false},
		{"X-Real-IP ipv6 with port", XRealIP, request("10.0.0.1:1", "X-Real-IP", "[2001:db8::9]:80"), "2001:db8::9", false},
		{"bad X-Real-IP", XRealIP, request("10.0.0.1:1", "X-Real-IP", "nope"), "10.0.0.1", false},
		{"X-Real-IP list is not an address", XRealIP, request("10.0.0.1:1", "X-Real-IP", "6.6.6.6, 198.51.100.9"), "10.0.0.1", false},
		{"missing X-Real-IP", XRealIP, request("10.0.0.1:1", "X-Forwarded-For", "6.6.6.6"), "10.0.0.1", false},
		{"Forwarded ipv4", Forwarded, request("10.0.0.1:1", "Forwarded", "for=198.51.100.9"), "198.51.100.9", false},
		{"Forwarded not overridden by forged XFF", Forwarded, request("10.0.0.1:1", "Forwarded", "for=198.51.100.9", "X-Forwarded-For", "6.6.6.6"), "198.51.100.9", false},
		{"Forwarded quoted ipv4 with port", Forwarded, request("10.0.0.1:1", "Forwarded", `for="198.51.100.9:4711"`), "198.51.100.9", false},
		{"Forwarded ipv6 with port", Forwarded, request("10.0.0.1:1", "Forwarded", `for="[2001:db8:cafe::17]:4711"`), "2001:db8:cafe::17", false},
		{"Forwarded ipv6 without port", Forwarded, request("10.0.0.1:1", "Forwarded", `For="[2001:db8:cafe::17]"`), "2001:db8:cafe::17", false},
		{"Forwarded mapped ipv6", Forwarded, request("10.0.0.1:1", "Forwarded", `for="[::ffff:198.51.100.9]"`), "198.51.100.9", false},
		{"Forwarded obfuscated port", Forwarded, request("10.0.0.1:1", "Forwarded", `for="198.51.100.9:_abc"`), "198.51.100.9", false},
		// RFC 7239 section 6.3: obfport = "_" 1*(ALPHA / DIGIT / "." / "_" / "-").
		{"Forwarded obfuscated port of every allowed character", Forwarded, request("10.0.0.1:1", "Forwarded", `for="198.51.100.9:_a.Z_9-x"`), "198.51.100.9", false},
		{"Forwarded obfuscated ipv6 port", Forwarded, request("10.0.0.1:1", "Forwarded", `for="[2001:db8::9]:__"`), "2001:db8::9", false},
		{"Forwarded obfuscated port with a bad character", Forwarded, request("10.0.0.1:1", "Forwarded", `for="198.51.100.9:_a!b"`), "10.0.0.1", false},
		// Each range's ends are allowed, the characters just outside refused.
		{"Forwarded obfuscated port of every range's ends", Forwarded, request("10.0.0.1:1", "Forwarded", `for="198.51.100.9:_azAZ09"`), "198.51.100.9", false},
		{"Forwarded obfuscated port with the character before a", Forwarded, request("10.0.0.1:1", "Forwarded", "for=\"198.51.100.9:_a`\""), "10.0.0.1", false},
		{"Forwarded obfuscated port with the character after z", Forwarded, request("10.0.0.1:1", "Forwarded", `for="198.51.100.9:_z{"`), "10.0.0.1", false},
		{"Forwarded obfuscated port with the character before A", Forwarded, request("10.0.0.1:1", "Forwarded", `for="198.51.100.9:_A@"`), "10.0.0.1", false},
		{"Forwarded obfuscated port with the character after Z", Forwarded, request("10.0.0.1:1", "Forwarded", `for="198.51.100.9:_Z["`), "10.0.0.1", false},
		{"Forwarded obfuscated port with the character before 0", Forwarded, request("10.0.0.1:1", "Forwarded", `for="198.51.100.9:_0/"`), "10.0.0.1", false},
		{"Forwarded other parameters", Forwarded, request("10.0.0.1:1", "Forwarded", `proto=https;for=198.51.100.9;by="[fd00::1]";host="a,b"`), "198.51.100.9", false},
		{"Forwarded chain", Forwarded, request("10.0.0.1:1", "Forwarded", "for=6.6.6.6, for=198.51.100.9;proto=http, for=10.0.0.2"), "198.51.100.9", false},
		{"Forwarded several lines", Forwarded, request("10.0.0.1:1", "Forwarded", "for=6.6.6.6", "Forwarded", "for=198.51.100.9, for=10.0.0.2"), "198.51.100.9", false},
		{"Forwarded all proxies", Forwarded, request("10.0.0.1:1", "Forwarded", `for=10.0.0.5, for="[fd00::2]:1"`), "10.0.0.5", false},
		{"Forwarded comma in quotes", Forwarded, request("10.0.0.1:1", "Forwarded", `for=6.6.6.6;host="x, for=7.7.7.7", for=198.51.100.9`), "198.51.100.9", false},
		{"Forwarded empty elements", Forwarded, request("10.0.0.1:1", "Forwarded", " , for=198.51.100.9 ,"), "198.51.100.9", false},
		{"Forwarded unknown", Forwarded, request("10.0.0.1:1", "Forwarded", "for=6.6.6.6, for=unknown"), "10.0.0.1", false},
		{"Forwarded obfuscated", Forwarded, request("10.0.0.1:1", "Forwarded", "for=6.6.6.6, for=_hidden, for=10.0.0.2"), "10.0.0.2", false},
		{"Forwarded element without for", Forwarded, request("10.0.0.1:1", "Forwarded", "for=6.6.6.6, proto=https"), "10.0.0.1", false},
		{"Forwarded two for in one element", Forwarded, request("10.0.0.1:1", "Forwarded", "for=198.51.100.9;for=6.6.6.6"), "10.0.0.1", false},
		{"Forwarded unquoted ipv6", Forwarded, request("10.0.0.1:1", "Forwarded", "for=2001:db8::1"), "10.0.0.1", false},
		{"Forwarded ipv6 without brackets in quotes", Forwarded, request("10.0.0.1:1", "Forwarded", `for="2001:db8::1"`), "10.0.0.1", false},
		{"Forwarded ipv4 in brackets", Forwarded, request("10.0.0.1:1", "Forwarded", `for="[198.51.100.9]"`), "10.0.0.1", false},
		{"Forwarded zoned ipv6", Forwarded, request("10.0.0.1:1", "Forwarded", `for="[fe80::1%eth0]"`), "10.0.0.1", false},
		{"Forwarded bad port", Forwarded, request("10.0.0.1:1", "Forwarded", `for="198.51.100.9:http"`), "10.0.0.1", false},
		{"Forwarded unterminated quote", Forwarded, request("10.0.0.1:1", "Forwarded", `for="198.51.100.9`), "10.0.0.1", false},
		{"Forwarded spaces around =", Forwarded, request("10.0.0.1:1", "Forwarded", `for = 198.51.100.9`), "10.0.0.1", false},
		{"Forwarded missing", Forwarded, request("10.0.0.1:1", "X-Forwarded-For", "6.6.6.6"), "10.0.0.1", false},
		{"unix socket", XForwardedFor, request("@"), "", true},
		{"empty remote", XForwardedFor, request(""), "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ip, err := ClientIP(tt.r, testProxies, tt.header)
			if tt.wantErr {
				if !errors.Is(err, ErrNoClientIP) {
					t.Fatalf("ClientIP = %v, %v; want ErrNoClientIP", ip, err)
				}
				return
			}
			if err != nil || ip.String() != tt.want {
				t.Fatalf("ClientIP = %v, %v; want %s", ip, err, tt.want)
			}
		})
	}
	if _, err := ClientIP(request("10.0.0.1:1"), testProxies, 7); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("ClientIP with header 7: error %v; want ErrInvalidOptions", err)
	}
}

// TestClientIPMappedPrefixes checks that trusted prefixes written in
// IPv4-mapped form match the IPv4 peers they map, for IPv4 and mapped peers.
func TestClientIPMappedPrefixes(t *testing.T) {
	mapped := []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}
	for _, remote := range []string{"10.1.2.3:1", "[::ffff:10.1.2.3]:1"} {
		t.Run(remote, func(t *testing.T) {
			r := request(remote, "X-Forwarded-For", "198.51.100.9")
			ip, err := ClientIP(r, mapped, XForwardedFor)
			if err != nil || ip.String() != "198.51.100.9" {
				t.Fatalf("ClientIP = %v, %v; want 198.51.100.9 (peer trusted through ::ffff:10.0.0.0/104)", ip, err)
			}
		})
	}
	// Other IPv6 prefixes, even ::/0, do not cover IPv4 peers.
	if ip, err := ClientIP(request("10.1.2.3:1", "X-Forwarded-For", "198.51.100.9"), []netip.Prefix{netip.MustParsePrefix("::/0")}, XForwardedFor); err != nil || ip.String() != "10.1.2.3" {
		t.Fatalf("IPv4 peer with ::/0 trusted: ClientIP = %v, %v; want the peer 10.1.2.3", ip, err)
	}
	r := request("11.0.0.1:1", "X-Forwarded-For", "198.51.100.9")
	if ip, err := ClientIP(r, mapped, XForwardedFor); err != nil || ip.String() != "11.0.0.1" {
		t.Fatalf("peer outside the mapped prefix: ClientIP = %v, %v; want 11.0.0.1", ip, err)
	}
	for _, tt := range []struct{ in, want string }{
		{"::ffff:10.0.0.0/104", "10.0.0.0/8"},
		{"::ffff:10.1.2.3/128", "10.1.2.3/32"},
		{"::ffff:0.0.0.0/96", "0.0.0.0/0"},
		{"::ffff:10.1.2.3/104", "10.0.0.0/8"},
		{"10.0.0.0/8", "10.0.0.0/8"},
		{"2001:db8::/32", "2001:db8::/32"},
	} {
		if got := unmapPrefix(netip.MustParsePrefix(tt.in)); got.String() != tt.want {
			t.Errorf("unmapPrefix(%s) = %v; want %s", tt.in, got, tt.want)
		}
	}
}

func TestIPKey(t *testing.T) {
	tests := []struct {
		ip     string
		v4, v6 int
		want   string
	}{
		{"203.0.113.7", 0, 0, "203.0.113.7"},
		{"203.0.113.7", 24, 0, "203.0.113.0/24"},
		{"2001:db8:1:2:3:4:5:6", 0, 0, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:3:4:5:6", 0, 128, "2001:db8:1:2:3:4:5:6"},
		{"2001:db8:1:2:3:4:5:6", 0, 48, "2001:db8:1::/48"},
		{"::ffff:203.0.113.7", 0, 0, "203.0.113.7"},
		{"203.0.113.7", 99, 0, "203.0.113.7"},
		{"203.0.113.7", -5, 0, "128.0.0.0/1"},
	}
	for _, tt := range tests {
		if got := IPKey(netip.MustParseAddr(tt.ip), tt.v4, tt.v6); got != tt.want {
			t.Errorf("IPKey(%s, %d, %d) = %q; want %q", tt.ip, tt.v4, tt.v6, got, tt.want)
		}
	}
}

// errRecorder collects the errors the middleware reports.
type errRecorder struct {
	mu   sync.Mutex
	errs []error
}

func (e *errRecorder) record(_ *http.Request, err error) {
	e.mu.Lock()
	e.errs = append(e.errs, err)
	e.mu.Unlock()
}

func (e *errRecorder) list() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.errs...)
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })

// answerTimeout is the Timeout of the middlewares whose tests check what a
// live server decided. The 200 ms default is a timing bound: under -race
// on a loaded 2-core machine a call has taken longer (helper kill44 saw
// TestMiddlewareHeaders' third request served, FallbackOpen's answer to a
// timeout, at load 10), and these tests are not about timeouts.
const answerTimeout = time.Minute

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestMiddlewareKeys(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	newHandler := func(t *testing.T, opts MiddlewareOptions) http.Handler {
		l := newLimiter(t, sc, Options{Algorithm: FixedWindow, Limit: PerMinute(1)})
		opts.Timeout = answerTimeout
		return MustNewMiddleware(l, opts)(okHandler)
	}
	t.Run("spoofed XFF from untrusted peer", func(t *testing.T) {
		h := newHandler(t, MiddlewareOptions{TrustedProxies: testProxies})
		for i := range 5 {
			w := serve(h, request("203.0.113.7:4000", "X-Forwarded-For", "198.51.100."+strconv.Itoa(i)))
			if want := map[bool]int{true: 200, false: 429}[i == 0]; w.Code != want {
				t.Fatalf("request %d: status %d; want %d (XFF must not change the key)", i, w.Code, want)
			}
		}
	})
	t.Run("trusted chain", func(t *testing.T) {
		h := newHandler(t, MiddlewareOptions{TrustedProxies: testProxies})
		// Two clients behind the same proxies: separate keys; a client
		// forging the left-most entry still gets its own key.
		for _, tc := range []struct {
			xff  string
			want int
		}{
			{"198.51.100.1, 10.0.0.2", 200},
			{"198.51.100.2, 10.0.0.2", 200},
			{"6.6.6.6, 198.51.100.1, 10.0.0.2", 429},
			{"198.51.100.2", 429},
		} {
			if w := serve(h, request("10.0.0.1:80", "X-Forwarded-For", tc.xff)); w.Code != tc.want {
				t.Fatalf("XFF %q: status %d; want %d", tc.xff, w.Code, tc.want)
			}
		}
	})
	t.Run("ipv6 /64", func(t *testing.T) {
		h := newHandler(t, MiddlewareOptions{})
		for _, tc := range []struct {
			remote string
			want   int
		}{
			{"[2001:db8:1:2::1]:1", 200},
			{"[2001:db8:1:2:ffff::9]:1", 429}, // same /64
			{"[2001:db8:1:3::1]:1", 200},      // next /64
		} {
			if w := serve(h, request(tc.remote)); w.Code != tc.want {
				t.Fatalf("%s: status %d; want %d", tc.remote, w.Code, tc.want)
			}
		}
	})
	t.Run("ipv6 /128", func(t *testing.T) {
		h := newHandler(t, MiddlewareOptions{IPv6PrefixLen: 128})
		for _, remote := range []string{"[2001:db8:1:2::1]:1", "[2001:db8:1:2::2]:1"} {
			if w := serve(h, request(remote)); w.Code != 200 {
				t.Fatalf("%s: status %d; want 200", remote, w.Code)
			}
		}
	})
	t.Run("custom key", func(t *testing.T) {
		var errs errRecorder
		h := newHandler(t, MiddlewareOptions{
			OnError: errs.record,
			KeyFunc: func(r *http.Request) (string, error) {
				if r.URL.Path == "/health" {
					return "", nil
				}
				if tok := r.Header.Get("Token"); tok != "" {
					return "token:" + tok, nil
				}
				return "", errors.New("no token")
			},
		})
		for i := range 3 {
			health := httptest.NewRequest(http.MethodGet, "/health", nil)
			if w := serve(h, health); w.Code != 200 || w.Header().Get("RateLimit") != "" {
				t.Fatalf("health %d: status %d, RateLimit %q; want 200 unlimited", i, w.Code, w.Header().Get("RateLimit"))
			}
		}
		if w := serve(h, request("1.2.3.4:1", "Token", "a")); w.Code != 200 {
			t.Fatalf("token a: status %d; want 200", w.Code)
		}
		if w := serve(h, request("5.6.7.8:1", "Token", "a")); w.Code != 429 {
			t.Fatalf("token a again: status %d; want 429", w.Code)
		}
		// A request without a token is no outage: serving it unlimited
		// would let every client switch its limit off by leaving the
		// token out.
		if w := serve(h, request("5.6.7.8:1")); w.Code != http.StatusInternalServerError || len(errs.list()) != 1 {
			t.Fatalf("key error: status %d, %d errors reported; want 500 (no fallback) and 1", w.Code, len(errs.list()))
		}
	})
}

func TestMiddlewareHeaders(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	t.Run("fixed window", func(t *testing.T) {
		l := newLimiter(t, sc, Options{Algorithm: FixedWindow, Limit: PerMinute(2)})
		h := MustNewMiddleware(l, MiddlewareOptions{XRateLimitHeaders: true, Timeout: answerTimeout})(okHandler)
		for i, want := range []struct {
			code      int
			remaining string
		}{{200, "1"}, {200, "0"}, {429, "0"}} {
			before := time.Now()
			w := serve(h, request("192.0.2.1:1"))
			hd := w.Header()
			if w.Code != want.code {
				t.Fatalf("request %d: status %d; want %d", i+1, w.Code, want.code)
			}
			if got := hd.Get("RateLimit-Policy"); got != `"default";q=2;w=60` {
				t.Errorf("request %d: RateLimit-Policy %q; want %q", i+1, got, `"default";q=2;w=60`)
			}
			if got, want := hd.Get("RateLimit"), `"default";r=`+want.remaining+`;t=60`; got != want {
				t.Errorf("request %d: RateLimit %q; want %q", i+1, got, want)
			}
			if got := hd.Get("X-RateLimit-Limit"); got != "2" {
				t.Errorf("request %d: X-RateLimit-Limit %q; want 2", i+1, got)
			}
			if got := hd.Get("X-RateLimit-Remaining"); got != want.remaining {
				t.Errorf("request %d: X-RateLimit-Remaining %q; want %s", i+1, got, want.remaining)
			}
			reset, _ := strconv.ParseInt(hd.Get("X-RateLimit-Reset"), 10, 64)
			if lo, hi := before.Unix()+59, time.Now().Unix()+61; reset < lo || reset > hi {
				t.Errorf("request %d: X-RateLimit-Reset %d; want in [%d, %d]", i+1, reset, lo, hi)
			}
			if want.code == 429 {
				if got := hd.Get("Retry-After"); got != "60" {
					t.Errorf("denied: Retry-After %q; want 60", got)
				}
				if body := w.Body.String(); body != "too many requests\n" {
					t.Errorf("denied: body %q; want %q", body, "too many requests\n")
				}
			} else if hd.Get("Retry-After") != "" {
				t.Errorf("allowed: Retry-After %q; want none", hd.Get("Retry-After"))
			}
		}
	})
	t.Run("gcra burst", func(t *testing.T) {
		l := newLimiter(t, sc, Options{Limit: Limit{Rate: 1, Period: 10 * time.Second, Burst: 3}})
		var denied Result
		h := MustNewMiddleware(l, MiddlewareOptions{
			Timeout:    answerTimeout,
			PolicyName: `per "ip"`,
			OnDenied: func(w http.ResponseWriter, r *http.Request, res Result) {
				denied = res
				w.WriteHeader(http.StatusTeapot)
			},
		})(okHandler)
		w := serve(h, request("192.0.2.1:1"))
		if got, want := w.Header().Get("RateLimit-Policy"), `"per \"ip\"";q=3;w=30`; got != want {
			t.Errorf("RateLimit-Policy %q; want %q", got, want)
		}
		if got, want := w.Header().Get("RateLimit"), `"per \"ip\"";r=2;t=10`; got != want {
			t.Errorf("RateLimit %q; want %q", got, want)
		}
		serve(h, request("192.0.2.1:1"))
		serve(h, request("192.0.2.1:1"))
		w = serve(h, request("192.0.2.1:1"))
		if w.Code != http.StatusTeapot || denied.Allowed || denied.RetryAfter <= 0 {
			t.Fatalf("status %d, result %+v; want the custom deny handler with a denial", w.Code, denied)
		}
		// RetryAfter is just under 10s; Retry-After rounds it up.
		if got := w.Header().Get("Retry-After"); got != "10" {
			t.Errorf("Retry-After %q; want 10", got)
		}
		if w.Header().Get("X-RateLimit-Limit") != "" {
			t.Errorf("X-RateLimit-Limit sent without XRateLimitHeaders")
		}
	})
	t.Run("disabled", func(t *testing.T) {
		l := newLimiter(t, sc, Options{Limit: PerMinute(1)})
		h := MustNewMiddleware(l, MiddlewareOptions{DisableHeaders: true, Timeout: answerTimeout})(okHandler)
		w := serve(h, request("192.0.2.1:1"))
		if w.Header().Get("RateLimit") != "" || w.Header().Get("RateLimit-Policy") != "" {
			t.Errorf("headers sent with DisableHeaders: %v", w.Header())
		}
		w = serve(h, request("192.0.2.1:1"))
		if w.Code != 429 || w.Header().Get("Retry-After") == "" {
			t.Errorf("denied with DisableHeaders: status %d, Retry-After %q; want 429 with Retry-After", w.Code, w.Header().Get("Retry-After"))
		}
	})
}

// TestMiddlewareRedisDown stops Redis and checks both failure policies, and
// that a hung Redis (SIGSTOP) does not hold requests past the timeout.
func TestMiddlewareRedisDown(t *testing.T) {
	srv := redistest.NewServer(t)
	sc := newCache(t, srv.Addr())
	l := newLimiter(t, sc, Options{Limit: PerMinute(100)})
	var errs errRecorder
	open := MustNewMiddleware(l, MiddlewareOptions{OnError: errs.record, Timeout: 100 * time.Millisecond})(okHandler)
	closed := MustNewMiddleware(l, MiddlewareOptions{OnError: errs.record, Timeout: 100 * time.Millisecond, Fallback: FallbackClosed})(okHandler)
	if w := serve(open, request("192.0.2.1:1")); w.Code != 200 || w.Header().Get("RateLimit") == "" {
		t.Fatalf("with Redis up: status %d, RateLimit %q; want 200 with headers", w.Code, w.Header().Get("RateLimit"))
	}

	t.Run("paused", func(t *testing.T) {
		if err := srv.Pause(); err != nil {
			t.Fatal(err)
		}
		defer srv.Resume()
		done := make(chan int, 1)
		go func() { done <- serve(closed, request("192.0.2.2:1")).Code }()
		select {
		case code := <-done:
			if code != http.StatusServiceUnavailable {
				t.Fatalf("fail closed on a hung Redis: status %d; want 503", code)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("request still waiting on a hung Redis after 30s; want it bounded by the 100ms timeout")
		}
		errList := errs.list()
		if len(errList) == 0 || !errors.Is(errList[len(errList)-1], context.DeadlineExceeded) {
			t.Fatalf("errors reported %v; want the last to be a deadline", errList)
		}
	})

	srv.Kill()
	before := len(errs.list())
	if w := serve(open, request("192.0.2.3:1")); w.Code != 200 || w.Body.String() != "ok" || w.Header().Get("RateLimit") != "" {
		t.Fatalf("fail open: status %d, body %q, RateLimit %q; want 200 ok without headers", w.Code, w.Body.String(), w.Header().Get("RateLimit"))
	}
	if w := serve(closed, request("192.0.2.3:1")); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("fail closed: status %d; want 503", w.Code)
	}
	if got := len(errs.list()) - before; got != 2 {
		t.Fatalf("%d errors reported with Redis down; want 2", got)
	}
}

// FuzzClientIP feeds arbitrary RemoteAddr, X-Forwarded-For, X-Real-IP and
// Forwarded values to ClientIP, with each header choice, and the result to
// IPKey: they must not panic, must return a clean address that came from
// the peer or the configured header (never from another header), and must
// give a key the limiter accepts.
func FuzzClientIP(f *testing.F) {
	f.Add("203.0.113.7:1234", "1.2.3.4", "", "", uint8(0))
	f.Add("10.0.0.1:80", "6.6.6.6, 198.51.100.9, 10.0.0.2", "5.5.5.5", "for=7.7.7.7", uint8(1))
	f.Add("[fd00::1]:1", "[2001:db8::1]:80,fd00::2", "", `for="[2001:db8::1]:80", for=10.0.0.2`, uint8(2))
	f.Add("[fe80::1%eth0]:443", "::ffff:1.2.3.4", "x", "for=unknown", uint8(2))
	f.Fuzz(func(t *testing.T, remote, xff, realIP, fwd string, header uint8) {
		h := ClientIPHeader(header % 4) // 3 is not a header
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		for _, line := range strings.Split(xff, "\n") {
			r.Header.Add("X-Forwarded-For", line)
		}
		r.Header.Set("X-Real-IP", realIP)
		for _, line := range strings.Split(fwd, "\n") {
			r.Header.Add("Forwarded", line)
		}
		ip, err := ClientIP(r, testProxies, h)
		if err != nil {
			if h > Forwarded {
				if !errors.Is(err, ErrInvalidOptions) {
					t.Fatalf("ClientIP with header %d: error %v; want ErrInvalidOptions", h, err)
				}
				return
			}
			if !errors.Is(err, ErrNoClientIP) {
				t.Fatalf("ClientIP error %v; want ErrNoClientIP", err)
			}
			return
		}
		if h > Forwarded {
			t.Fatalf("ClientIP with header %d = %v; want an error", h, ip)
		}
		if !ip.IsValid() || ip.Zone() != "" || ip.Is4In6() {
			t.Fatalf("ClientIP = %#v; want a valid, unzoned, unmapped address", ip)
		}
		peer, _ := parseIP(remote)
		if !trusted(peer, testProxies) && ip != peer {
			t.Fatalf("untrusted peer %v: ClientIP = %v; want the peer", peer, ip)
		}
		if ip != peer {
			// The address may be written differently in the header
			// (leading zeros, upper case, mapped form, quoted); parse every
			// candidate of the configured header to be sure it came from
			// there.
			found := false
			switch h {
			case XForwardedFor:
				for _, s := range strings.FieldsFunc(xff, func(c rune) bool { return c == ',' || c == '\n' }) {
					if a, ok := parseIP(s); ok && a == ip {
						found = true
					}
				}
			case XRealIP:
				a, ok := parseIP(realIP)
				found = ok && a == ip
			case Forwarded:
				var nodes []string
				for _, line := range strings.Split(fwd, "\n") {
					nodes = appendForwardedFor(nodes, line)
				}
				for _, n := range nodes {
					if a, ok := parseForwardedNode(n); ok && a == ip {
						found = true
					}
				}
			}
			if !found {
				t.Fatalf("ClientIP(%v) = %v, which is neither the peer nor in that header", h, ip)
			}
		}
		for _, bits := range [][2]int{{0, 0}, {24, 48}, {-1, 200}} {
			key := IPKey(ip, bits[0], bits[1])
			if err := keyspace.CheckName(key); err != nil || strings.ContainsAny(key, "{}") {
				t.Fatalf("IPKey(%v, %d, %d) = %q (%v); want a plain valid key", ip, bits[0], bits[1], key, err)
			}
		}
	})
}

// TestMiddlewareFloodCostsNoRedisCalls floods the middleware from one IP
// after its first denial and counts the scripts Redis ran.
func TestMiddlewareFloodCostsNoRedisCalls(t *testing.T) {
	srv := redistest.NewServer(t)
	sc := newCache(t, srv.Addr())
	l := newLimiter(t, sc, Options{Algorithm: FixedWindow, Limit: PerMinute(1)})
	h := MustNewMiddleware(l, MiddlewareOptions{Timeout: answerTimeout})(okHandler)
	resetStats(t, srv)
	for i := range 200 {
		w := serve(h, request("203.0.113.9:1"))
		if want := map[bool]int{true: 200, false: 429}[i == 0]; w.Code != want {
			t.Fatalf("request %d: status %d; want %d", i, w.Code, want)
		}
		if i > 0 && (w.Header().Get("Retry-After") != "60" || w.Header().Get("RateLimit") != `"default";r=0;t=60`) {
			t.Fatalf("request %d: Retry-After %q, RateLimit %q; want 60 and r=0;t=60", i, w.Header().Get("Retry-After"), w.Header().Get("RateLimit"))
		}
	}
	if got := evalshaCalls(t, srv); got != 2 {
		t.Fatalf("EVALSHA calls %d for 200 requests; want 2 (one allowed, one denied, the rest local)", got)
	}
}

func TestNewMiddlewareValidation(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	l := newLimiter(t, sc, Options{Limit: PerMinute(1)})
	tests := []struct {
		name string
		l    *Limiter
		opts MiddlewareOptions
	}{
		{"nil limiter", nil, MiddlewareOptions{}},
		{"negative timeout", l, MiddlewareOptions{Timeout: -time.Second}},
		{"negative unavailable retry-after", l, MiddlewareOptions{UnavailableRetryAfter: -1}},
		{"negative ipv4 prefix", l, MiddlewareOptions{IPv4PrefixLen: -1}},
		{"ipv4 prefix over 32", l, MiddlewareOptions{IPv4PrefixLen: 33}},
		{"negative ipv6 prefix", l, MiddlewareOptions{IPv6PrefixLen: -8}},
		{"ipv6 prefix over 128", l, MiddlewareOptions{IPv6PrefixLen: 129}},
		{"unknown header", l, MiddlewareOptions{ClientIPHeader: 3}},
		{"negative header", l, MiddlewareOptions{ClientIPHeader: -1}},
		{"zero prefix", l, MiddlewareOptions{TrustedProxies: []netip.Prefix{testProxies[0], {}}}},
		{"unknown fallback", l, MiddlewareOptions{Fallback: 3}},
		{"negative fallback", l, MiddlewareOptions{Fallback: -1}},
		{"negative local keys", l, MiddlewareOptions{Fallback: FallbackLocal, LocalKeys: -1}},
		{"negative local hold", l, MiddlewareOptions{Fallback: FallbackLocal, LocalHold: -time.Second}},
		{"local keys without local", l, MiddlewareOptions{LocalKeys: 10}},
		{"local hold without local", l, MiddlewareOptions{Fallback: FallbackClosed, LocalHold: time.Second}},
		{"problem details and OnDenied", l, MiddlewareOptions{ProblemDetails: true, OnDenied: func(http.ResponseWriter, *http.Request, Result) {}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mw, err := NewMiddleware(tt.l, tt.opts)
			if !errors.Is(err, ErrInvalidOptions) || mw != nil {
				t.Fatalf("NewMiddleware = %v, %v; want nil, ErrInvalidOptions", mw != nil, err)
			}
			if !strings.HasPrefix(err.Error(), "ratelimit: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
			defer func() {
				if p, ok := recover().(error); !ok || !errors.Is(p, ErrInvalidOptions) {
					t.Errorf("Middleware panicked with %v; want the NewMiddleware error", p)
				}
			}()
			MustNewMiddleware(tt.l, tt.opts)
		})
	}
	for _, opts := range []MiddlewareOptions{
		{},
		{IPv4PrefixLen: 32, IPv6PrefixLen: 128, ClientIPHeader: Forwarded, Timeout: time.Second},
		{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104"), netip.MustParsePrefix("::/0")}},
		{Fallback: FallbackClosed},
		{Fallback: FallbackLocal, LocalKeys: 1, LocalHold: time.Millisecond},
	} {
		if mw, err := NewMiddleware(l, opts); err != nil || mw == nil {
			t.Errorf("NewMiddleware(%+v) = %v, %v; want middleware, nil", opts, mw != nil, err)
		}
	}
}

// TestMiddlewareClientIPHeader checks the configured header end to end:
// behind a proxy that sets X-Real-IP, a forged X-Forwarded-For must not
// choose the key, and a trusted proxy given in IPv4-mapped form is trusted.
func TestMiddlewareClientIPHeader(t *testing.T) {
	sc := newCache(t, redistest.NewServer(t).Addr())
	newHandler := func(t *testing.T, opts MiddlewareOptions) http.Handler {
		l := newLimiter(t, sc, Options{Algorithm: FixedWindow, Limit: PerMinute(1)})
		mw, err := NewMiddleware(l, opts)
		if err != nil {
			t.Fatal(err)
		}
		return mw(okHandler)
	}
	t.Run("X-Real-IP with forged XFF", func(t *testing.T) {
		h := newHandler(t, MiddlewareOptions{TrustedProxies: testProxies, ClientIPHeader: XRealIP})
		for i := range 4 {
			forged := "6.6.6." + strconv.Itoa(i)
			w := serve(h, request("10.0.0.1:80", "X-Real-IP", "198.51.100.9", "X-Forwarded-For", forged))
			if want := map[bool]int{true: 200, false: 429}[i == 0]; w.Code != want {
				t.Fatalf("request %d with XFF %s: status %d; want %d (the key is X-Real-IP's)", i+1, forged, w.Code, want)
			}
		}
	})
	t.Run("Forwarded", func(t *testing.T) {
		h := newHandler(t, MiddlewareOptions{TrustedProxies: testProxies, ClientIPHeader: Forwarded})
		for i, tc := range []struct {
			fwd  string
			want int
		}{
			{`for="[2001:db8:1:2::1]:443", for=10.0.0.2`, 200},
			{`for=6.6.6.6, for="[2001:db8:1:2::77]"`, 429}, // same /64
			{`for=198.51.100.9`, 200},
		} {
			if w := serve(h, request("10.0.0.1:80", "Forwarded", tc.fwd, "X-Forwarded-For", "6.6.6."+strconv.Itoa(i))); w.Code != tc.want {
				t.Fatalf("Forwarded %q: status %d; want %d", tc.fwd, w.Code, tc.want)
			}
		}
	})
	t.Run("mapped trusted prefix", func(t *testing.T) {
		h := newHandler(t, MiddlewareOptions{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}})
		for i, remote := range []string{"10.0.0.1:80", "[::ffff:10.0.0.2]:80"} {
			xff := "198.51.100." + strconv.Itoa(i)
			if w := serve(h, request(remote, "X-Forwarded-For", xff)); w.Code != 200 {
				t.Fatalf("%s with XFF %s: status %d; want 200 (a client of its own)", remote, xff, w.Code)
			}
		}
	})
}

// TestMiddlewareUnavailableRetryAfter checks the 503 of FallbackClosed: no
// Retry-After by default, UnavailableRetryAfter rounded up when set.
func TestMiddlewareUnavailableRetryAfter(t *testing.T) {
	srv := redistest.NewServer(t)
	sc := newCache(t, srv.Addr())
	l := newLimiter(t, sc, Options{Limit: PerMinute(100)})
	srv.Kill()
	var errs errRecorder
	for _, tc := range []struct {
		retry time.Duration
		want  string
	}{{0, ""}, {1500 * time.Millisecond, "2"}, {time.Minute, "60"}} {
		h := MustNewMiddleware(l, MiddlewareOptions{OnError: errs.record, Fallback: FallbackClosed, UnavailableRetryAfter: tc.retry})(okHandler)
		w := serve(h, request("192.0.2.1:1"))
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != tc.want {
			t.Errorf("UnavailableRetryAfter %v: status %d, Retry-After %q; want 503, %q", tc.retry, w.Code, w.Header().Get("Retry-After"), tc.want)
		}
	}
}

// TestHeaderNamesCanonical: the names the middleware stores directly in
// the header map are the canonical forms Header.Set would use.
func TestHeaderNamesCanonical(t *testing.T) {
	for name, want := range map[string]string{"RateLimit-Policy": headerPolicy, "RateLimit": headerRateLimit} {
		if got := http.CanonicalHeaderKey(name); got != want {
			t.Errorf("CanonicalHeaderKey(%q) = %q; the middleware uses %q", name, got, want)
		}
	}
}

// TestMiddlewareTopPolicy: the X-RateLimit headers and OnDenied describe
// the policy that decides, in either order of the set: on a denial the one
// that needs the longest wait (not one that still had room), else the one
// with the least left.
func TestMiddlewareTopPolicy(t *testing.T) {
	sc := newCache(t, redistest.Single(t).Addr())
	short := Policy{Name: "short", Limit: PerSecond(2)}                                            // limit 2
	long := Policy{Name: "long", Algorithm: FixedWindow, Limit: Limit{Rate: 1, Period: time.Hour}} // limit 1
	for _, order := range [][]Policy{{short, long}, {long, short}} {
		t.Run(order[0].Name+" first", func(t *testing.T) {
			ps, err := NewPolicies(order...)
			if err != nil {
				t.Fatal(err)
			}
			l := newLimiter(t, sc, Options{Prefix: "top:" + order[0].Name + ":", Limit: PerSecond(1)})
			var denied Result
			h := MustNewMiddleware(l, MiddlewareOptions{
				XRateLimitHeaders: true, Timeout: answerTimeout,
				PolicyFunc: func(*http.Request) (*Policies, error) { return ps, nil },
				OnDenied:   func(w http.ResponseWriter, _ *http.Request, res Result) { denied = res; w.WriteHeader(429) },
			})(okHandler)
			// Allowed: short has 1 left, long 0: long has the least.
			w := serve(h, request("192.0.2.7:1"))
			if w.Code != 200 || w.Header().Get("X-RateLimit-Limit") != "1" || w.Header().Get("X-RateLimit-Remaining") != "0" {
				t.Fatalf("first request: %d, X-RateLimit-Limit %q, Remaining %q; want 200, 1, 0 (long: the least left)",
					w.Code, w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Remaining"))
			}
			// Denied by long (an hour), while short still has room.
			w = serve(h, request("192.0.2.7:1"))
			if w.Code != 429 || w.Header().Get("X-RateLimit-Limit") != "1" {
				t.Fatalf("second request: %d, X-RateLimit-Limit %q; want 429, 1 (long: the longest wait)", w.Code, w.Header().Get("X-RateLimit-Limit"))
			}
			if denied.Limit != 1 || denied.RetryAfter < 59*time.Minute {
				t.Fatalf("OnDenied got limit %d, retry %v; want long's: 1, about an hour", denied.Limit, denied.RetryAfter)
			}
		})
	}
}
