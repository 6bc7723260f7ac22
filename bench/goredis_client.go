//go:build peers

package main

import goredis "github.com/redis/go-redis/v9"

// goRedis opens a go-redis client, the client the go-redis based peers are
// documented with, with its default pool and ContextTimeoutEnabled, as the
// README's quick start sets it: go-redis then ends a call at its context's
// deadline itself, so sluice's adapter runs the call in the caller's
// goroutine (the peers see no change: their calls carry no deadline).
func (s *server) goRedis() goredis.UniversalClient {
	if s.cluster {
		return goredis.NewClusterClient(&goredis.ClusterOptions{
			Addrs: s.addrs, Username: s.username, Password: s.password,
			DisableIdentity:       true,
			ContextTimeoutEnabled: true,
		})
	}
	return goredis.NewClient(&goredis.Options{
		Addr: s.addrs[0], Username: s.username, Password: s.password,
		// go-redis sends CLIENT SETINFO on connect by default, which
		// miniredis does not know.
		DisableIdentity:       true,
		ContextTimeoutEnabled: true,
	})
}
