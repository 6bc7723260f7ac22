// Package stopclock runs the library's scripts on a miniredis whose clock
// stands still, for tests of the scripts' bounds with now. On a real
// server a test cannot choose the millisecond (or microsecond) a script
// reads from TIME, so a comparison with now can only be checked away from
// its bound; with the clock stopped, a state can be put exactly on it, and
// one unit either side. miniredis runs Lua in an emulator: such a test is
// about a script's own arithmetic and branches, and the same scripts'
// behaviour against real servers is checked elsewhere.
package stopclock

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
	"github.com/sluicekit/sluice/internal/testkit/redistest"
	"github.com/sluicekit/sluice/scriptcache"
)

// A Rig is a miniredis whose clock stands at the time given to New, a
// client of it and the library's scripts loaded into it.
type Rig struct {
	MR      *miniredis.Miniredis
	Client  rueidis.Client
	Scripts *scriptcache.Cache
}

// New starts a Rig whose clock stands at at; t's cleanup stops it.
func New(t testing.TB, at time.Time) *Rig {
	t.Helper()
	mr := miniredis.RunT(t)
	mr.SetTime(at)
	client := redistest.Client(t, mr.Addr())
	sc, err := scriptcache.New(context.Background(), client)
	if err != nil {
		t.Fatal(err)
	}
	return &Rig{MR: mr, Client: client, Scripts: sc}
}

// Do runs one command of a state's setup: cmd[0] on the key cmd[1] with
// the arguments after it.
func (r *Rig) Do(t testing.TB, cmd ...string) {
	t.Helper()
	c := r.Client
	if err := c.Do(context.Background(), c.B().Arbitrary(cmd[0]).Keys(cmd[1]).Args(cmd[2:]...).Build()).Error(); err != nil {
		t.Fatalf("%q: %v", cmd, err)
	}
}

// Exec runs the script name and returns its reply as text: an integer, or
// a list of integers and strings as fmt prints a slice of them.
func (r *Rig) Exec(t testing.TB, name string, keys, args []string) string {
	t.Helper()
	s, err := r.Scripts.Script(name)
	if err != nil {
		t.Fatal(err)
	}
	reply := s.Exec(context.Background(), keys, args)
	if err := reply.Error(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if v, err := reply.AsInt64(); err == nil {
		return strconv.FormatInt(v, 10)
	}
	a, err := reply.ToArray()
	if err != nil {
		t.Fatalf("%s: reply neither an integer nor a list: %v", name, err)
	}
	vs := make([]string, a.Len())
	for i := range vs {
		if n, err := a.At(i).AsInt64(); err == nil {
			vs[i] = strconv.FormatInt(n, 10)
		} else if vs[i], err = a.At(i).ToString(); err != nil {
			t.Fatalf("%s: element %d neither an integer nor a string: %v", name, i, err)
		}
	}
	return "[" + strings.Join(vs, " ") + "]"
}
