// Package faulttest holds the fault-injection scenarios of sluice's
// reliability suite (issue 6) as tests: network latency, a blackhole, lost
// replies, reset pub/sub connections, SCRIPT FLUSH storms and a Redis
// restart, run against a real redis-server through internal/faultproxy.
//
// It has no code of its own outside tests. CI runs every scenario in its
// short form (the whole package takes well under two minutes with -race);
// SLUICE_LONG=1 runs the long form: more trials and longer holds.
package faulttest
