package grpclimit_test

import (
	"context"
	"log"

	"google.golang.org/grpc"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/grpc/grpclimit"
	"github.com/sluicekit/sluice/ratelimit"
)

// A gRPC server that allows each client IP 100 calls per minute, and
// callers with an "x-tenant" metadata value 100 per minute per tenant.
func Example() {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	sc, err := sluice.New(context.Background(), client)
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := ratelimit.New(sc, ratelimit.Options{Limit: ratelimit.PerMinute(100)})
	if err != nil {
		log.Fatal(err)
	}
	ic, err := grpclimit.New(limiter, grpclimit.Options{MetadataKey: "x-tenant"})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(ic.Unary), grpc.StreamInterceptor(ic.Stream))
	_ = srv // register services, then srv.Serve(listener)
}
