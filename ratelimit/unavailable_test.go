package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// goRedisError is shaped as go-redis's error replies are: an error with a
// RedisError method.
type goRedisError string

func (e goRedisError) Error() string { return string(e) }
func (goRedisError) RedisError()     {}

// timeoutError is a net.Error that says whether it is a timeout.
type timeoutError bool

func (e timeoutError) Error() string   { return "test: net error" }
func (e timeoutError) Timeout() bool   { return bool(e) }
func (e timeoutError) Temporary() bool { return false }

// TestUnavailable is the table of Unavailable, one row per branch: only
// outages may reach a fallback.
func TestUnavailable(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("ratelimit: %w", err) }
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		// Timeouts and abandoned calls.
		{"deadline", context.DeadlineExceeded, true},
		{"wrapped deadline", wrap(context.DeadlineExceeded), true},
		{"canceled", context.Canceled, true},
		{"os deadline", os.ErrDeadlineExceeded, true},
		{"net timeout", wrap(timeoutError(true)), true},
		{"net error, no timeout", timeoutError(false), false},
		{"TryAcquire timed out", fmt.Errorf("%w: %q: %w", semaphore.ErrNotObtained, "s", context.DeadlineExceeded), true},
		// Failed connections.
		{"dial refused", wrap(&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}), true},
		{"read", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("test")}, true},
		{"dns", &net.DNSError{Err: "no such host", Name: "redis"}, true},
		{"eof", wrap(io.EOF), true},
		{"unexpected eof", io.ErrUnexpectedEOF, true},
		{"closed conn", net.ErrClosed, true},
		{"econnrefused", syscall.ECONNREFUSED, true},
		{"econnreset", wrap(syscall.ECONNRESET), true},
		{"econnaborted", syscall.ECONNABORTED, true},
		{"epipe", syscall.EPIPE, true},
		{"etimedout", syscall.ETIMEDOUT, true},
		{"ehostunreach", syscall.EHOSTUNREACH, true},
		{"enetunreach", syscall.ENETUNREACH, true},
		{"other errno", syscall.EACCES, false},
		{"rueidis closing", wrap(rueidis.ErrClosing), true},
		{"rueidis no addr", rueidis.ErrNoAddr, true},
		{"rueidis no slot", rueidis.ErrNoSlot, true},
		// Another client's own, marked by its adapter (go-redis's pool
		// timeout: goredis.TestPoolExhaustedUnavailable); unmarked, the
		// same text says nothing.
		{"adapter: unavailable", wrap(fmt.Errorf("%w: redis: connection pool timeout", scriptcache.ErrUnavailable)), true},
		{"unmarked pool timeout", errors.New("redis: connection pool timeout"), false},
		{"rueidis recycled dedicated client", rueidis.ErrDedicatedClientRecycled, false},
		// Replicas that did not acknowledge.
		{"not replicated", wrap(semaphore.ErrNotReplicated), true},
		// go-redis error replies (rueidis ones: TestUnavailableServerErrors).
		{"go-redis LOADING", wrap(goRedisError("LOADING Redis is loading the dataset in memory")), true},
		{"go-redis max clients", goRedisError("ERR max number of clients reached"), true},
		{"go-redis WRONGTYPE", goRedisError("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{"go-redis client closed", errors.New("redis: client is closed"), false},
		// Configuration and semantic errors.
		{"manager closed", semaphore.ErrClosed, false},
		{"manager closed, canceled", fmt.Errorf("%w: %w", semaphore.ErrClosed, context.Canceled), false},
		{"capacity mismatch", wrap(semaphore.ErrCapacityMismatch), false},
		{"invalid name", semaphore.ErrInvalidName, false},
		{"invalid capacity", semaphore.ErrInvalidCapacity, false},
		{"not obtained", fmt.Errorf("%w: %q has fewer than 1 permits free", semaphore.ErrNotObtained, "s"), false},
		{"invalid key", ErrInvalidKey, false},
		{"cost too high", ErrCostTooHigh, false},
		{"invalid options", ErrInvalidOptions, false},
		{"unexpected reply", ErrUnexpectedReply, false},
		{"cross slot", scriptcache.ErrCrossSlot, false},
		{"no client ip", ErrNoClientIP, false},
		{"a KeyFunc's own", errors.New("no token"), false},
	} {
		if got := Unavailable(tt.err); got != tt.want {
			t.Errorf("%s: Unavailable(%v) = %v; want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

// TestUnavailableServerErrors runs the error replies of Unavailable through
// a real server and rueidis: the server codes of an outage count, the others
// (the server answered) do not.
func TestUnavailableServerErrors(t *testing.T) {
	client := redistest.Client(t, redistest.Single(t).Addr())
	ctx := context.Background()
	reply := func(msg string) error {
		t.Helper()
		err := client.Do(ctx, client.B().Eval().Script("return redis.error_reply(ARGV[1])").Numkeys(0).Arg(msg).Build()).Error()
		var re *rueidis.RedisError
		if !errors.As(err, &re) {
			t.Fatalf("reply %q: %v; want a *rueidis.RedisError", msg, err)
		}
		return fmt.Errorf("ratelimit: %w", err)
	}
	for _, tt := range []struct {
		msg  string
		want bool
	}{
		{"LOADING Redis is loading the dataset in memory", true},
		{"BUSY Redis is busy running a script", true},
		{"MASTERDOWN Link with MASTER is down", true},
		{"TRYAGAIN Multiple keys request during rehashing of slot", true},
		{"CLUSTERDOWN The cluster is down", true},
		{"READONLY You can't write against a read only replica.", true},
		{"MOVED 3999 127.0.0.1:6381", true},
		{"ASK 3999 127.0.0.1:6381", true},
		{"NOREPLICAS Not enough good replicas to write.", true},
		{"MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk", true},
		{"OOM command not allowed when used memory > 'maxmemory'.", true},
		{"ERR max number of clients reached", true},
		{"BUSYGROUP Consumer Group name already exists", false},
		{"NOPERM this user has no permissions to run the 'evalsha' command", false},
		{"NOAUTH Authentication required.", false},
		{"WRONGPASS invalid username-password pair or user is disabled.", false},
		{"ERR unknown command", false},
	} {
		if err := reply(tt.msg); Unavailable(err) != tt.want {
			t.Errorf("error reply %q (%q): Unavailable = %v; want %v", tt.msg, err, !tt.want, tt.want)
		}
	}
	// A real WRONGTYPE, raised by a script's call on a key of another type.
	key := testPrefix(t) + "list"
	if err := client.Do(ctx, client.B().Rpush().Key(key).Element("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	err := client.Do(ctx, client.B().Eval().Script("return redis.call('GET', KEYS[1])").Numkeys(1).Key(key).Build()).Error()
	if err == nil || Unavailable(err) {
		t.Errorf("WRONGTYPE from a script: %v, Unavailable = %v; want an error, false", err, Unavailable(err))
	}
}
