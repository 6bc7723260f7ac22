package chaos

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"io/fs"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluicekit/sluice/lua"
)

// Script errors: a lock or semaphore script that fails as a program (a
// Lua runtime error, "ERR user_script:...", or an error Redis raised for a
// call the script made wrongly, "ERR ... script: ..., on @user_script:N")
// is a bug whatever its caller does with the error. Most of the scripts'
// calls are the library's own, in the background: the watchdog's batched
// renewals, the fair queues' entry refreshes, give-backs of abandoned
// attempts. There the library only retries, and the hold or entry runs out
// a lease later, which faults explain away more often than not (a renewal
// of a read hold that always fails loses only the reads held past a
// lease). So every script reply of the nodes' clients (Config.Client's
// default, rueidis) is looked at as it comes, and an error of a script
// that ran as a program is a violation, both ways: the calls it can come
// from are every call of the run, whoever made them.
//
// What may make a correct script fail so is data the library did not
// write: an operator's SET of a key to a string (the wrongtype fault, the
// probe of a batch renewal's neighbour) leaves a string where a hash was,
// or a string that is no lock record where one was; the scripts answer
// WRONGTYPE (which this check does not count) or parse it, and a script
// that trips over it is not at fault. Such a resource is excused for the
// whole run (foreign). Rate limiter keys are left out: their scripts run
// on counters the limits workload overwrites with strings on purpose, and
// the exact model judges every error they answer.
type scriptErrLog struct {
	mu      sync.Mutex
	errs    []scriptErr
	foreign map[string]bool // resources (hash tags) whose keys held data the library did not write
	names   map[string]string
}

// A scriptErr is one script call that answered a program's error.
type scriptErr struct {
	at     time.Time
	tag    string // the resource: the hash tag of the call's first key
	script string // the script's name (or its SHA-1)
	msg    string
}

func newScriptErrLog() *scriptErrLog {
	l := &scriptErrLog{foreign: map[string]bool{}, names: map[string]string{}}
	// The scripts' names by SHA-1, for the report (the mutation runner's
	// scripts too: lua.FS reads them).
	fsys := lua.FS()
	ents, _ := fs.ReadDir(fsys, ".")
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".lua") {
			continue
		}
		b, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			continue
		}
		sum := sha1.Sum(b)
		l.names[hex.EncodeToString(sum[:])] = strings.TrimSuffix(e.Name(), ".lua")
	}
	return l
}

// foreignData records that res's keys hold (or are about to hold) data the
// library did not write.
func (l *scriptErrLog) foreignData(res string) {
	l.mu.Lock()
	l.foreign[res] = true
	l.mu.Unlock()
}

// scriptCall is what the check needs of a command: the resource and
// script of a lock or semaphore script call, read before the command is
// sent (rueidis recycles a command once it is done). ok is false for any
// other command.
type scriptCall struct {
	tag, script string
	ok          bool
}

func scriptCallOf(cmd rueidis.Completed) scriptCall {
	cs := cmd.Commands()
	if len(cs) < 4 || cs[2] == "0" {
		return scriptCall{}
	}
	name := strings.ToUpper(cs[0])
	if name != "EVALSHA" && name != "EVAL" {
		return scriptCall{}
	}
	key := cs[3]
	if !strings.HasPrefix(key, "sluice:mutex:") && !strings.HasPrefix(key, "sluice:sem:") {
		return scriptCall{}
	}
	tag := key
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j >= 0 {
			tag = key[i+1 : i+1+j]
		}
	}
	script := cs[1]
	if name == "EVAL" {
		sum := sha1.Sum([]byte(cs[1]))
		script = hex.EncodeToString(sum[:])
	}
	// Copies: the command's strings may be reused once it is done.
	return scriptCall{tag: strings.Clone(tag), script: strings.Clone(script), ok: true}
}

// programError reports whether err is a Redis error of a script that ran as
// a program: a Lua runtime error, or a call the script made wrongly. Redis
// marks every error raised inside a script with "@user_script:N"; those
// with a code of their own (WRONGTYPE, NOSCRIPT, NOPERM, OOM, READONLY,
// BUSY...: the state of the server or of the data) are not the script's.
// The rest have the generic code, which rueidis drops from the message:
// "user_script:12: attempt to compare ...", "Lua redis lib command
// arguments must be ...".
func programError(err error) (string, bool) {
	re, ok := rueidis.IsRedisErr(err)
	if !ok || re == nil {
		return "", false
	}
	msg := re.Error()
	return msg, programMessage(msg)
}

// programMessage is programError's judgement of a Redis error's message.
func programMessage(msg string) bool {
	if !strings.Contains(msg, "@user_script:") {
		return false
	}
	code, _, _ := strings.Cut(msg, " ")
	if code != "ERR" && allCaps(code) {
		return false // a code of its own
	}
	// Redis 6 wraps a redis.call's error in "ERR Error running script
	// ... @user_script:N: CODE ...": the code inside decides.
	if _, inner, ok := strings.Cut(msg, "@user_script:"); ok {
		if _, rest, ok := strings.Cut(inner, ": "); ok {
			if c, _, _ := strings.Cut(rest, " "); c != "ERR" && allCaps(c) {
				return false
			}
		}
	}
	return true
}

// allCaps reports whether s is an error code: capital letters only.
func allCaps(s string) bool {
	return s != "" && strings.Trim(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") == ""
}

func (l *scriptErrLog) see(c scriptCall, res rueidis.RedisResult) {
	if !c.ok {
		return
	}
	msg, bad := programError(res.Error())
	if !bad {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) < 1000 {
		l.errs = append(l.errs, scriptErr{at: time.Now(), tag: c.tag, script: c.script, msg: msg})
	}
}

// check reports, once the run is over, each script that failed as a
// program on a resource whose keys only the library wrote.
func (l *scriptErrLog) check(h *history) {
	l.mu.Lock()
	defer l.mu.Unlock()
	type key struct{ script, tag string }
	first := map[key]scriptErr{}
	count := map[key]int{}
	for _, e := range l.errs {
		if l.foreign[e.tag] {
			continue
		}
		k := key{e.script, e.tag}
		if _, ok := first[k]; !ok {
			first[k] = e
		}
		count[k]++
	}
	keys := make([]key, 0, len(first))
	for k := range first {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return first[keys[i]].at.Before(first[keys[j]].at) })
	for _, k := range keys {
		e := first[k]
		name := l.names[e.script]
		if name == "" {
			name = e.script
		}
		h.violation("script error: %s failed as a program on %q, first at %s (%d times), with no data but the library's in its keys: %s",
			name, e.tag, h.since(e.at), count[k], clipMsg(e.msg, 160))
	}
}

// checkedClient is a rueidis client whose script replies the run's
// scriptErrLog sees.
type checkedClient struct {
	rueidis.Client
	log *scriptErrLog
}

func (c checkedClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	sc := scriptCallOf(cmd)
	res := c.Client.Do(ctx, cmd)
	c.log.see(sc, res)
	return res
}

func (c checkedClient) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	scs := make([]scriptCall, len(multi))
	for i, cmd := range multi {
		scs[i] = scriptCallOf(cmd)
	}
	res := c.Client.DoMulti(ctx, multi...)
	for i := range res {
		if i < len(scs) {
			c.log.see(scs[i], res[i])
		}
	}
	return res
}

// clipMsg cuts s to at most n bytes, marking the cut.
func clipMsg(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
