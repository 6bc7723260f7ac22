package main

import (
	"context"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice"
)

// openCache gives one sluice instance its own client and script cache, the
// way a program would set sluice up.
func openCache(ctx context.Context, s *server) (*sluice.Client, rueidis.Client, error) {
	client, err := s.rueidis()
	if err != nil {
		return nil, nil, err
	}
	sc, err := sluice.New(ctx, client)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return sc, client, nil
}
