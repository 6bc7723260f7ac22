//go:build peers

package main

// peersBuilt says whether this binary has the peer libraries (and sluice on
// go-redis) compiled in: they are, with -tags peers.
const peersBuilt = true
