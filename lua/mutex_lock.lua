-- mutex_lock: take a reentrant lease lock (an outermost Lock; a nested one
-- is mutex_nest).
--
-- The lock is one string, its record, so that a common call reads it with
-- one GET and writes it with one SET (with the lease as its expiry):
--
--   "L" k ":" f ":" c "|" n ":" a ":" o
--
-- k = flags (see below), f = fencing token of the current (or last)
-- acquisition, c = the run (see below); then the hold: n = holds, a = the
-- attempt that made the acquisition (see mutex_release), o = owner id. A
-- free lock's record ends at "|": an Unlock cuts the hold off, and a grant
-- appends one, so the common calls parse only what comes before it. o
-- comes last, as an owner id may hold any byte; the other fields never
-- hold ":" or "|". A value of the key that is not such a string (another
-- type, or a string written by someone else) is not a lock: every call on
-- it fails with WRONGTYPE and changes nothing, as calls on a key of another
-- type do (mutex_renew_batch answers -1 for it).
--
-- c is the run: the token where it starts, then the tokens of the holds in
-- it that ended otherwise than by their owner's Unlock (at most 16, oldest
-- first, separated by spaces). Every acquisition with a token from the
-- start up to (not including) f ended by its owner's Unlock unless c lists
-- it, and so did f's once o is gone unless c lists it. It lets a retried
-- Unlock tell that its first try succeeded however many hand-offs and
-- acquisitions came since (tokens only grow, and a client sends only a
-- token it was given), and a hold that ended otherwise that it did not:
-- whatever ends a hold that way lists its token. A new record starts a run
-- at its first acquisition (an expiry takes the whole record); an
-- outermost Lock that finds its own owner still there lists the earlier
-- acquisition (it ended without an Unlock); a give-back or ForceUnlock
-- lists the hold it ends (mutex_release). When a 17th would be listed, the
-- oldest goes and the run starts after it: the holds before are then told
-- they were lost. A grant on a free record carries c over unchanged.
--
-- k flags what the other keys may hold, so that the common calls need not
-- look at them: "q" the queue may have entries, "x" tombstones may exist.
-- It is set before the record could miss anything: a fair Lock that queues
-- sets q, a give-back that leaves a tombstone sets x, and a grant that
-- makes the record sets them from what the keys hold then (EXISTS).
-- Nothing else adds queue members or tombstones (a script that does must
-- set k too), and nothing clears a flag but mutex_release finding the
-- queue empty, so while the record lives, a missing flag means an empty
-- key. A flag may be set needlessly (a waiter left, tombstones expired):
-- that costs a look, never a wrong answer. An unfair Unlock sends only the
-- record and the channel: one that finds q asks for all the keys (see
-- mutex_release).
--
-- k's "w" says a Lock was refused while the record lived, so a waiter may
-- be subscribed to the wake-up channel: only then does a final Unlock
-- publish its wake-up (mutex_release). A refused Lock sets it before it
-- answers, in the same script, and a waiting Lock always makes one more
-- attempt once its subscription is confirmed, so a release after that
-- attempt sees w. Nothing clears it while the record lives (a waiter one
-- wake-up did not reach still waits on the next release); the record, and
-- w with it, ends only by expiry, once the lock has stayed free for the
-- keep time or a holder's lease ran out. A waiter sleeps no longer than
-- the lease it was refused under, so a holder's lease running out needs no
-- wake-up: a lease shortened later wakes the waiters (mutex_renew). But a
-- release wakes one waiter per process, and the others of that process
-- may sleep on an earlier holder's longer lease: the woken one's turn must
-- pass on even if the record it was refused on expires. So an unfair Lock
-- that waited (ARGV[4] "w") sets w on the record it takes, and its release
-- publishes. A key that is not there takes no w from a refusal: a Lock
-- refused then (a free lock whose fair queue has an earlier waiter) waits
-- for a hand-off, which always publishes.
--
-- An outermost Lock always starts a new acquisition with a new
-- token, even when the record still names this owner: the client declared
-- the previous hold lost (its loss margin passed before the server's
-- lease), a reply was lost, or another process took over with the same
-- owner id (WithOwner after a restart). Handing out the old token again
-- would let two writers present the same token. The one exception is an
-- attempt older than the one that made the current hold, from the same
-- Mutex value (attempt ids are "nonce.seq", seq increasing per value): it
-- was abandoned by its caller and arrives late; granting it would re-tag
-- the hold so that its give-back released the newer hold, so it is
-- refused. An attempt whose caller gave up before the reply is refused too
-- if its give-back (mutex_release "a") got here first and left a
-- tombstone: the give-back is sent at once, without waiting for the
-- attempt's reply, so the two can reach Redis in either order and neither
-- order leaves a grant nobody knows of.
--
-- A call that repeats the attempt id of the current hold (a hand-off from
-- mutex_release granted it to this waiting Lock, or a retry of a call whose
-- reply was lost) is told it holds the lock, with its token, and the lease
-- starts again from now. Its reply is a table {2, holds, token}, not a
-- token, so that the client can tell a hold handed over by a release from
-- one it took.
--
-- Fair Locks (ARGV[4] = "f") queue: a fair Lock takes a free lock only if
-- no live waiter is queued before it; otherwise it adds (or refreshes) its
-- entry, "expiry_ms owner", which dies a lease after its last refresh
-- unless the waiting Lock refreshes it. mutex_release hands the lock to the
-- first live entry. Up to 16 dead entries at the head are dropped per call;
-- if that many were dropped without reaching a live one, the call does not
-- take the lock (a live waiter may still be queued behind them) and answers
-- "try again now" (-3): the caller calls again at once, and each call
-- drops 16 more. Unfair Locks ignore the queue.
--
-- Fencing tokens are the server's TIME in microseconds, or one more than the
-- previous token if that is larger (it is kept briefly after a release), so
-- they increase across acquisitions without a counter key that lives forever.
-- TIME is read on every outermost acquisition, though "one more than the
-- stored token" would save a call: after a failover to a replica that missed
-- the last acquisitions, the stored token is stale, and only the clock keeps
-- the next token above those the lost acquisitions were given.
--
-- KEYS[1]  lock record
-- KEYS[2]  tombstones: abandoned attempt id -> 1
-- KEYS[3]  queue: sorted set of attempt ids by arrival
-- KEYS[4]  queue entries: attempt id -> "expiry_ms owner" (fair calls
--          only: an unfair Lock sends the first three)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id
-- ARGV[3]  attempt id "nonce.seq"
-- ARGV[4]  optional: "f" for a fair Lock, "t" for a fair TryLock (respects
--          the queue but does not join it), "w" for an unfair Lock's
--          attempt after it was refused (see w); none for any other
--
-- Returns  the new token (> 0) when the Lock took the lock (a new
--          acquisition, one hold);
--          {2, holds, token} when the owner already held it under this
--          attempt id;
--          -1 - W when another owner (or a newer attempt of the same Mutex)
--          holds it, W the remaining lease in ms, or the attempt was
--          abandoned (-1: W = 0 if the lock is free);
--          {0, -1, 0} when the holder's key has no expiry;
--          {0, -2, 0} when the lock is free but a fair waiter queued
--          earlier has the turn;
--          {0, -3, 0} when a fair call dropped 16 dead entries and must
--          try again at once (it is not queued).
-- Complexity: O(log Q) for Q queued waiters (O(1) unfair). An unfair Lock
--          of a lock whose record is there and flags neither q nor x (the
--          common case: a free lock released within the last second, no
--          fair waiters, no abandoned attempts) makes three calls: GET,
--          TIME, SET PX; onto no record, an EXISTS more. A refused Lock
--          is a GET and a PTTL, and a SET KEEPTTL the first time the
--          record refuses one.
local v = redis.call('GET', KEYS[1])
local k, f, r, s -- flags, token, where ":" c "|" starts and where it ends
local n, a, o -- the hold's fields; nil if the lock is free
if v then
  k, f = string.match(v, '^L(%l*):(%d+):')
  r = f and #k + #f + 3
  s = f and string.find(v, '|', r, true)
  if s and s < #v then
    n, a, o = string.match(v, '^(%d+):([^:]+):(.+)$', s + 1)
    s = o and s
  end
  if not s then
    return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
  end
end

local attempt, mode = ARGV[3], ARGV[4]
if string.find(attempt, ':', 1, true) then
  return redis.error_reply('mutex_lock: malformed attempt id')
end
local tombs, queued
if not f then
  -- No record: the keys themselves say what they hold, for the new
  -- record's flags.
  local e = redis.call('EXISTS', KEYS[2], KEYS[3])
  if e == 2 then
    tombs, queued = true, true
  elseif e == 1 then
    tombs = redis.call('EXISTS', KEYS[2]) == 1
    queued = not tombs
  end
  k = (queued and 'q' or '') .. (tombs and 'x' or '')
elseif k ~= '' then
  tombs, queued = string.find(k, 'x', 1, true), string.find(k, 'q', 1, true)
end
if tombs then
  if redis.call('HEXISTS', KEYS[2], attempt) == 1 then
    local wait = o and redis.call('PTTL', KEYS[1]) or 0
    return wait >= 0 and -1 - wait or {0, wait, 0} -- see refuse
  end
end
if o == ARGV[2] and a == attempt then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return {2, tonumber(n), tonumber(f)}
end
local fair = mode == 'f' or mode == 't'
local t -- TIME, read once, when first needed

-- Made only where they can be called: a closure costs allocations, and
-- the common call (free, unfair) needs none.
local refuse, waiting, enqueue
if o or fair then
  -- refuse answers a refusal with wait: the holder's remaining lease in
  -- ms (PTTL: -1 no expiry), 0 if the lock is free, or -2 (a fair waiter
  -- has the turn). The common answer is one integer, -1 - wait: a table
  -- costs the server more.
  refuse = function(wait)
    if wait >= 0 then
      return -1 - wait
    end
    return {0, wait, 0}
  end
  -- waiting marks the record: a waiter may subscribe (w), and a fair
  -- Lock's entry is queued (q, if queues). One write, none if both are
  -- there already.
  waiting = function(queues)
    if not f then
      return
    end
    local k2 = k
    if not string.find(k2, 'w', 1, true) then
      k2 = k2 .. 'w'
    end
    if queues and not queued then
      k2 = 'q' .. k2
    end
    if k2 ~= k then
      redis.call('SET', KEYS[1], 'L' .. k2 .. string.sub(v, #k + 2), 'KEEPTTL')
    end
  end
  -- enqueue refuses this call with wait, and queues a fair Lock.
  enqueue = function(wait)
    if mode == 'f' then
      if not redis.call('ZSCORE', KEYS[3], attempt) then
        local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
        redis.call('ZADD', KEYS[3], (tonumber(last) or 0) + 1, attempt)
      end
      t = t or redis.call('TIME')
      local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
      redis.call('HSET', KEYS[4], attempt, string.format('%d', expiry) .. ' ' .. ARGV[2])
      -- The queue keys live as long as their longest-lived entry: a
      -- waiter with a shorter lease (WithLease) must not cut them short.
      local lease = tonumber(ARGV[1])
      if redis.call('PTTL', KEYS[3]) < lease then
        redis.call('PEXPIRE', KEYS[3], ARGV[1])
      end
      if redis.call('PTTL', KEYS[4]) < lease then
        redis.call('PEXPIRE', KEYS[4], ARGV[1])
      end
    end
    waiting(mode == 'f')
    return refuse(wait)
  end
end

if o and o ~= ARGV[2] then
  return enqueue(redis.call('PTTL', KEYS[1]))
end
if o then
  -- Ours, under another attempt: refused if this one is older, from the
  -- same Mutex value.
  local hn, hs = string.match(a, '^(.*)%.(%d+)$')
  local an, as = string.match(attempt, '^(.*)%.(%d+)$')
  if not an then
    return redis.error_reply('mutex_lock: malformed attempt id')
  end
  if hn == an and tonumber(as) < tonumber(hs) then
    waiting(false)
    return refuse(redis.call('PTTL', KEYS[1]))
  end
end
if fair and queued then
  -- The lock is free (or ours from an earlier, lost acquisition): take it
  -- only if no live waiter is queued before this one. The queue is read
  -- before anything is removed, and each key is written once, last: while
  -- the slot migrates, a script may not touch again a key it emptied.
  local head = redis.call('ZRANGE', KEYS[3], 0, 16)
  local gone = {} -- dead entries before this one, then this one
  local verdict -- nil: take the lock; else the reply once gone is removed
  if #head > 0 and head[1] ~= attempt then
    local e = redis.call('HMGET', KEYS[4], unpack(head))
    t = t or redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    for i = 1, #head do
      if head[i] == attempt then
        break
      end
      local expiry = e[i] and tonumber(string.match(e[i], '^(%d+)'))
      if expiry and expiry > now then
        verdict = -2 -- free, but not this waiter's turn
        break
      end
      if #gone == 16 then
        verdict = -3
        break
      end
      gone[#gone + 1] = head[i]
    end
  end
  if not verdict then
    gone[#gone + 1] = attempt
  end
  if #gone > 0 then
    redis.call('ZREM', KEYS[3], unpack(gone))
    redis.call('HDEL', KEYS[4], unpack(gone))
  end
  if verdict == -2 then
    return enqueue(-2)
  elseif verdict then
    return {0, verdict, 0} -- -3: try again at once
  end
end

t = t or redis.call('TIME')
local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
if f and tonumber(f) >= token then
  token = tonumber(f) + 1
end
local ft = string.format('%d', token)
local run -- ":" c "|", c the run
if not f then
  run = ':' .. ft .. '|' -- a new record starts a run
elseif o then
  -- This owner's earlier acquisition, superseded, ended otherwise: c
  -- lists its token (as mutex_release does for a give-back).
  local l = {}
  for x in string.gmatch(string.sub(v, r + 1, s - 1), '%d+') do
    l[#l + 1] = x
  end
  if #l == 0 then
    l[1] = string.format('%d', tonumber(f) + 1)
  else
    l[#l + 1] = f
    if #l > 17 then
      l[1] = string.format('%d', tonumber(table.remove(l, 2)) + 1)
    end
  end
  run = ':' .. table.concat(l, ' ') .. '|'
else
  run = string.sub(v, r, s)
end
if mode == 'w' and not string.find(k, 'w', 1, true) then
  k = k .. 'w' -- a Lock that waited passes its wake-up on
end
redis.call('SET', KEYS[1], 'L' .. k .. ':' .. ft .. run .. '1:' .. attempt .. ':' .. ARGV[2], 'PX', ARGV[1])
return token
