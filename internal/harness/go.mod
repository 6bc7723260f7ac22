module github.com/sluicekit/sluice/internal/harness

go 1.26.0

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/envoyproxy/go-control-plane/envoy v1.40.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.79
	github.com/sluicekit/sluice v0.1.0
	github.com/sluicekit/sluice/goredis v0.1.0
	github.com/sluicekit/sluice/grpc v0.1.0
	github.com/sluicekit/sluice/otel v0.1.0
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/sdk/metric v1.47.0
	golang.org/x/sys v0.48.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261026165753-2ffab32bce7e
	google.golang.org/grpc v1.85.0
)

require (
	github.com/cncf/xds/go v0.0.0-20260202195803-dba9d589def2 // indirect
	github.com/envoyproxy/protoc-gen-validate v1.3.3 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/planetscale/vtprotobuf v0.6.1-0.20240319094008-0393e58bdf10 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/sdk v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0
	github.com/sluicekit/sluice/envoy v0.1.0
	go.uber.org/atomic v1.12.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
)
