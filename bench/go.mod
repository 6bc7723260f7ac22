module github.com/sluicekit/sluice/bench

go 1.26.0

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/bsm/redislock v0.9.4
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/go-redsync/redsync/v4 v4.18.1
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.79
	github.com/sluicekit/sluice v0.1.0
	github.com/ulule/limiter/v3 v3.11.2
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/sluicekit/sluice/goredis v0.1.0
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
