package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
)

// server is the Redis every implementation talks to in one run: an embedded
// miniredis, a single real server or a Redis Cluster. Implementations open
// their own clients from it, as separate programs would.
type server struct {
	addrs    []string // host:port of the seeds
	username string
	password string
	embedded *miniredis.Miniredis // nil against a real server
	cluster  bool
	version  string // redis_version from INFO, "" when unknown
	pids     []int  // the servers' process ids, when they run on this machine
}

// startEmbedded runs a miniredis on a free loopback port.
func startEmbedded() (*server, error) {
	m, err := miniredis.Run()
	if err != nil {
		return nil, fmt.Errorf("start embedded miniredis: %w", err)
	}
	return &server{addrs: []string{m.Addr()}, embedded: m}, nil
}

// dialServer parses spec, a comma-separated list of host:port or
// redis://[user:password@]host:port seeds, and checks that the server
// answers. A list of more than one seed, or a single seed that turns out to
// be a cluster node, is treated as a Redis Cluster.
func dialServer(ctx context.Context, spec string) (*server, error) {
	s := &server{}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if strings.Contains(part, "://") {
			u, err := url.Parse(part)
			if err != nil {
				return nil, fmt.Errorf("parse redis address %q: %w", part, err)
			}
			if u.Scheme != "redis" {
				return nil, fmt.Errorf("redis address %q: only redis:// is supported", part)
			}
			if u.User != nil {
				s.username = u.User.Username()
				s.password, _ = u.User.Password()
			}
			part = u.Host
		}
		s.addrs = append(s.addrs, part)
	}
	if len(s.addrs) == 0 {
		return nil, fmt.Errorf("no redis address in %q", spec)
	}
	c, err := s.rueidis()
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", spec, err)
	}
	defer c.Close()
	s.cluster = c.Mode() == rueidis.ClientModeCluster
	info, err := c.Do(ctx, c.B().Info().Section("server").Build()).ToString()
	if err != nil {
		return nil, fmt.Errorf("INFO on %s: %w", spec, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			s.version = v
		}
	}
	s.pids = serverPIDs(ctx, c)
	return s, nil
}

// close stops the embedded server, if any.
func (s *server) close() {
	if s.embedded != nil {
		s.embedded.Close()
	}
}

// describe says in one line what the numbers were measured against.
func (s *server) describe() string {
	switch {
	case s.embedded != nil:
		return "embedded miniredis at " + s.addrs[0]
	case s.cluster:
		return fmt.Sprintf("Redis Cluster %s via %s", s.version, strings.Join(s.addrs, ","))
	default:
		return fmt.Sprintf("Redis %s at %s", s.version, s.addrs[0])
	}
}

// kind names the server for machines: embedded, single or cluster.
func (s *server) kind() string {
	switch {
	case s.embedded != nil:
		return "embedded"
	case s.cluster:
		return "cluster"
	default:
		return "single"
	}
}

// rueidisOption is the client option every rueidis-based implementation
// starts from. miniredis has no CLIENT TRACKING, so client-side caching is
// off there, and its RESP3 push support does not mix subscriptions with
// commands on one connection, so pub/sub gets its own RESP2 connection.
func (s *server) rueidisOption() rueidis.ClientOption {
	return rueidis.ClientOption{
		InitAddress:  s.addrs,
		Username:     s.username,
		Password:     s.password,
		DisableCache: s.embedded != nil,
		AlwaysRESP2:  s.embedded != nil,
	}
}

// rueidis opens a rueidis client with rueidisOption.
func (s *server) rueidis() (rueidis.Client, error) {
	return rueidis.NewClient(s.rueidisOption())
}
