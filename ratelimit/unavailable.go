package ratelimit

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/scriptcache"
	"github.com/sluicekit/sluice/semaphore"
)

// Unavailable reports whether err says that Redis (or whatever a KeyFunc or
// PolicyFunc asks) could not answer: the only errors a fallback
// (FallbackOpen, FallbackClosed, FallbackLocal) may answer for. The
// middlewares, Checker and the gRPC interceptors all decide with it. Any
// other error is a configuration or semantic error (a capacity mismatch, a
// closed semaphore Manager or go-redis client, a key holding another type
// of value, a KeyFunc that finds no key): retrying cannot fix it, and
// switching limiting off for it would let a client or a configuration
// mistake do so while Redis is healthy, so it is refused (500, or
// codes.Internal) and reported instead.
//
// Unavailable is true for:
//   - a timeout: context.DeadlineExceeded (the check's own Timeout) or
//     os.ErrDeadlineExceeded, and any net.Error whose Timeout is true;
//   - an abandoned call: context.Canceled;
//   - a failed connection: a *net.OpError (dial, read or write), a
//     *net.DNSError, io.EOF and io.ErrUnexpectedEOF (the server closed
//     the connection), net.ErrClosed, and ECONNREFUSED, ECONNRESET,
//     ECONNABORTED, EPIPE, ETIMEDOUT, EHOSTUNREACH, ENETUNREACH;
//   - rueidis.ErrClosing, rueidis.ErrNoAddr and rueidis.ErrNoSlot: rueidis
//     reports a connection it dropped (a failover, a topology change) with
//     the same ErrClosing as a client its owner closed, so the two cannot
//     be told apart;
//   - scriptcache.ErrUnavailable, which another client's adapter wraps
//     around its own errors of the kind: the go-redis adapter
//     (module github.com/sluicekit/sluice/goredis) around ErrPoolTimeout
//     and ErrPoolExhausted, every pooled connection being busy, as they
//     are while calls wait for a server that stopped answering (go-redis's
//     ErrClosed, a client its owner closed, is not one);
//   - an error reply of a server that is busy with something that passes
//     or refuses service for a while: LOADING, BUSY, MASTERDOWN, TRYAGAIN,
//     CLUSTERDOWN, READONLY, MOVED, ASK, NOREPLICAS, MISCONF, OOM, and
//     "ERR max number of clients reached" (read from a *rueidis.RedisError,
//     or a go-redis error, which has a RedisError method);
//   - semaphore.ErrNotReplicated: the replicas did not acknowledge a
//     permit in time.
//
// It is false for nil, for every other error, and for any error wrapping
// semaphore.ErrClosed, whatever else that error wraps. Other error
// replies (WRONGTYPE, NOPERM, NOAUTH, a script error) mean the call
// reached a server that answered it.
func Unavailable(err error) bool {
	if err == nil || errors.Is(err, semaphore.ErrClosed) {
		return false
	}
	for _, target := range unavailableErrs {
		if errors.Is(err, target) {
			return true
		}
	}
	var (
		op  *net.OpError
		dns *net.DNSError
		ne  net.Error
	)
	switch {
	case errors.As(err, &op), errors.As(err, &dns):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		return true
	}
	if msg, ok := serverError(err); ok {
		code, _, _ := strings.Cut(msg, " ")
		switch code {
		case "LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "READONLY", "MOVED", "ASK",
			"NOREPLICAS", "MISCONF", "OOM":
			return true
		}
		// rueidis drops the "ERR " of generic errors.
		return strings.HasPrefix(strings.TrimPrefix(msg, "ERR "), "max number of clients reached")
	}
	return false
}

// unavailableErrs are the sentinels of Unavailable.
var unavailableErrs = [...]error{
	context.DeadlineExceeded, context.Canceled, os.ErrDeadlineExceeded,
	io.EOF, io.ErrUnexpectedEOF, net.ErrClosed,
	syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
	syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH,
	rueidis.ErrClosing, rueidis.ErrNoAddr, rueidis.ErrNoSlot,
	scriptcache.ErrUnavailable, semaphore.ErrNotReplicated,
}

// serverError returns the message of the error reply err wraps, if it
// wraps one: a rueidis error reply, or a go-redis one (marked by its
// RedisError method).
func serverError(err error) (string, bool) {
	var re *rueidis.RedisError
	if errors.As(err, &re) {
		if re.IsNil() {
			return "", false
		}
		return re.Error(), true
	}
	var gr interface {
		error
		RedisError()
	}
	if errors.As(err, &gr) {
		return gr.Error(), true
	}
	return "", false
}
