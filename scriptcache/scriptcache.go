// Package scriptcache runs sluice's Lua scripts on Redis: the single way every
// other sluice package talks to the server's scripting engine. It is the
// machinery under sluice.Client (which is this package's Cache): programs
// that use the primitives start at package sluice; this package is for
// adapter authors (Client, Reply, NewFrom) and for running scripts of one's
// own (Cache.Script).
//
// New reads every NAME.lua file of an fs.FS (the scripts of package lua by
// default), computes their SHA1 digests locally and loads them with SCRIPT
// LOAD into every node the client knows. Script looks a script up by name;
// unknown names fail there, in a constructor, not on the hot path.
//
// Script.Exec sends EVALSHA. Redis forgets scripts on restart, on SCRIPT
// FLUSH and on failover to a node that never saw them; then EVALSHA answers
// NOSCRIPT, and Exec loads the script again and retries, so callers never see
// NOSCRIPT. Concurrent NOSCRIPT replies for one script load it once. If the
// cache is flushed again between the load and the retry, Exec falls back to
// EVAL, which carries the script body.
//
// On a Redis Cluster all keys of one call must hash to one slot; Exec checks
// that before sending and returns ErrCrossSlot otherwise (the rueidis cluster
// client would panic).
//
// A Cache runs on a Client: New takes a rueidis client, NewFrom any Client,
// such as the go-redis one of module github.com/sluicekit/sluice/goredis.
// Every primitive reaches Redis through scripts and one subscription per
// waited-on name, never through other commands, so the two clients behave
// the same.
package scriptcache

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"golang.org/x/sync/singleflight"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/lua"
)

// Errors returned by this package; check them with errors.Is.
var (
	// ErrUnknownScript means no NAME.lua file exists for the name asked.
	ErrUnknownScript = errors.New("scriptcache: unknown script")
	// ErrCrossSlot means the keys of one call hash to different cluster
	// slots; the call was not sent.
	ErrCrossSlot = errors.New("scriptcache: keys in different cluster slots")
	// ErrNilClient means New was given a nil client.
	ErrNilClient = errors.New("scriptcache: nil client")
	// ErrNoScripts means the file system holds no .lua file.
	ErrNoScripts = errors.New("scriptcache: no scripts found")
)

// Option configures New.
type Option func(*options)

type options struct {
	fsys     fs.FS
	observer Observer
	logger   *slog.Logger
}

// WithFS makes New read scripts from fsys instead of package lua.
func WithFS(fsys fs.FS) Option {
	return func(o *options) { o.fsys = fsys }
}

// Cache holds the loaded scripts and what the primitives need to know about
// the server. It is safe for concurrent use.
type Cache struct {
	client  Client
	cluster bool
	sharded bool
	scripts map[string]*Script
	loads   singleflight.Group
	// observer gets the primitives' events; nil when neither WithObserver
	// nor WithLogger was given.
	observer Observer
}

// New reads the scripts and loads them into every node of client.
//
// Calls on a rueidis client share its pipelining connection and see their
// context's cancellation but not its deadline: with one, rueidis would set
// a socket deadline and close the connection other callers share when it
// passed mid-command; without one it abandons only the call whose context
// ended. A call that must wait for a new connection is still bounded by the
// client's dial timeout (ClientOption.Dialer.Timeout, 5 s by default), not
// by its context, when a server accepts connections but does not answer:
// lower the dial timeout where that matters.
//
// One exception, for latency: a call made while no other call of this
// Cache is in flight, with a context that has a deadline, borrows a
// connection of the client's blocking pool (ClientOption.BlockingPoolSize)
// and runs in the caller's goroutine, with the deadline on that connection
// (closed if it passes). Pipelining gains nothing for a lone call, and
// handing it to rueidis's writer and reader goroutines costs it two
// goroutine switches; the bench's one-goroutine Allow runs about 1.7 times
// as fast this way. Such a call notices a cancellation before its deadline
// only when its reply comes.
func New(ctx context.Context, client rueidis.Client, opts ...Option) (*Cache, error) {
	if client == nil {
		return nil, ErrNilClient
	}
	return NewFrom(ctx, newRueidisClient(client), opts...)
}

// NewFrom is New for any Client, such as the go-redis one of module
// github.com/sluicekit/sluice/goredis.
func NewFrom(ctx context.Context, client Client, opts ...Option) (*Cache, error) {
	if client == nil {
		return nil, ErrNilClient
	}
	o := options{fsys: lua.FS()}
	for _, opt := range opts {
		opt(&o)
	}
	c := &Cache{
		client:   client,
		cluster:  client.Cluster(),
		scripts:  make(map[string]*Script),
		observer: newObserver(o.observer, o.logger),
	}
	names, err := fs.Glob(o.fsys, "*.lua")
	if err != nil {
		return nil, fmt.Errorf("scriptcache: list scripts: %w", err)
	}
	if len(names) == 0 {
		return nil, ErrNoScripts
	}
	sort.Strings(names)
	for _, file := range names {
		body, err := fs.ReadFile(o.fsys, file)
		if err != nil {
			return nil, fmt.Errorf("scriptcache: read %s: %w", file, err)
		}
		sum := sha1.Sum(body)
		name := strings.TrimSuffix(path.Base(file), ".lua")
		c.scripts[name] = &Script{c: c, name: name, body: string(body), sha: hex.EncodeToString(sum[:])}
	}
	if err := c.loadAll(ctx); err != nil {
		return nil, err
	}
	// Sharded pub/sub (Redis 7) keeps a release message on the shard that
	// owns the key instead of broadcasting it to every node; it only matters,
	// and is only used, on a cluster.
	c.sharded = c.cluster && serverVersion(ctx, client) >= 7
	return c, nil
}

// loadAll sends SCRIPT LOAD for every script to every node.
func (c *Cache) loadAll(ctx context.Context) error {
	bodies := make([]string, 0, len(c.scripts))
	for _, s := range c.scripts {
		bodies = append(bodies, s.body)
	}
	if err := c.client.LoadScripts(ctx, bodies...); err != nil {
		return fmt.Errorf("scriptcache: script load: %w", err)
	}
	return nil
}

// versionScript returns the server's version; redis.REDIS_VERSION exists
// since Redis 7.0, so older servers return "". A script, not INFO, so that
// Client needs nothing but scripts.
const versionScript = "return redis.REDIS_VERSION or ''"

// serverVersion returns the server's major version, or 0 if unknown.
func serverVersion(ctx context.Context, client Client) int {
	v, err := client.Eval(ctx, "", versionScript, nil, nil).ToString()
	if err != nil {
		return 0
	}
	major, _, _ := strings.Cut(v, ".")
	n, _ := strconv.Atoi(major)
	return n
}

// Script returns the script loaded from NAME.lua.
func (c *Cache) Script(name string) (*Script, error) {
	s, ok := c.scripts[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownScript, name)
	}
	return s, nil
}

// Client returns the client the cache runs scripts on.
func (c *Cache) Client() Client { return c.client }

// Cluster reports whether the client talks to a Redis Cluster.
func (c *Cache) Cluster() bool { return c.cluster }

// ShardedPubSub reports whether primitives should publish with SPUBLISH and
// subscribe with SSUBSCRIBE: true on a Redis 7 (or newer) cluster.
func (c *Cache) ShardedPubSub() bool { return c.sharded }

// Script is one loaded script.
type Script struct {
	c    *Cache
	name string
	body string
	sha  string
	// loads counts completed reloads. A call that saw NOSCRIPT but finds a
	// reload completed since it was sent just retries: its request had
	// simply been queued before the script was back.
	loads atomic.Uint64
}

// Name returns the script's name (its file name without .lua).
func (s *Script) Name() string { return s.name }

// SHA1 returns the hex SHA1 digest Redis knows the script by.
func (s *Script) SHA1() string { return s.sha }

// Exec runs the script with keys and args and returns its reply. NOSCRIPT
// never reaches the caller. On a cluster, keys must share one slot.
//
// When ctx ends before the reply arrives, Exec returns ctx.Err() at once,
// but the script may still run: callers must treat that as an unknown
// outcome.
//
// On a rueidis client, ctx's deadline does not reach the connection, which
// other callers share (see New).
//
// A call refused with TRYAGAIN is sent again, after a pause that grows to
// tryAgainPause, until it is answered otherwise or ctx ends: then the
// TRYAGAIN reply is returned, or, if ctx ended while an attempt was out,
// that attempt's error (it may have run). Redis refuses that way, before running the
// script, while a cluster slot migrates and some of the keys named have
// moved (or are not there yet: a lock's queue, say), so a call of a
// primitive, whose keys share one slot, waits out its slot's migration
// instead of failing. rueidis resends only read-only commands.
func (s *Script) Exec(ctx context.Context, keys, args []string) Reply {
	traced(s.name)
	if err := s.c.checkSlots(keys); err != nil {
		return ErrorReply(err)
	}
	r := s.exec(ctx, keys, args)
	for pause := time.Millisecond; isTryAgain(r) && sleep(ctx, pause); pause = min(2*pause, tryAgainPause) {
		r = s.exec(ctx, keys, args)
	}
	return r
}

// tryAgainPause is the longest pause before a call refused with TRYAGAIN
// is sent again (see Exec).
const tryAgainPause = 50 * time.Millisecond

// isTryAgain reports whether r is the refusal of a cluster node whose slot
// is migrating: the script did not run.
func isTryAgain(r Reply) bool {
	return r.ServerError() && strings.HasPrefix(r.Error().Error(), "TRYAGAIN")
}

// sleep pauses for d, or until ctx ends: it reports whether ctx is still
// live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	}
}

func (s *Script) exec(ctx context.Context, keys, args []string) Reply {
	seen := s.loads.Load()
	r := s.c.eval(ctx, s.sha, "", keys, args)
	if !isNoScript(r) {
		return r
	}
	if s.reload(ctx, seen) == nil {
		if r = s.c.eval(ctx, s.sha, "", keys, args); !isNoScript(r) {
			return r
		}
	}
	// Flushed again in between, or the load failed: EVAL carries the body
	// and caches it on the node that runs it.
	return s.c.eval(ctx, "", s.body, keys, args)
}

// reload loads s again after a call sent when s.loads was seen got
// NOSCRIPT: the node forgot the script. It loads it everywhere once,
// however many callers saw NOSCRIPT at the same time, and not at all if a
// reload completed since the call was sent (the call had simply been
// queued before the script was back): then the caller just tries again.
// Every path that runs a script (Exec, ExecWait) reloads through it.
func (s *Script) reload(ctx context.Context, seen uint64) error {
	if s.loads.Load() != seen {
		return nil
	}
	_, err, _ := s.c.loads.Do(s.sha, func() (any, error) {
		if s.loads.Load() != seen {
			return nil, nil // another caller's reload finished meanwhile
		}
		err := s.load(ctx)
		if err == nil {
			s.loads.Add(1)
		}
		s.reloaded(err)
		return nil, err
	})
	return err
}

// eval sends one script call. rueidis, the client of New, is called
// directly: through the interface, keys and args would escape to the heap
// on every call, costing callers that build them on the stack (a
// Limiter's key, a Mutex's keys and arguments) an allocation. Other
// clients get copies, for the same reason: both in one allocation, and
// theirs to keep (see Client.Eval).
func (c *Cache) eval(ctx context.Context, sha, body string, keys, args []string) Reply {
	if rc, ok := c.client.(rueidisClient); ok {
		return rc.evalChecked(ctx, sha, body, keys, args)
	}
	buf := make([]string, len(keys)+len(args))
	copy(buf, keys)
	copy(buf[len(keys):], args)
	return c.client.Eval(ctx, sha, body, buf[:len(keys):len(keys)], buf[len(keys):])
}

// ExecWait runs the script and then WAIT replicas timeout on the same
// connection, and returns the script's reply and how many replicas
// acknowledged its writes. A primitive uses it to refuse a grant that could
// vanish in a failover (replication is asynchronous).
//
// WAIT blocks its connection, so the pair goes on a connection of its own
// (Client.EvalWait); unlike Exec, the call can carry a deadline without
// harming other callers. When ctx ends mid-call, or 5 s after WAIT's
// timeout if no reply has come (a server that stopped answering),
// ExecWait returns and nothing more is sent for the call (see
// Client.EvalWait): the script may or may not have run. A call that must
// first open a connection is bounded by the client's dial timeout rather
// than by ctx (see New). A call refused with TRYAGAIN is sent again, as by
// Exec.
func (s *Script) ExecWait(ctx context.Context, keys, args []string, replicas int64, timeout time.Duration) (Reply, int64, error) {
	traced(s.name)
	if err := s.c.checkSlots(keys); err != nil {
		return ErrorReply(err), 0, err
	}
	if err := ctx.Err(); err != nil {
		return ErrorReply(err), 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+waitSlack)
	defer cancel()
	r, acks, err := s.execWait(ctx, keys, args, replicas, timeout)
	for pause := time.Millisecond; isTryAgain(r) && sleep(ctx, pause); pause = min(2*pause, tryAgainPause) {
		r, acks, err = s.execWait(ctx, keys, args, replicas, timeout) // (as Exec)
	}
	return r, acks, err
}

// waitSlack bounds how long after its WAIT timeout a call of ExecWait may
// still wait for its reply before the outcome is declared unknown.
const waitSlack = 5 * time.Second

func (s *Script) execWait(ctx context.Context, keys, args []string, replicas int64, timeout time.Duration) (Reply, int64, error) {
	client := s.c.client
	seen := s.loads.Load()
	r, acks, err := client.EvalWait(ctx, s.sha, "", keys, args, replicas, timeout)
	if !isNoScript(r) {
		return r, acks, err
	}
	if s.reload(ctx, seen) == nil {
		if r, acks, err = client.EvalWait(ctx, s.sha, "", keys, args, replicas, timeout); !isNoScript(r) {
			return r, acks, err
		}
	}
	return client.EvalWait(ctx, "", s.body, keys, args, replicas, timeout)
}

// reloaded reports a reload after NOSCRIPT, which failed if err is set.
func (s *Script) reloaded(err error) {
	if o := s.c.observer; o != nil {
		o.Observe(Event{Kind: EventScriptReload, Primitive: PrimitiveScript, Name: s.name, Err: err})
	}
}

// load sends SCRIPT LOAD of s to every node.
func (s *Script) load(ctx context.Context) error {
	return s.c.client.LoadScripts(ctx, s.body)
}

func (c *Cache) checkSlots(keys []string) error {
	return checkSlots(c.cluster, keys)
}

// checkSlots returns an error wrapping ErrCrossSlot if cluster is set and
// keys hash to more than one slot.
func checkSlots(cluster bool, keys []string) error {
	if !cluster || len(keys) < 2 {
		return nil
	}
	slot := keyspace.Slot(keys[0])
	for _, k := range keys[1:] {
		if keyspace.Slot(k) != slot {
			return fmt.Errorf("%w: %q and %q", ErrCrossSlot, keys[0], k)
		}
	}
	return nil
}

// isNoScript reports whether r is a NOSCRIPT error reply.
func isNoScript(r Reply) bool {
	return r.ServerError() && strings.HasPrefix(r.Error().Error(), "NOSCRIPT")
}
