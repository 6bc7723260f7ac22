//go:build !peers

package main

// peersBuilt says whether this binary has the peer libraries (and sluice on
// go-redis) compiled in. Without -tags peers they are left out, so that the
// demo downloads and compiles only sluice and miniredis.
const peersBuilt = false
