// Package mutexlin_test checks histories of the mutex package's fair and
// read-write locks, recorded on a real server, against sequential models
// (porcupine). It lives in the harness module so that porcupine is not a
// requirement of the core module.
package mutexlin_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/mutex"
	"github.com/sluicekit/sluice/scriptcache"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func newMutex(t testing.TB, l *mutex.Locker, name string, opts ...mutex.LockOption) *mutex.Mutex {
	t.Helper()
	m, err := l.NewMutex(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// signal bounds waits for things that must happen; generous for a loaded
// machine.
const signal = 10 * time.Second

type target struct {
	name  string
	addrs func(t *testing.T) []string
}

var realTargets = []target{
	{"single", func(t *testing.T) []string { return []string{redistest.Single(t).Addr()} }},
	{"cluster", func(t *testing.T) []string { return redistest.SharedCluster(t).Addrs() }},
}

// lockKey is the Redis key of the lock name under the default prefix.
func lockKey(name string) string { return mutex.DefaultPrefix + "{" + name + "}" }

func newRW(t testing.TB, l *mutex.Locker, name string, opts ...mutex.LockOption) *mutex.RWMutex {
	t.Helper()
	rw, err := l.NewRWMutex(name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return rw
}

func newLocker(t testing.TB, client rueidis.Client, opts mutex.Options) *mutex.Locker {
	t.Helper()
	sc, err := scriptcache.New(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	l, err := mutex.NewLocker(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

func newMulti(t testing.TB, l *mutex.Locker, names []string, opts ...mutex.LockOption) *mutex.MultiMutex {
	t.Helper()
	mm, err := l.NewMultiMutex(names, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mm
}
