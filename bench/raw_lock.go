package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/sluicekit/sluice"
	"github.com/sluicekit/sluice/lua"
)

// The raw lock reference: mutex_lock and mutex_release sent as bare
// EVALSHAs, with the keys and arguments an unfair Mutex's Lock and Unlock
// send, and nothing around them: no hold count, no watchdog, no loss
// signal, no NOSCRIPT handling, no give-back of an abandoned attempt. Its
// rate is what the two scripts leave any library on this client, so
// sluice's row against it is what the Mutex adds, and the reference's row
// against the peers is what the scripts cost (issue 33: the x1 gap). It
// takes part only in the uncontended lock workloads (rawLockWorkload): it
// never waits for a lock.
func init() {
	lockImpls = append(lockImpls, impl[locker]{
		name: "raw EVALSHA", kind: reference, only: rawLockWorkload,
		open: func(ctx context.Context, s *server, _ rate) (locker, func(), error) {
			client, cache, err := rawClient(ctx, s)
			if err != nil {
				return nil, nil, err
			}
			eval := func(ctx context.Context, sha string, keys, args []string) (int64, error) {
				return client.Do(ctx, client.B().Evalsha().Sha1(sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsInt64()
			}
			load := func(ctx context.Context, body string) error {
				return client.Do(ctx, client.B().ScriptLoad().Script(body).Build()).Error()
			}
			l, err := newRawLocker(ctx, cache, eval, load)
			if err != nil {
				client.Close()
				return nil, nil, err
			}
			return l, client.Close, nil
		},
	})
}

// rawLockWorkload reports whether the raw lock reference takes part in
// the workload called name.
func rawLockWorkload(name string) bool { return strings.HasPrefix(name, "lock.uncontended.") }

// rawLocker makes rawMutexes that call the scripts through eval.
type rawLocker struct {
	eval           func(ctx context.Context, sha string, keys, args []string) (int64, error)
	lockSHA        string
	releaseSHA     string
	unlockMode     string // mutex_release's ARGV[1]: "u", or "U" to SPUBLISH
	id             string // starts the owner ids: random, so they differ from every other run's
	seq            atomic.Uint64
	prefix         string
	lease, keepFor string
}

// newRawLocker loads mutex_lock and mutex_release with load (the reference
// handles no NOSCRIPT) and returns a rawLocker on eval.
func newRawLocker(ctx context.Context, cache *sluice.Client, eval func(context.Context, string, []string, []string) (int64, error), load func(context.Context, string) error) (*rawLocker, error) {
	l := &rawLocker{eval: eval, unlockMode: "u", prefix: "sluice-bench:raw:", lease: "30000", keepFor: "1000"}
	if cache.ShardedPubSub() {
		l.unlockMode = "U"
	}
	for name, dst := range map[string]*string{"mutex_lock": &l.lockSHA, "mutex_release": &l.releaseSHA} {
		s, err := cache.Script(name)
		if err != nil {
			return nil, err
		}
		body, err := fs.ReadFile(lua.FS(), name+".lua")
		if err != nil {
			return nil, err
		}
		if err := load(ctx, string(body)); err != nil {
			return nil, fmt.Errorf("load %s: %w", name, err)
		}
		*dst = s.SHA1()
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	l.id = hex.EncodeToString(b[:]) + "."
	return l, nil
}

func (l *rawLocker) Mutex(name string) (mutex, error) {
	k := l.prefix + "{" + name + "}"
	return &rawMutex{
		l: l, owner: l.id + strconv.FormatUint(l.seq.Add(1), 36),
		lockKeys: []string{k, k + ":x", k + ":q"}, releaseKeys: []string{k, k + ":w"},
	}, nil
}

// rawMutex is one owner of one lock, for one goroutine.
type rawMutex struct {
	l                     *rawLocker
	owner                 string
	lockKeys, releaseKeys []string
	attempts              uint64
	token                 string // of the current hold
}

func (m *rawMutex) Lock(ctx context.Context) error {
	m.attempts++
	attempt := m.owner + "." + strconv.FormatUint(m.attempts, 10)
	token, err := m.l.eval(ctx, m.l.lockSHA, m.lockKeys, []string{m.l.lease, m.owner, attempt})
	if err != nil {
		return err
	}
	if token <= 0 {
		return fmt.Errorf("raw lock: refused (%d): the reference does not wait", token)
	}
	m.token = strconv.FormatInt(token, 10)
	return nil
}

func (m *rawMutex) Unlock(ctx context.Context) error {
	n, err := m.l.eval(ctx, m.l.releaseSHA, m.releaseKeys, []string{m.l.unlockMode, m.l.keepFor, m.owner, m.token})
	if err != nil {
		return err
	}
	if n != 0 {
		return fmt.Errorf("raw unlock: answered %d", n)
	}
	return nil
}
