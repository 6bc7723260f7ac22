// Package faulttest holds the fault-injection scenarios of sluice's
// reliability suite (issue 6): network latency, a blackhole, lost replies,
// reset pub/sub connections, SCRIPT FLUSH storms and a Redis restart, run
// against a real redis-server through internal/faultproxy.
//
// The scenarios are about sluice's behaviour, not a client's, so every
// client sluice runs on must pass them: Run runs them all with the
// primitives on clients a factory makes. The package's own tests run them
// on rueidis, module github.com/sluicekit/sluice/goredis on go-redis.
//
// CI runs every scenario in its short form (the whole package takes well
// under two minutes with -race); SLUICE_LONG=1 runs the long form: more
// trials and longer holds.
package faulttest
