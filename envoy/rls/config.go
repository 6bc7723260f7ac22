package rls

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/sluicekit/sluice/ratelimit"
)

// ErrConfig wraps every error of a configuration that cannot be loaded.
var ErrConfig = errors.New("rls: invalid configuration")

// File is one configuration file's name and contents, for Parse.
type File struct {
	Name string
	Data []byte
}

// Config is a loaded configuration: every domain's descriptor tree. It is
// immutable and safe for concurrent use; a reload builds a new one.
type Config struct {
	domains map[string]*domain
}

// Domains returns the names of the configured domains, sorted.
func (c *Config) Domains() []string {
	names := make([]string, 0, len(c.domains))
	for d := range c.domains {
		names = append(names, d)
	}
	slices.Sort(names)
	return names
}

type domain struct {
	name     string
	shardKey string // extension: counters are grouped by this entry's value
	root     *level
}

// level is one level of a descriptor tree: the entries that may come at
// that position of a request's descriptor, by key.
type level struct {
	keys map[string]*keyed
}

// keyed holds a level's entries of one key: those with a value (matched
// first), those whose value has a '*' (matched next, in file order), and
// the one without a value (matched last, by any value).
type keyed struct {
	exact map[string]*node
	wild  []*node
	any   *node
}

type node struct {
	rule     *rule  // nil when the entry sets no rate_limit
	children *level // nil when nothing is nested
	parts    []string
	pattern  string // the value, for a wildcard
	share    bool   // share_threshold: one counter for every match
}

// rule is the rate limit a descriptor matched.
type rule struct {
	// Name is the rate_limit's name (for replaces), or "".
	Name string
	// Replaces lists the names of the rules this one replaces when both
	// match one request.
	Replaces []string
	// Metric names the rule in metrics: the domain's path of keys and
	// configured values ("message_type_marketing.to_number"), never a
	// value taken from a request.
	Metric string
	// Unlimited rules count nothing and answer OK with the largest
	// remaining.
	Unlimited bool
	// Shadow rules are decided and reported but never deny.
	Shadow bool
	// RequestsPerUnit and Unit are the limit as configured; 0 requests
	// denies every request.
	RequestsPerUnit uint32
	Unit            rlspb.RateLimitResponse_RateLimit_Unit
	// Algorithm is the counting method (extension; default the window
	// aligned on the epoch that envoyproxy/ratelimit counts in).
	Algorithm algorithm
	// Burst is GCRA's bucket (extension; 0 means RequestsPerUnit).
	Burst int
	// period is the unit as a duration (times unit_multiplier, for a
	// request's override).
	period time.Duration
}

// algorithm is a rule's counting method, the extension key "algorithm".
type algorithm int

const (
	// algoFixed ("fixed_window", the default) counts requests per window
	// of the unit aligned on the Unix epoch (a minute's window starts at
	// every whole minute, a day's at midnight UTC), as envoyproxy/ratelimit
	// does.
	algoFixed algorithm = iota
	// algoSliding ("sliding_window") weighs the previous window's count by
	// how much of it the sliding window still covers.
	algoSliding
	// algoGCRA ("gcra") is a token bucket of Burst tokens refilled at
	// RequestsPerUnit per unit.
	algoGCRA
)

var algorithmNames = map[string]algorithm{"fixed_window": algoFixed, "sliding_window": algoSliding, "gcra": algoGCRA}

// String returns the name the configuration uses.
func (a algorithm) String() string {
	for name, v := range algorithmNames {
		if v == a {
			return name
		}
	}
	return fmt.Sprintf("algorithm(%d)", int(a))
}

// unitPeriods are the units' lengths as envoyproxy/ratelimit counts them
// (a month is 30 days, a year 365).
var unitPeriods = map[rlspb.RateLimitResponse_RateLimit_Unit]time.Duration{
	rlspb.RateLimitResponse_RateLimit_SECOND: time.Second,
	rlspb.RateLimitResponse_RateLimit_MINUTE: time.Minute,
	rlspb.RateLimitResponse_RateLimit_HOUR:   time.Hour,
	rlspb.RateLimitResponse_RateLimit_DAY:    24 * time.Hour,
	rlspb.RateLimitResponse_RateLimit_WEEK:   7 * 24 * time.Hour,
	rlspb.RateLimitResponse_RateLimit_MONTH:  30 * 24 * time.Hour,
	rlspb.RateLimitResponse_RateLimit_YEAR:   365 * 24 * time.Hour,
}

// policy is the rule's limit for package ratelimit; ok is false for a
// rule of 0 requests, which denies without counting.
func (r *rule) policy() (p ratelimit.Policy, aligned, ok bool) {
	if r.RequestsPerUnit == 0 {
		return p, false, false
	}
	p.Limit = ratelimit.Limit{Rate: int(r.RequestsPerUnit), Period: r.period}
	switch r.Algorithm {
	case algoGCRA:
		p.Algorithm, p.Limit.Burst = ratelimit.GCRA, r.Burst
	case algoSliding:
		p.Algorithm = ratelimit.SlidingWindow
	default:
		p.Algorithm, aligned = ratelimit.FixedWindow, true
	}
	return p, aligned, true
}

// capacity is the most requests the rule allows at once: its burst for
// GCRA, else its requests per unit.
func (r *rule) capacity() int {
	if r.Algorithm == algoGCRA && r.Burst > 0 {
		return r.Burst
	}
	return int(r.RequestsPerUnit)
}

// The YAML of one file: envoyproxy/ratelimit's format, and the extensions
// (shard_key; algorithm and burst in rate_limit).
type fileYAML struct {
	Domain      string     `yaml:"domain"`
	Descriptors []descYAML `yaml:"descriptors"`
	ShardKey    string     `yaml:"shard_key"`
}

type descYAML struct {
	Key            string         `yaml:"key"`
	Value          string         `yaml:"value"`
	RateLimit      *limitYAML     `yaml:"rate_limit"`
	Descriptors    []descYAML     `yaml:"descriptors"`
	ShadowMode     bool           `yaml:"shadow_mode"`
	QuotaMode      bool           `yaml:"quota_mode"`
	DetailedMetric bool           `yaml:"detailed_metric"`
	ValueToMetric  bool           `yaml:"value_to_metric"`
	ShareThreshold bool           `yaml:"share_threshold"`
	Metadata       map[string]any `yaml:"metadata"`
}

type limitYAML struct {
	RequestsPerUnit uint32 `yaml:"requests_per_unit"`
	Unit            string `yaml:"unit"`
	Unlimited       bool   `yaml:"unlimited"`
	Name            string `yaml:"name"`
	Replaces        []struct {
		Name string `yaml:"name"`
	} `yaml:"replaces"`
	Algorithm string `yaml:"algorithm"`
	Burst     int    `yaml:"burst"`
}

// Parse builds a Config from files, each holding one domain in the YAML
// format of envoyproxy/ratelimit. A domain may appear in one file only.
// Errors wrap ErrConfig and name the file and the reason.
func Parse(files ...File) (*Config, error) {
	c := &Config{domains: make(map[string]*domain)}
	from := make(map[string]string)
	for _, f := range files {
		var y fileYAML
		dec := yaml.NewDecoder(bytes.NewReader(f.Data))
		dec.KnownFields(true) // an unknown key is an error, as there
		if err := dec.Decode(&y); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: %s: %w", ErrConfig, f.Name, err)
		}
		if y.Domain == "" {
			return nil, fmt.Errorf("%w: %s: the domain is empty", ErrConfig, f.Name)
		}
		if prev, ok := from[y.Domain]; ok {
			return nil, fmt.Errorf("%w: %s: domain %q is also in %s", ErrConfig, f.Name, y.Domain, prev)
		}
		from[y.Domain] = f.Name
		root, err := buildLevel(y.Descriptors, "")
		if err != nil {
			return nil, fmt.Errorf("%w: %s: domain %q: %w", ErrConfig, f.Name, y.Domain, err)
		}
		c.domains[y.Domain] = &domain{name: y.Domain, shardKey: y.ShardKey, root: root}
	}
	return c, nil
}

func buildLevel(ds []descYAML, parent string) (*level, error) {
	lvl := &level{keys: make(map[string]*keyed)}
	for _, d := range ds {
		if d.Key == "" {
			return nil, fmt.Errorf("a descriptor under %q has an empty key", parent)
		}
		path := d.Key
		if d.Value != "" {
			path += "_" + d.Value
		}
		if parent != "" {
			path = parent + "." + path
		}
		if d.QuotaMode {
			return nil, fmt.Errorf("%s: quota_mode is not supported", path)
		}
		wild := strings.Contains(d.Value, "*")
		if d.ShareThreshold && !wild {
			return nil, fmt.Errorf("%s: share_threshold needs a value with '*'", path)
		}
		n := &node{share: d.ShareThreshold}
		if d.RateLimit != nil {
			r, err := buildRule(d, path)
			if err != nil {
				return nil, err
			}
			n.rule = r
		}
		if len(d.Descriptors) > 0 {
			children, err := buildLevel(d.Descriptors, path)
			if err != nil {
				return nil, err
			}
			n.children = children
		}
		k := lvl.keys[d.Key]
		if k == nil {
			k = &keyed{exact: make(map[string]*node)}
			lvl.keys[d.Key] = k
		}
		switch d.Value {
		case "":
			if k.any != nil {
				return nil, fmt.Errorf("%s: the key appears twice without a value at one level", path)
			}
			k.any = n
		default:
			if _, dup := k.exact[d.Value]; dup {
				return nil, fmt.Errorf("%s: the key and value appear twice at one level", path)
			}
			k.exact[d.Value] = n
			if wild {
				n.parts, n.pattern = strings.Split(d.Value, "*"), d.Value
				k.wild = append(k.wild, n)
			}
		}
	}
	return lvl, nil
}

func buildRule(d descYAML, path string) (*rule, error) {
	y := d.RateLimit
	r := &rule{Name: y.Name, Metric: path, Unlimited: y.Unlimited, Shadow: d.ShadowMode, RequestsPerUnit: y.RequestsPerUnit}
	if y.Name != "" {
		r.Metric = y.Name
	}
	for _, rep := range y.Replaces {
		switch rep.Name {
		case "":
			return nil, fmt.Errorf("%s: a replaces entry has no name", path)
		case y.Name:
			return nil, fmt.Errorf("%s: the rule replaces itself (%q)", path, rep.Name)
		}
		r.Replaces = append(r.Replaces, rep.Name)
	}
	unit, known := rlspb.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(y.Unit)]
	known = known && unit != int32(rlspb.RateLimitResponse_RateLimit_UNKNOWN)
	if y.Unlimited {
		if known {
			return nil, fmt.Errorf("%s: an unlimited rule has a unit", path)
		}
		if y.Algorithm != "" || y.Burst != 0 {
			return nil, fmt.Errorf("%s: an unlimited rule has an algorithm or burst", path)
		}
		return r, nil
	}
	if !known {
		return nil, fmt.Errorf("%s: unit %q is not second, minute, hour, day, week, month or year", path, y.Unit)
	}
	r.Unit = rlspb.RateLimitResponse_RateLimit_Unit(unit)
	r.period = unitPeriods[r.Unit]
	if y.Algorithm != "" {
		a, ok := algorithmNames[y.Algorithm]
		if !ok {
			return nil, fmt.Errorf("%s: algorithm %q is not fixed_window, sliding_window or gcra", path, y.Algorithm)
		}
		r.Algorithm = a
	}
	if y.Burst != 0 && r.Algorithm != algoGCRA {
		return nil, fmt.Errorf("%s: burst needs algorithm gcra", path)
	}
	if y.Burst < 0 || y.Burst > math.MaxInt32 {
		return nil, fmt.Errorf("%s: burst %d is out of range", path, y.Burst)
	}
	r.Burst = y.Burst
	if p, _, ok := r.policy(); ok {
		// The limit must be one package ratelimit takes, checked once here
		// rather than on every request.
		if _, err := ratelimit.NewPolicies(ratelimit.Policy{Name: "check", Algorithm: p.Algorithm, Limit: p.Limit}); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return r, nil
}

// match is the rule a descriptor's entries select, and for each entry
// matched by a share_threshold wildcard, its pattern.
type match struct {
	rule   *rule
	shared map[int]string
}

// Match returns the rule that envoyproxy/ratelimit's matching selects for
// a descriptor of entries in domain d, or nil:
//
//   - the entries are walked down the tree, one level per entry; at each
//     level an entry matches its key with its value first, then a value
//     with '*' that matches it (in file order), then its key without a
//     value (which matches any value);
//   - there is no going back: once an entry matched, a less specific
//     match at that level is not tried when the rest does not match;
//   - the rule is the one set at the level of the last entry: a
//     descriptor with fewer entries than the tree is deep gets the rule of
//     its last entry's level, if it has one, and one with more entries
//     than the tree is deep gets none.
func (d *domain) match(entries []entry) match {
	lvl := d.root
	var m match
	for i, e := range entries {
		var n *node
		fromWild := false
		if k := lvl.keys[e.key]; k != nil {
			n = k.exact[e.value]
			if n == nil {
				for _, w := range k.wild {
					if wildcardMatch(w.parts, e.value) {
						n, fromWild = w, true
						break
					}
				}
			}
			if n == nil {
				n = k.any
			}
		}
		if n == nil {
			return match{}
		}
		if fromWild && n.share {
			if m.shared == nil {
				m.shared = make(map[int]string)
			}
			m.shared[i] = n.pattern
		}
		if i == len(entries)-1 {
			m.rule = n.rule
			return m
		}
		if n.children == nil {
			return match{}
		}
		lvl = n.children
	}
	return match{}
}

// wildcardMatch reports whether value matches the pattern split at its
// '*'s: each '*' stands for any run of bytes, the empty one included.
func wildcardMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// entry is one key and value of a request's descriptor.
type entry struct{ key, value string }
