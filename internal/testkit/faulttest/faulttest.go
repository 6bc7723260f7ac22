package faulttest

import (
	"testing"

	"github.com/sluicekit/sluice/scriptcache"
)

// NewCache returns a script cache on a new client of the single Redis
// server at addr, which may be a fault proxy in front of the server. The
// client must be closed when t ends (t.Cleanup). A scenario that fails the
// server (kill -9, blackhole, reset) asks for a client of its own.
type NewCache func(t testing.TB, addr string, o ClientOptions) *scriptcache.Cache

// ClientOptions is what a scenario needs of a client beyond its defaults.
type ClientOptions struct {
	// Quiet asks for a client that sends nothing of its own accord (no
	// background PING or health check on an idle connection) and, where
	// the client lets a caller choose, sends its calls on one connection.
	// The lost-reply scenarios need it: the call whose reply the proxy
	// drops must be the one under test, and a connection dialed while
	// replies are dropped never finishes its handshake.
	Quiet bool
}

// scenarios are the scenarios Run runs, by subtest name.
var scenarios = []struct {
	name string
	run  func(t *testing.T, newCache NewCache)
}{
	{"BlackholeLossBeforeExpiry", blackholeLossBeforeExpiry},
	{"LatencyNoFalseLoss", latencyNoFalseLoss},
	{"LostAcquireReply", lostAcquireReply},
	{"LostUnlockReply", lostUnlockReply},
	{"PubSubResetWaiters", pubSubResetWaiters},
	{"RedisRestart", redisRestart},
	{"ScriptFlushStorm", scriptFlushStorm},
}

// Run runs every scenario, as a subtest of t, with the primitives under
// test on caches made by newCache. The observer that reads the server's
// state around a fault is a rueidis client of its own, whatever the client
// under test. The package needs redistest.Main as its TestMain: the
// scenarios must leave no goroutine behind.
func Run(t *testing.T, newCache NewCache) {
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) { s.run(t, newCache) })
	}
}
