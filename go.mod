module github.com/sluicekit/sluice

go 1.25.0

require (
	github.com/alicebob/miniredis/v2 v2.40.0
	github.com/google/uuid v1.6.0
	github.com/redis/rueidis v1.0.79
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.22.0
)

require (
	github.com/yuin/gopher-lua v1.1.1 // indirect
	golang.org/x/sys v0.47.0 // indirect
)
