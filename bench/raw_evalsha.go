package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice"
)

// The raw reference: the fixed-window script sent as a bare EVALSHA per
// call through rueidis, with nothing around it (no deny cache, no result
// type, no NOSCRIPT handling). It shows what one unpipelined call per Allow
// costs on this server and client.
func init() {
	limiterImpls = append(limiterImpls, impl[limiter]{
		name: "raw EVALSHA", kind: reference, script: "ratelimit_fixed",
		open: func(ctx context.Context, s *server, r rate) (limiter, func(), error) {
			client, cache, err := rawClient(ctx, s)
			if err != nil {
				return nil, nil, err
			}
			script, err := cache.Script("ratelimit_fixed")
			if err != nil {
				client.Close()
				return nil, nil, err
			}
			l := &rawLimiter{
				client: client, sha: script.SHA1(),
				args: []string{strconv.Itoa(r.limit), strconv.FormatInt(r.window.Milliseconds(), 10), "1"},
			}
			return l, client.Close, nil
		},
	})
}

// rawClient makes a rueidis client of its own and a scripts client on it,
// for a raw reference to take the scripts' SHA1s from.
func rawClient(ctx context.Context, s *server) (rueidis.Client, *sluice.Client, error) {
	client, err := s.rueidis()
	if err != nil {
		return nil, nil, err
	}
	cache, err := sluice.New(ctx, client)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return client, cache, nil
}

type rawLimiter struct {
	client rueidis.Client
	sha    string
	args   []string
}

func (l *rawLimiter) Allow(ctx context.Context, key string) (bool, error) {
	c := l.client
	reply, err := c.Do(ctx, c.B().Evalsha().Sha1(l.sha).Numkeys(1).Key(key).Arg(l.args...).Build()).ToArray()
	if err != nil {
		return false, err
	}
	if len(reply) == 0 {
		return false, fmt.Errorf("raw EVALSHA: empty reply")
	}
	allowed, err := reply[0].AsInt64()
	return allowed == 1, err
}
