package scriptcache

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// Client is the part of a Redis client that sluice needs: script calls, WAIT
// after a script call, SCRIPT LOAD on every node, and a subscription. Every
// primitive reaches Redis through it, so any client that implements it runs
// them. New adapts a rueidis.Client; the module
// github.com/sluicekit/sluice/goredis adapts go-redis. NewFrom takes any
// implementation, which must be safe for concurrent use.
//
// Implementations report replies, not interpretations: an error reply from
// the server goes into the Reply as an error for which ServerError is true,
// and a Lua nil at the top level is a nil value, not an error. They must not
// send a script call twice: a call whose connection broke after it was sent
// may have run, and running it again would act twice (a reentrant Lock
// would count two holds). Redirections (MOVED, ASK), which mean the call did
// not run, may be followed. An error of the client's own that means the
// server cannot answer now (a pool with no free connection in time) wraps
// ErrUnavailable, so that a fallback may answer for it.
type Client interface {
	// Cluster reports whether the client talks to a Redis Cluster, where all
	// keys of one call must hash to one slot.
	Cluster() bool

	// Eval sends EVALSHA sha when body is empty and EVAL body otherwise,
	// with keys and args, to the node that owns the keys' slot (any node
	// when there are no keys). It returns when ctx ends, even if the call
	// may still run. keys and args are the Client's: a Cache passes
	// copies it never touches again, so the call may keep them, and
	// point into them, for as long as it runs.
	Eval(ctx context.Context, sha, body string, keys, args []string) Reply

	// EvalWait sends the same call followed by WAIT replicas timeout on one
	// connection that no other caller uses, and returns the script's reply,
	// how many replicas acknowledged and an error for the pair. When ctx
	// ends mid-call, it returns at once with an error wrapping ctx.Err()
	// (and the script's reply, if the client has it), and sends nothing
	// more for the call: no WAIT after a script whose reply came too late.
	// A script cut short so is of unknown outcome, as with Eval: closing a
	// connection does not take back what was sent on it. A client that
	// can close the call's connection then does (rueidis), so WAIT does
	// not block it on the server; one that cannot (go-redis) leaves the
	// call to its own timeouts.
	EvalWait(ctx context.Context, sha, body string, keys, args []string, replicas int64, timeout time.Duration) (Reply, int64, error)

	// LoadScripts sends SCRIPT LOAD of every body to every node the client
	// knows, primaries and replicas.
	LoadScripts(ctx context.Context, bodies ...string) error

	// Subscribe subscribes to channel (SSUBSCRIBE when sharded, else
	// SUBSCRIBE) and calls message with the payload of every message, in
	// order, and subscribed each time the server confirms the
	// subscription. It blocks until ctx ends, after unsubscribing, or until
	// the subscription fails; it returns the error then. A connection that
	// went silent without a reset fails once a PING on it goes unanswered
	// (rueidis, by default, pings a connection quiet for a second and
	// gives it ten; the go-redis adapter pings after 5 s and gives 5
	// more): a blocked read would leave the channel's waiters to their
	// timers.
	// An error that retrying cannot fix, because the server refused the
	// subscription (NOPERM, an unknown command), wraps ErrRefused.
	Subscribe(ctx context.Context, channel string, sharded bool, subscribed func(), message func(payload string)) error
}

// ErrRefused is wrapped by the error Client.Subscribe returns when the server
// refused the subscription with an error reply that retrying cannot fix.
var ErrRefused = errors.New("scriptcache: refused by server")

// ErrUnavailable is wrapped by an error of a Client that means the server
// cannot answer now in terms only that client knows: go-redis's
// ErrPoolTimeout, say, when every pooled connection is stuck on a server
// that stopped answering. ratelimit.Unavailable, which decides whether a
// fallback may answer for an error, knows the errors of the standard
// library (timeouts, failed connections), the server's error replies and
// rueidis's own; any other client's reach it through ErrUnavailable. An
// error that retrying cannot fix (a client its owner closed, a
// configuration error) must not wrap it.
var ErrUnavailable = errors.New("scriptcache: server unavailable")

// Retryable reports whether an error reply with message msg comes from a
// server that is busy with something that passes: a cluster moving slots or
// electing a primary, a replica loading its data. Client implementations use
// it to tell those from refusals (see ErrRefused).
func Retryable(msg string) bool {
	for _, p := range [...]string{"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// Reply is the reply to one call: an error, or a value that is an integer,
// a string, nil or an array of those.
type Reply struct {
	rr    rueidis.RedisResult // from the rueidis client
	v     any                 // from other clients: int64, string, nil or []any
	err   error               // from other clients
	srv   bool                // err is an error reply from the server
	other bool                // v, err and srv are set, rr is not
}

// NewReply returns the Reply of a client other than rueidis. v is an int64,
// a string, nil or a []any of those; err is the call's error, and
// serverError tells whether err is an error reply from the server (the call
// ran, or was refused by the server) rather than a failure to send it or
// to read its reply.
func NewReply(v any, err error, serverError bool) Reply {
	return Reply{v: v, err: err, srv: err != nil && serverError, other: true}
}

// ErrorReply returns a Reply that carries err, which is not a server's reply.
func ErrorReply(err error) Reply { return NewReply(nil, err, false) }

// Error returns the call's error, if any. A nil reply is not an error.
func (r Reply) Error() error {
	if r.other {
		return r.err
	}
	err := r.rr.Error()
	if err != nil && rueidis.IsRedisNil(err) {
		return nil
	}
	return err
}

// ServerError reports whether the reply is an error reply from the server:
// the call reached Redis. Any other error leaves the outcome unknown.
func (r Reply) ServerError() bool {
	if r.other {
		return r.srv
	}
	re, ok := rueidis.IsRedisErr(r.rr.Error())
	return ok && !re.IsNil()
}

// AsInt64 returns the reply as an integer (a string of digits counts).
func (r Reply) AsInt64() (int64, error) {
	if r.other {
		if r.err != nil {
			return 0, r.err
		}
		return Value{v: r.v, other: true}.AsInt64()
	}
	return r.rr.AsInt64()
}

// ToString returns the reply as a string.
func (r Reply) ToString() (string, error) {
	if r.other {
		if r.err != nil {
			return "", r.err
		}
		return Value{v: r.v, other: true}.ToString()
	}
	return r.rr.ToString()
}

// ToArray returns the reply as an array.
func (r Reply) ToArray() (Array, error) {
	if r.other {
		if r.err != nil {
			return Array{}, r.err
		}
		return Value{v: r.v, other: true}.ToArray()
	}
	m, err := r.rr.ToArray()
	return Array{m: m}, err
}

// AsIntSlice returns an array reply of integers as a slice.
func (r Reply) AsIntSlice() ([]int64, error) {
	a, err := r.ToArray()
	if err != nil {
		return nil, err
	}
	out := make([]int64, a.Len())
	for i := range out {
		if out[i], err = a.At(i).AsInt64(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Array is an array reply. Reading it allocates nothing.
type Array struct {
	m     []rueidis.RedisMessage
	v     []any
	other bool
}

// Len returns the number of elements.
func (a Array) Len() int {
	if a.other {
		return len(a.v)
	}
	return len(a.m)
}

// At returns element i, which must be in [0, Len()).
func (a Array) At(i int) Value {
	if a.other {
		return Value{v: a.v[i], other: true}
	}
	return Value{m: &a.m[i]}
}

// Value is one element of an array reply.
type Value struct {
	m     *rueidis.RedisMessage
	v     any
	other bool
}

var errType = errors.New("scriptcache: unexpected reply type")

// IsNil reports whether the value is nil (a Lua false or nil).
func (v Value) IsNil() bool {
	if v.other {
		return v.v == nil
	}
	return v.m.IsNil()
}

// AsInt64 returns the value as an integer (a string of digits counts).
func (v Value) AsInt64() (int64, error) {
	if !v.other {
		return v.m.AsInt64()
	}
	switch x := v.v.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	default:
		return 0, fmt.Errorf("%w: %T, want an integer", errType, v.v)
	}
}

// ToString returns the value as a string.
func (v Value) ToString() (string, error) {
	if !v.other {
		return v.m.ToString()
	}
	if s, ok := v.v.(string); ok {
		return s, nil
	}
	return "", fmt.Errorf("%w: %T, want a string", errType, v.v)
}

// ToArray returns the value as an array.
func (v Value) ToArray() (Array, error) {
	if !v.other {
		m, err := v.m.ToArray()
		return Array{m: m}, err
	}
	if a, ok := v.v.([]any); ok {
		return Array{v: a, other: true}, nil
	}
	return Array{}, fmt.Errorf("%w: %T, want an array", errType, v.v)
}
