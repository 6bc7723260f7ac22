package scriptcache_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/fstest"
	"time"

	"github.com/sluicekit/sluice/internal/keyspace"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// TestHashTagEdgeCases: Exec's slot check and rueidis's cluster
// command builders must agree on every key, or a pair the check lets
// through panics in rueidis ("multi key command with different key slots
// are not allowed"). Keys made of braces and two letters hit every hash
// tag rule: empty tags ("{}"), unterminated ones, several tags, a tag at
// the end. Pairs the check accepts run on all three paths (the pipelined
// call, the lone call on a dedicated connection, EVALSHA+WAIT) without a
// panic and return their keys; pairs it refuses get ErrCrossSlot.
func TestHashTagEdgeCases(t *testing.T) {
	ctx := context.Background()
	sc, err := scriptcache.New(ctx, redistest.Client(t, redistest.SharedCluster(t).Addrs()...), scriptcache.WithFS(keysFS))
	if err != nil {
		t.Fatal(err)
	}
	s, err := sc.Script("keys")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "{}ab"
	randKey := func() string {
		b := make([]byte, rng.IntN(7))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	// Same-slot pairs of different keys, and some cross-slot ones.
	bySlot := map[uint16][]string{}
	for range 3000 {
		k := randKey()
		bySlot[keyspace.Slot(k)] = append(bySlot[keyspace.Slot(k)], k)
	}
	var same, cross [][2]string
	for _, ks := range bySlot {
		for i := 1; i < len(ks) && len(same) < 120; i++ {
			if ks[i] != ks[0] {
				same = append(same, [2]string{ks[0], ks[i]})
			}
		}
	}
	for a := range bySlot {
		for b := range bySlot {
			if a != b && len(cross) < 30 {
				cross = append(cross, [2]string{bySlot[a][0], bySlot[b][0]})
			}
		}
	}
	if len(same) < 50 {
		t.Fatalf("only %d same-slot pairs generated", len(same))
	}

	run := func(name string, pair [2]string, call func([]string) (scriptcache.Reply, error)) {
		t.Helper()
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("%s %q: panic: %v", name, pair, p)
			}
		}()
		keys := pair[:]
		r, err := call(keys)
		if keyspace.Slot(pair[0]) != keyspace.Slot(pair[1]) {
			if !errors.Is(err, scriptcache.ErrCrossSlot) {
				t.Errorf("%s %q: err %v, want ErrCrossSlot", name, pair, err)
			}
			return
		}
		if err != nil {
			t.Errorf("%s %q: %v", name, pair, err)
			return
		}
		got, err := r.ToString()
		if want := fmt.Sprintf("%s|%s", pair[0], pair[1]); err != nil || got != want {
			t.Errorf("%s %q: reply %q, %v; want %q", name, pair, got, err, want)
		}
	}
	for _, pair := range append(same, cross...) {
		run("pipelined", pair, func(keys []string) (scriptcache.Reply, error) {
			r := s.Exec(ctx, keys, nil)
			return r, r.Error()
		})
		run("lone", pair, func(keys []string) (scriptcache.Reply, error) {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			r := s.Exec(dctx, keys, nil)
			return r, r.Error()
		})
		run("wait", pair, func(keys []string) (scriptcache.Reply, error) {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			r, _, err := s.ExecWait(dctx, keys, nil, 0, time.Millisecond)
			return r, err
		})
	}
}

// keysFS holds a script that returns its keys joined, touching none.
var keysFS = fstest.MapFS{
	"keys.lua": {Data: []byte("-- keys: KEYS[1] .. '|' .. KEYS[2]\nreturn KEYS[1] .. '|' .. KEYS[2]\n")},
}

// TestClientEvalCrossSlot: Cache.Client() is exported, and the
// Client contract says implementations report replies, an error reply from
// the server as a server error: a cross-slot call on a cluster must come
// back as an error (ErrCrossSlot, or the server's CROSSSLOT), not panic in
// rueidis's cluster builder.
func TestClientEvalCrossSlot(t *testing.T) {
	ctx := context.Background()
	sc, err := scriptcache.New(ctx, redistest.Client(t, redistest.SharedCluster(t).Addrs()...), scriptcache.WithFS(keysFS))
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"{a}x", "{b}x"}
	calls := map[string]func() error{
		"Eval": func() error { return sc.Client().Eval(ctx, "", "return 1", keys, nil).Error() },
		"EvalWait": func() error {
			_, _, err := sc.Client().EvalWait(ctx, "", "return 1", keys, nil, 0, time.Millisecond)
			return err
		},
	}
	for name, call := range calls {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("Client().%s with keys of two slots panics: %v", name, p)
				}
			}()
			if err := call(); err == nil {
				t.Errorf("Client().%s with keys of two slots succeeded", name)
			}
		}()
	}
}
