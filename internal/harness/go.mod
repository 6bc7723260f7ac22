module github.com/sluicekit/sluice/internal/harness

go 1.26.0

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.79
	github.com/sluicekit/sluice v0.1.0
	github.com/sluicekit/sluice/goredis v0.1.0
	github.com/sluicekit/sluice/grpc v0.1.0
	github.com/sluicekit/sluice/otel v0.1.0
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/sdk/metric v1.47.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261026165753-2ffab32bce7e
	google.golang.org/grpc v1.85.0
	golang.org/x/sys v0.48.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
)
