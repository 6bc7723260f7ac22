package scriptcache_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicekit/sluice/scriptcache"
)

// forgetful is a Client whose server never keeps a script: every EVALSHA
// answers NOSCRIPT however often the script is loaded, as when the cache
// is flushed again between each load and its retry. Only EVAL with the
// body runs, answering the body's length.
type forgetful struct {
	mu     sync.Mutex
	loads  int
	bodies []string // bodies sent with EVAL
}

func (*forgetful) Cluster() bool { return false }

func (f *forgetful) Eval(_ context.Context, sha, body string, _, _ []string) scriptcache.Reply {
	if sha != "" {
		return scriptcache.NewReply(nil, errors.New("NOSCRIPT No matching script. Please use EVAL."), true)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bodies = append(f.bodies, body)
	return scriptcache.NewReply(int64(len(body)), nil, false)
}

func (f *forgetful) EvalWait(ctx context.Context, sha, body string, keys, args []string, _ int64, _ time.Duration) (scriptcache.Reply, int64, error) {
	r := f.Eval(ctx, sha, body, keys, args)
	return r, 0, r.Error()
}

func (f *forgetful) LoadScripts(context.Context, ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loads++
	return nil
}

func (*forgetful) Subscribe(ctx context.Context, _ string, _ bool, _ func(), _ func(string)) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestNoScriptTwiceFallsBackToEval: when the retry after a reload gets
// NOSCRIPT again (flushed once more in between), Exec and ExecWait send
// EVAL with the script's body and return its reply: the caller never sees
// NOSCRIPT. An outside mutant that returned the second NOSCRIPT, or sent
// the last call by digest again, escaped every other test.
func TestNoScriptTwiceFallsBackToEval(t *testing.T) {
	ctx := context.Background()
	body := string(testFS["incr.lua"].Data)
	for _, tc := range []struct {
		name string
		exec func(s *scriptcache.Script) (int64, error)
	}{
		{"Exec", func(s *scriptcache.Script) (int64, error) {
			return s.Exec(ctx, []string{"k"}, nil).AsInt64()
		}},
		{"ExecWait", func(s *scriptcache.Script) (int64, error) {
			r, _, err := s.ExecWait(ctx, []string{"k"}, nil, 0, time.Millisecond)
			if err != nil {
				return 0, err
			}
			return r.AsInt64()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &forgetful{}
			sc, err := scriptcache.NewFrom(ctx, f, scriptcache.WithFS(testFS))
			if err != nil {
				t.Fatal(err)
			}
			s, err := sc.Script("incr")
			if err != nil {
				t.Fatal(err)
			}
			n, err := tc.exec(s)
			if err != nil {
				t.Fatalf("%s = %v after NOSCRIPT twice, want the EVAL's reply", tc.name, err)
			}
			if n != int64(len(body)) {
				t.Errorf("%s = %d, want %d (the reply to EVAL of the script's body)", tc.name, n, len(body))
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if len(f.bodies) != 1 || f.bodies[0] != body {
				t.Errorf("EVAL sent with bodies %q, want the script's body once", f.bodies)
			}
			if f.loads != 2 {
				t.Errorf("%d SCRIPT LOADs, want 2 (New's and the reload after the first NOSCRIPT)", f.loads)
			}
		})
	}
}
