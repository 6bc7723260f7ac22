package goredis_test

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicekit/sluice/goredis"
)

// TestNewServerDown points New at a closed port on loopback: the error
// says the deadline passed and why (the connection was refused), which
// go-redis otherwise only logs.
func TestNewServerDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	for _, tc := range []struct {
		name string
		rdb  redis.UniversalClient
	}{
		{"single", redis.NewClient(&redis.Options{Addr: addr})},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer tc.rdb.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := goredis.New(ctx, tc.rdb)
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("New = %v; want an error wrapping ECONNREFUSED", err)
			}
			if tc.name == "single" && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("New = %v; want an error wrapping context.DeadlineExceeded", err)
			}
			t.Log(err)
		})
	}
}
