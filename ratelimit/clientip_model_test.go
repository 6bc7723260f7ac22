package ratelimit

import (
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// hostileTokens are the pieces hostile header text is made of: the
// separators and quoting of X-Forwarded-For and RFC 7239, and addresses
// in the forms parseIP and parseForwardedNode accept or nearly accept,
// some inside the trusted ranges.
var hostileTokens = []string{
	`"`, `\`, `\"`, `,`, `;`, `=`, ` `, "\t", `[`, `]`, `:`, `for`, `For`, `by`,
	`proto`, `host`, `6.6.6.6`, `6.6.6.6:80`, `[2001:db8::6]`, `[2001:db8::6]:1`,
	`_hidden`, `unknown`, `::ffff:6.6.6.6`, `[::ffff:6.6.6.6]`, `%eth0`,
	`10.0.0.7`, `fd00::7`, `[fd00::7]`, `1234`, `_p`, `for=6.6.6.6`, `for="`,
	`for="[2001:db8::6]"`, `for=10.0.0.7`, `"[`, `]:`, `, `, `;for=`,
}

func hostileText(rng *rand.Rand) string {
	var b strings.Builder
	for range rng.IntN(8) {
		b.WriteString(hostileTokens[rng.IntN(len(hostileTokens))])
	}
	return b.String()
}

// TestClientIPProxyAppendModel models what real proxies do with a
// client's header (nginx joins the client's lines and appends ", peer";
// HAProxy adds a line of its own; some append to the client's last line)
// and feeds ClientIP hostile client text in front of the proxies' entries.
// The client's own address is never trusted. Whatever the client wrote,
// the answer must be the client's real address, or at worst a proxy's
// (an unparsable entry stops the walk there): never an address the client
// chose. FuzzClientIP only checks that the answer came from the configured
// header, which a forged entry also does.
func TestClientIPProxyAppendModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	clients := []struct {
		addr    netip.Addr
		xff     []string // how a proxy writes it in X-Forwarded-For
		forNode []string // and as an RFC 7239 node
	}{
		{netip.MustParseAddr("198.51.100.9"), []string{"198.51.100.9", "198.51.100.9:4711"}, []string{"198.51.100.9", `"198.51.100.9:4711"`}},
		{netip.MustParseAddr("2001:db8:cafe::17"), []string{"2001:db8:cafe::17", "[2001:db8:cafe::17]:4711"}, []string{`"[2001:db8:cafe::17]"`, `"[2001:db8:cafe::17]:4711"`}},
	}
	peer := netip.MustParseAddr("10.0.0.1")
	inner := netip.MustParseAddr("10.0.0.2") // a second proxy in front of the peer
	const rounds = 4000
	for i := range rounds {
		c := clients[rng.IntN(len(clients))]
		lines := make([]string, rng.IntN(4))
		for k := range lines {
			lines[k] = hostileText(rng)
		}
		twoProxies := rng.IntN(2) == 0

		// X-Forwarded-For. Entries are split on commas only, so the
		// proxies' entries always parse: the answer is exact.
		for style := range 3 {
			ent := c.xff[rng.IntN(len(c.xff))]
			if twoProxies {
				ent += ", " + inner.String()
			}
			var hdr []string
			switch style {
			case 0: // nginx $proxy_add_x_forwarded_for: one line
				if len(lines) > 0 {
					hdr = []string{strings.Join(lines, ", ") + ", " + ent}
				} else {
					hdr = []string{ent}
				}
			case 1: // HAProxy option forwardfor: a line of its own
				hdr = append(append([]string(nil), lines...), ent)
			case 2: // appended to the client's last line
				hdr = append([]string(nil), lines...)
				if len(hdr) > 0 {
					hdr[len(hdr)-1] += ", " + ent
				} else {
					hdr = []string{ent}
				}
			}
			r := &http.Request{RemoteAddr: peer.String() + ":1", Header: http.Header{"X-Forwarded-For": hdr}}
			got, err := ClientIP(r, testProxies, XForwardedFor)
			if err != nil || got != c.addr {
				t.Fatalf("round %d, XFF style %d, lines %q: ClientIP = %v, %v; want %v", i, style, hdr, got, err, c.addr)
			}
		}

		// Forwarded. A client's unclosed quote may swallow what a proxy
		// appends to the same line: the walk then stops at a proxy.
		for style := range 2 {
			ent := "for=" + c.forNode[rng.IntN(len(c.forNode))]
			if twoProxies {
				ent += ", for=" + inner.String()
			}
			hdr := append([]string(nil), lines...)
			if style == 0 || len(hdr) == 0 {
				hdr = append(hdr, ent)
			} else {
				hdr[len(hdr)-1] += ", " + ent
			}
			r := &http.Request{RemoteAddr: peer.String() + ":1", Header: http.Header{"Forwarded": hdr}}
			got, err := ClientIP(r, testProxies, Forwarded)
			if err != nil {
				t.Fatalf("round %d, Forwarded style %d, lines %q: error %v", i, style, hdr, err)
			}
			ok := got == c.addr || got == peer || (twoProxies && got == inner)
			if style == 0 {
				ok = got == c.addr // a line of its own always parses
			}
			if !ok {
				t.Fatalf("round %d, Forwarded style %d, lines %q: ClientIP = %v; want %v (or a proxy)", i, style, hdr, got, c.addr)
			}
		}
	}
}

// TestClientIPSameHostOneKey writes one client's address in every form
// a proxy or the peer may use (case, zero compression, port, brackets,
// zone, IPv4-mapped, another address of the same IPv6 /64) and checks,
// through the middleware's default KeyFunc, that they all give one key:
// otherwise a client that controls the spelling (the left part of a chain
// it sits behind, its own IPv6 interface id) would get a fresh limit per
// spelling.
func TestClientIPSameHostOneKey(t *testing.T) {
	kf, err := requestKeyFunc(nil, testProxies, XForwardedFor, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	fkf, err := requestKeyFunc(nil, testProxies, Forwarded, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	rkf, err := requestKeyFunc(nil, testProxies, XRealIP, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	groups := [][]*http.Request{
		{
			request("198.51.100.9:1"),
			request("[::ffff:198.51.100.9]:2"),
			request("[::ffff:c633:6409]:3"),
			request("10.0.0.1:1", "X-Forwarded-For", "198.51.100.9"),
			request("10.0.0.1:1", "X-Forwarded-For", " 198.51.100.9:65535 "),
			request("10.0.0.1:1", "X-Forwarded-For", "::ffff:198.51.100.9"),
			request("10.0.0.1:1", "X-Forwarded-For", "[::FFFF:198.51.100.9]:80, 10.0.0.3"),
			request("10.0.0.1:1", "X-Forwarded-For", "6.6.6.6", "X-Forwarded-For", "198.51.100.9"),
			request("[::ffff:10.0.0.1]:1", "X-Forwarded-For", "198.51.100.9"),
		},
		{
			request("[2001:db8:1:2::1]:1"),
			request("[2001:DB8:1:2:0:0:0:FFFF]:1"),
			request("[2001:db8:1:2:aaaa:bbbb:cccc:dddd%eth7]:9"),
			request("[fd00::1]:1", "X-Forwarded-For", "2001:db8:1:2::5"),
			request("[fd00::1]:1", "X-Forwarded-For", "[2001:db8:1:2::6]:443"),
			request("[fd00::1]:1", "X-Forwarded-For", "2001:0db8:0001:0002:ffff:ffff:ffff:ffff"),
			request("[fd00::1]:1", "X-Forwarded-For", "fe80::1, 2001:db8:1:2::7%25eth0"),
		},
	}
	fgroups := [][]*http.Request{
		{
			request("10.0.0.1:1", "Forwarded", "for=198.51.100.9"),
			request("10.0.0.1:1", "Forwarded", `FOR="198.51.100.9:_x"`),
			request("10.0.0.1:1", "Forwarded", `for="[::ffff:198.51.100.9]:1"`),
			request("10.0.0.1:1", "Forwarded", `for=6.6.6.6, for=198.51.100.9;proto=https`),
		},
		{
			request("10.0.0.1:1", "Forwarded", `for="[2001:db8:1:2::1]"`),
			request("10.0.0.1:1", "Forwarded", `for="[2001:DB8:1:2:ffff::1]:443"`),
		},
	}
	rgroups := [][]*http.Request{
		{
			request("10.0.0.1:1", "X-Real-IP", "198.51.100.9"),
			request("10.0.0.1:1", "X-Real-IP", "[::ffff:198.51.100.9]:80"),
		},
	}
	check := func(kf func(*http.Request) (string, error), groups [][]*http.Request, name string) []string {
		var keys []string
		for g, reqs := range groups {
			var first string
			for i, r := range reqs {
				key, err := kf(r)
				if err != nil {
					t.Fatalf("%s group %d request %d (%s %v): %v", name, g, i, r.RemoteAddr, r.Header, err)
				}
				if i == 0 {
					first = key
					keys = append(keys, key)
				} else if key != first {
					t.Errorf("%s group %d request %d (%s %v): key %q; want %q (same host)", name, g, i, r.RemoteAddr, r.Header, key, first)
				}
			}
		}
		return keys
	}
	x := check(kf, groups, "X-Forwarded-For")
	f := check(fkf, fgroups, "Forwarded")
	rr := check(rkf, rgroups, "X-Real-IP")
	if x[0] != f[0] || x[0] != rr[0] || x[1] != f[1] {
		t.Errorf("the same hosts got different keys through different headers: %q %q %q", x, f, rr)
	}
}
