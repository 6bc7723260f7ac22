package chaos

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicekit/sluice/internal/keyspace"
)

// The poller reads, every pollEvery, what Redis holds for each lane
// resource (lanes.go): the lock's owner, a read-write lock's writer,
// readers and writer-waiting mark, a semaphore's live weight, and the
// first 32 entries of a fair queue with their expiries. It reads the keys
// the package docs list, through a client of its own with no fault proxy,
// in one read-only script per resource so that each view is one instant
// of the server. The oracles that need the server's side of a promise
// read these views: whether a waiter was due (anytime.go), the order of a
// fair queue (fifo.go), a writer's mark (starvation.go).
const pollEvery = 10 * time.Millisecond

// pollGap is the longest gap between two views that still counts as
// continuous: across a longer one (the server or this process stopped)
// nothing is known of the state in between.
const pollGap = 100 * time.Millisecond

type pollKind int

const (
	pollMutex pollKind = iota
	pollRW
	pollSem
)

// A snap is one view of a resource: taken at the server's now (ms), some
// time in [call, ret] by this process's clock.
type snap struct {
	round     int // the poller's round: views of one round are taken together
	call, ret time.Time
	now       int64
	owner     string  // mutex: the holder's owner id; rw: the live writer's
	token     int64   // mutex: the token stored in the hash
	readers   int64   // rw: live read acquisitions
	mark      int64   // rw: the writer-waiting mark's end (server ms), 0 if none
	used      int64   // semaphore: weight of the live permits
	queue     []entry // fair queue, in arrival order (first 32)
	// rw: the end of the latest mark a waiting writer's Lock keeps in the
	// marks' set (server ms), 0 if none runs; -1 if not read. The hash's
	// mark is the latest of them (rwmutex_lock): one past them all has
	// no writer behind it.
	ownMark int64
}

// An entry is one fair waiter in a queue.
type entry struct {
	id     string // attempt id (mutex) or permit id (semaphore)
	owner  string // mutex: owner id; semaphore: the label of the permit id
	expiry int64  // server ms: the entry is dead from then on
	weight int64
}

// live reports whether e was alive at the view's instant.
func (s snap) live(e entry) bool { return e.expiry > s.now }

// liveQueue returns the entries of the queue live in s, in queue order.
func (s snap) liveQueue() []entry {
	var live []entry
	for _, e := range s.queue {
		if s.live(e) {
			live = append(live, e)
		}
	}
	return live
}

// head returns the first live entry of the queue.
func (s snap) head() (entry, bool) {
	for _, e := range s.queue {
		if s.live(e) {
			return e, true
		}
	}
	return entry{}, false
}

// at is the view's time by this process's clock, the middle of its call.
func (s snap) at() time.Time { return s.call.Add(s.ret.Sub(s.call) / 2) }

var (
	pollMutexScript = rueidis.NewLuaScriptReadOnly(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {tostring(now), '', '0'}
local v = redis.pcall('GET', KEYS[1]) -- the lock's record (see lua/mutex_lock.lua)
if type(v) == 'string' then
  local k, f = string.match(v, '^L(%l*):(%d+):')
  if f then
    local s = string.find(v, '|', #k + #f + 3, true)
    out[2], out[3] = s and string.match(v, '^%d+:[^:]+:(.+)$', s + 1) or '', f
  end
end
local q = redis.pcall('ZRANGE', KEYS[2], 0, 31)
if not q.err then
  for _, id in ipairs(q) do
    local e = redis.pcall('HGET', KEYS[3], id)
    if type(e) ~= 'string' then e = '' end
    out[#out + 1] = id
    out[#out + 1] = e
  end
end
return out`)
	pollRWScript = rueidis.NewLuaScriptReadOnly(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {tostring(now), '', '0', '0'}
local h = redis.pcall('HMGET', KEYS[1], 'o', 'e', 'q')
if not h.err then
  if h[1] and (tonumber(h[2]) or 0) > now then out[2] = h[1] end
  out[4] = h[3] or '0'
end
local n = redis.pcall('ZCOUNT', KEYS[2], '(' .. now, '+inf')
if type(n) == 'number' then out[3] = tostring(n) end
local m = redis.pcall('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
if not m.err then
  out[5] = '0'
  if m[2] and tonumber(m[2]) > now then out[5] = m[2] end
end
return out`)
	pollSemScript = rueidis.NewLuaScriptReadOnly(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local used = 0
local ids = redis.pcall('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')
local cap = redis.pcall('HGET', KEYS[1], ':cap')
if not ids.err and type(cap) == 'string' then
  for _, id in ipairs(ids) do
    local w = redis.pcall('HGET', KEYS[1], id)
    used = used + (tonumber(w) or 1)
  end
end
local out = {tostring(now), tostring(used)}
local q = redis.pcall('ZRANGE', KEYS[3], 0, 31)
if not q.err then
  for _, id in ipairs(q) do
    local e = redis.pcall('HGET', KEYS[4], id)
    if type(e) ~= 'string' then e = '' end
    out[#out + 1] = id
    out[#out + 1] = e
  end
end
return out`)
)

// A polled resource and its views.
type polled struct {
	name  string
	kind  pollKind
	keys  []string
	mu    sync.Mutex
	snaps []snap
}

func newPolled(name string, kind pollKind) *polled {
	p := &polled{name: name, kind: kind}
	switch kind {
	case pollMutex:
		for _, s := range []string{"", ":q", ":e"} {
			p.keys = append(p.keys, keyspace.Key("sluice:mutex:", name, s))
		}
	case pollRW:
		for _, s := range []string{":rw.h", ":rw.z", ":rw.m"} {
			p.keys = append(p.keys, keyspace.Key("sluice:mutex:", name, s))
		}
	case pollSem:
		for _, s := range []string{"", ":e", ":q", ":qe"} {
			p.keys = append(p.keys, keyspace.Key("sluice:sem:", name, s))
		}
	}
	return p
}

func (p *polled) script() *rueidis.Lua {
	switch p.kind {
	case pollRW:
		return pollRWScript
	case pollSem:
		return pollSemScript
	}
	return pollMutexScript
}

// parse turns a script's reply into a view.
func (p *polled) parse(vals []string, call, ret time.Time) (snap, bool) {
	s := snap{call: call, ret: ret}
	num := func(v string) int64 { n, _ := strconv.ParseInt(v, 10, 64); return n }
	if len(vals) < 2 {
		return s, false
	}
	s.now = num(vals[0])
	rest := vals[2:]
	switch p.kind {
	case pollMutex:
		if len(vals) < 3 {
			return s, false
		}
		s.owner, s.token, rest = vals[1], num(vals[2]), vals[3:]
	case pollRW:
		if len(vals) < 4 {
			return s, false
		}
		s.owner, s.readers, s.mark, s.ownMark = vals[1], num(vals[2]), num(vals[3]), -1
		if len(vals) > 4 {
			s.ownMark = num(vals[4])
		}
		return s, true
	case pollSem:
		s.used = num(vals[1])
	}
	for i := 0; i+1 < len(rest); i += 2 {
		e := entry{id: rest[i]}
		f := strings.Fields(rest[i+1]) // "expiry owner" or "expiry weight"
		if len(f) == 2 {
			e.expiry = num(f[0])
			if p.kind == pollSem {
				e.weight = num(f[1])
				if j := strings.IndexByte(e.id, '/'); j >= 0 {
					e.owner = e.id[j+1:]
				}
			} else {
				e.owner = f[1]
			}
		}
		s.queue = append(s.queue, e)
	}
	return s, true
}

// poller reads every lane resource until ctx ends.
type poller struct {
	rounds int
	client rueidis.Client
	res    map[string]*polled
	order  []*polled
}

func (w *world) newPoller() (*poller, error) {
	// No retries: rueidis resends a read-only call that met a network
	// error for as long as its context lasts, and these have no end (a
	// server that does not come back would hold the poller for ever). A
	// view that fails is a view missed.
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: w.addrs(), DisableCache: true, DisableRetry: true, Dialer: dialer()})
	if err != nil {
		return nil, err
	}
	return &poller{client: c, res: map[string]*polled{}}, nil
}

// addrs are the addresses of the run's servers, with no proxy.
func (w *world) addrs() []string {
	var out []string
	for _, s := range w.servers() {
		out = append(out, s.Addr())
	}
	return out
}

func (pl *poller) add(name string, kind pollKind) {
	p := newPolled(name, kind)
	pl.res[name] = p
	pl.order = append(pl.order, p)
}

func (pl *poller) run(ctx context.Context) {
	for ctx.Err() == nil {
		pl.once()
		sleep(ctx, pollEvery)
	}
}

func (pl *poller) once() {
	// Concurrent calls, which rueidis pipelines: one round trip a round.
	// (Lua.ExecMulti would send SCRIPT LOAD to every node each time.) No
	// deadline: rueidis recycles a call's command when the call returns,
	// and one that returned at its deadline may still be being written (a
	// data race); a round waits out a stopped server instead.
	pl.rounds++
	round := pl.rounds
	var wg sync.WaitGroup
	for _, p := range pl.order {
		wg.Go(func() {
			call := time.Now()
			vals, err := p.script().Exec(context.Background(), pl.client, p.keys, nil).AsStrSlice()
			ret := time.Now()
			if err != nil {
				return
			}
			if s, ok := p.parse(vals, call, ret); ok {
				s.round = round
				p.mu.Lock()
				p.snaps = append(p.snaps, s)
				p.mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// views returns the views of res, in order of their calls.
func (pl *poller) views(res string) []snap {
	p := pl.res[res]
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.snaps
}

// between returns the views of res whose calls lie in [from, to].
func between(views []snap, from, to time.Time) []snap {
	i := searchSnaps(views, from)
	j := searchSnaps(views, to.Add(time.Nanosecond))
	return views[i:j]
}

// searchSnaps returns the index of the first view called at or after t.
func searchSnaps(views []snap, t time.Time) int {
	lo, hi := 0, len(views)
	for lo < hi {
		m := (lo + hi) / 2
		if views[m].call.Before(t) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}
