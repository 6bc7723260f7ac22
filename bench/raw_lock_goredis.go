//go:build peers

package main

import (
	"context"

	sluicegoredis "github.com/sluicekit/sluice/goredis"
)

// The raw lock reference on go-redis (see raw_lock.go): the same bare
// EVALSHAs on the go-redis client the go-redis based peers and sluice
// (go-redis) use.
func init() {
	lockImpls = append(lockImpls, impl[locker]{
		name: "raw EVALSHA (go-redis)", kind: reference, only: rawLockWorkload,
		open: func(ctx context.Context, s *server, _ rate) (locker, func(), error) {
			client := s.goRedis()
			cache, err := sluicegoredis.New(ctx, client)
			if err != nil {
				client.Close()
				return nil, nil, err
			}
			eval := func(ctx context.Context, sha string, keys, args []string) (int64, error) {
				a := make([]any, len(args))
				for i, x := range args {
					a[i] = x
				}
				return client.EvalSha(ctx, sha, keys, a...).Int64()
			}
			load := func(ctx context.Context, body string) error {
				return client.ScriptLoad(ctx, body).Err()
			}
			l, err := newRawLocker(ctx, cache, eval, load)
			if err != nil {
				client.Close()
				return nil, nil, err
			}
			return l, func() { _ = client.Close() }, nil
		},
	})
}
