package main

import (
	"context"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/scriptcache"
)

// openCache gives one sluice instance its own client and script cache, the
// way a program would set sluice up.
func openCache(ctx context.Context, s *server) (*scriptcache.Cache, rueidis.Client, error) {
	client, err := s.rueidis()
	if err != nil {
		return nil, nil, err
	}
	sc, err := scriptcache.New(ctx, client)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return sc, client, nil
}
