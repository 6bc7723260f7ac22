package rls

import (
	"errors"
	"strings"
	"testing"
)

// matchConfig is one domain with every shape of rule the matching rules
// below are stated on.
const matchConfig = `
domain: d
descriptors:
  # Rule 1 and 2: a key with a value, and the same key without one.
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}

  # Rule 3: nested entries; the rule is at the last entry's level.
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}

  # Rule 5: a level with a rule and deeper levels.
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 7, name: client_any}
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 3}

  # Rule 6: no going back. The exact entry has no child "path", the
  # key-only entry has one.
  - key: tier
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: tier
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 5}

  # Rule 7: wildcards.
  - key: route
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 20, name: api_any}
  - key: route
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 21}
  - key: route
    value: /api/v1
    rate_limit: {unit: minute, requests_per_unit: 22}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 23}
  - key: file
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: multi
    value: /a/*/b/*/c
    rate_limit: {unit: hour, requests_per_unit: 11}

  # Rule 9: a key with neither rule nor children.
  - key: bare
`

func mustParse(t *testing.T, yaml string) *Config {
	t.Helper()
	c, err := Parse(File{Name: "test.yaml", Data: []byte(yaml)})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func entries(kv ...string) []entry {
	var es []entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, entry{kv[i], kv[i+1]})
	}
	return es
}

// TestMatchingRules states envoyproxy/ratelimit's matching rules, one
// case per rule.
func TestMatchingRules(t *testing.T) {
	d := mustParse(t, matchConfig).domains["d"]
	for _, tc := range []struct {
		rule    string
		entries []entry
		want    uint32 // requests_per_unit of the rule; 999 for none
	}{
		{"1: a key with its value is matched before the key alone", entries("remote_address", "50.0.0.5"), 0},
		{"2: a key without a value matches any value", entries("remote_address", "10.1.2.3"), 10},
		{"2: ... an empty value too", entries("remote_address", ""), 10},
		{"3: nested entries: the rule of the last entry's level", entries("message_type", "marketing", "to_number", "206"), 5},
		{"3: the nested key alone is another rule", entries("to_number", "206"), 100},
		{"3: the parent alone has no rule", entries("message_type", "marketing"), 999},
		{"3: a value the tree does not name matches nothing", entries("message_type", "transactional", "to_number", "206"), 999},
		{"4: more entries than the tree is deep match nothing", entries("remote_address", "10.1.2.3", "path", "/"), 999},
		{"5: fewer entries than the tree is deep: the rule of the last one's level", entries("client", "c1"), 7},
		{"5: ... and the full depth its own rule", entries("client", "c1", "path", "/x"), 3},
		{"6: no going back to the key alone once its value matched", entries("tier", "gold", "path", "/x"), 999},
		{"6: ... which another value reaches", entries("tier", "silver", "path", "/x"), 5},
		{"6: the exact entry's own rule", entries("tier", "gold"), 50},
		{"7: a value is matched before a wildcard", entries("route", "/api/v1"), 22},
		{"7: a wildcard before the key alone, the first in file order", entries("route", "/api/v2/action"), 20},
		{"7: a trailing '*' matches the empty rest", entries("route", "/api/"), 20},
		{"7: no wildcard matches: the key alone", entries("route", "/web"), 23},
		{"7: several '*', each matching its own segment", entries("multi", "/a/1/b/22/c"), 11},
		{"7: ... in order", entries("multi", "/a/1/c/22/b"), 999},
		{"8: entries are levels, in order", entries("to_number", "206", "message_type", "marketing"), 999},
		{"9: a key that is not configured matches nothing", entries("nope", "x"), 999},
		{"9: a key with neither rule nor children has no rule", entries("bare", "x"), 999},
		{"9: keys are case-sensitive", entries("Remote_Address", "10.1.2.3"), 999},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			m := d.match(tc.entries)
			got := uint32(999)
			if m.rule != nil {
				got = m.rule.RequestsPerUnit
			}
			if got != tc.want {
				t.Fatalf("%v matched %d requests per unit, want %d", tc.entries, got, tc.want)
			}
		})
	}
}

// TestShareThreshold: values matched by a share_threshold wildcard share
// one counter; those of other rules each have their own.
func TestShareThreshold(t *testing.T) {
	d := mustParse(t, matchConfig).domains["d"]
	a := d.match(entries("file", "files/a.pdf"))
	b := d.match(entries("file", "files/b.csv"))
	if a.rule == nil || counterName(entries("file", "files/a.pdf"), a.shared) != counterName(entries("file", "files/b.csv"), b.shared) {
		t.Fatalf("share_threshold: %q and %q", counterName(entries("file", "files/a.pdf"), a.shared), counterName(entries("file", "files/b.csv"), b.shared))
	}
	x := d.match(entries("route", "/api/x"))
	y := d.match(entries("route", "/api/y"))
	if counterName(entries("route", "/api/x"), x.shared) == counterName(entries("route", "/api/y"), y.shared) {
		t.Fatal("a wildcard without share_threshold shares its counter")
	}
}

// TestCounterNamesDistinct: the separators inside keys and values are
// escaped, so two different descriptors never share a counter.
func TestCounterNamesDistinct(t *testing.T) {
	pairs := [][2][]entry{
		{entries("a", "b|c=d"), entries("a", "b", "c", "d")},
		{entries("a=b", "c"), entries("a", "b=c")},
		{entries("a", "%7C"), entries("a", "|")},
		{entries("f", "files/*"), nil}, // compared with the shared pattern below
	}
	for _, p := range pairs[:3] {
		if x, y := counterName(p[0], nil), counterName(p[1], nil); x == y {
			t.Errorf("%v and %v share counter %q", p[0], p[1], x)
		}
	}
	if x, y := counterName(entries("f", "files/*"), nil), counterName(entries("f", "files/a"), map[int]string{0: "files/*"}); x == y {
		t.Errorf("a literal value and a shared pattern share counter %q", x)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"empty domain", "descriptors: []", "domain is empty"},
		{"unknown key", "domain: d\nfoo: 1", "foo"},
		{"unknown nested key", "domain: d\ndescriptors:\n  - key: k\n    ratelimit: {}", "ratelimit"},
		{"bad yaml", "domain: [", "yaml"},
		{"empty descriptor key", "domain: d\ndescriptors:\n  - value: v", "empty key"},
		{"key and value twice", "domain: d\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}", "twice"},
		{"key twice", "domain: d\ndescriptors:\n  - {key: k}\n  - {key: k}", "twice"},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}", "fortnight"},
		{"no unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}", "unit"},
		{"unlimited with a unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}", "unlimited"},
		{"empty replaces", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}", "no name"},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}", "itself"},
		{"share without wildcard", "domain: d\ndescriptors:\n  - {key: k, value: v, share_threshold: true}", "share_threshold"},
		{"quota mode", "domain: d\ndescriptors:\n  - {key: k, quota_mode: true}", "quota_mode"},
		{"burst without gcra", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}", "burst"},
		{"unknown algorithm", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky}", "leaky"},
		{"negative requests", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}", "-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(File{Name: "f.yaml", Data: []byte(tc.yaml)})
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "f.yaml") {
				t.Fatalf("err %v, want ErrConfig naming f.yaml and %q", err, tc.want)
			}
		})
	}
	// A domain in two files.
	_, err := Parse(File{Name: "a.yaml", Data: []byte("domain: d")}, File{Name: "b.yaml", Data: []byte("domain: d")})
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "a.yaml") || !strings.Contains(err.Error(), "b.yaml") {
		t.Fatalf("domain twice: %v", err)
	}
}

// TestEnvoyproxyExamples parses the examples of envoyproxy/ratelimit's
// README (their shapes, written here), extensions aside: a configuration
// of theirs must load as it is.
func TestEnvoyproxyExamples(t *testing.T) {
	for _, y := range []string{
		"domain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n    rate_limit:\n      unit: second\n      requests_per_unit: 500\n",
		"domain: internal\ndescriptors:\n  - key: ldap\n    rate_limit:\n      unlimited: true\n",
		"domain: e8\ndescriptors:\n  - key: key1\n    detailed_metric: true\n    value_to_metric: true\n    metadata: {team: a, tags: [x, y]}\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n",
		"domain: e6\ndescriptors:\n  - key: service\n    descriptors:\n      - key: user\n        value: user-a\n        shadow_mode: true\n        rate_limit: {requests_per_unit: 10, unit: second}\n",
		"domain: w\ndescriptors:\n  - key: k\n    rate_limit: {unit: week, requests_per_unit: 1}\n  - key: m\n    rate_limit: {unit: MONTH, requests_per_unit: 1}\n  - key: y\n    rate_limit: {unit: year, requests_per_unit: 1}\n",
	} {
		if _, err := Parse(File{Name: "x.yaml", Data: []byte(y)}); err != nil {
			t.Errorf("%v\n%s", err, y)
		}
	}
}
