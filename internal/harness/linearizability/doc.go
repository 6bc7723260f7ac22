// Package linearizability records histories of mutex, semaphore and
// rate-limit operations made under contention by several OS processes
// against a real Redis server and a Redis Cluster, and checks each history
// against a sequential model with porcupine.
//
// Counting tests (a counter that ends at the right value, a gauge that never
// exceeds N) see only what the test thought to count. A linearizability
// check asks more: is there one order of all operations, consistent with
// their real-time order, in which every answer is what the model allows?
// Two lock holders at once, fencing tokens that do not increase, more than
// N semaphore permits held, a TryLock or TryAcquire turned away while there
// was room, and a limiter that allowed too much or denied too early all fail
// it.
//
// Run is the suite every client sluice runs on passes: the package's own
// tests call it with rueidis, module github.com/sluicekit/sluice/goredis
// with go-redis. To show that the check is not vacuous, the package's own
// tests also run deliberately broken implementations (check-then-act in two
// round trips) and the real primitives on mutated scripts, and require
// porcupine to call their histories illegal; they check the checker, so
// they run once, on rueidis.
//
// Operations from different processes are put on one time line with
// CLOCK_MONOTONIC, which every process on a Linux machine shares.
// SLUICE_LONG=1 runs bigger histories.
package linearizability
