-- mutex_lock: take, or re-enter, a reentrant lease lock.
--
-- The lock is a hash: o = owner id, n = holds, f = fencing token of the
-- current acquisition, a = the attempt that made it (see mutex_release),
-- and c = the run: the token where it starts, then the tokens of the holds
-- in it that ended otherwise than by their owner's Unlock (at most 16,
-- oldest first, separated by spaces). Every acquisition with a token from
-- the start up to (not including) f ended by its owner's Unlock unless c
-- lists it, and so did f's once o is gone unless c lists it. A hash without
-- o is free.
--
-- c lets a retried Unlock tell that its first try succeeded however many
-- hand-offs and acquisitions came since (tokens only grow, and a client
-- sends only a token it was given), and a hold that ended otherwise that
-- it did not: whatever ends a hold that way lists its token. A new hash
-- starts a run at its first acquisition (an expiry takes the whole hash);
-- an outermost Lock that finds its own owner still there lists the
-- earlier acquisition (it ended without an Unlock); a give-back or
-- ForceUnlock lists the hold it ends (mutex_release). When a 17th would be
-- listed, the oldest goes and the run starts after it: the holds before
-- are then told they were lost. Listing costs a read of c, on those rare
-- paths only.
--
-- k flags what the other keys may hold, so that the common calls need not
-- look at them: "q" the queue may have entries, "x" tombstones may exist
-- (both: "qx"). It is set before the hash could miss anything: a fair Lock
-- that queues sets q, a give-back that leaves a tombstone sets x, and a
-- grant that makes the hash sets them from what the keys hold then (f is
-- set whenever the hash is made, so without f the keys themselves are
-- asked). Nothing else adds queue members or tombstones (a script that
-- does must set k too), and nothing clears a flag but mutex_release
-- finding the queue empty, so while the hash lives, a missing flag means
-- an empty key. A flag may be set needlessly (a waiter left, tombstones
-- expired): that costs a look, never a wrong answer.
--
-- w = "1" says a Lock was refused while the hash lived, so a waiter may be
-- subscribed to the wake-up channel: only then does a final Unlock publish
-- its wake-up (mutex_release). A refused Lock sets it before it answers,
-- in the same script, and a waiting Lock always makes one more attempt
-- once its subscription is confirmed, so a release after that attempt sees
-- w. Nothing clears it while the hash lives (a waiter one wake-up did not
-- reach still waits on the next release); the hash, and w with it, ends
-- only by expiry, once the lock has stayed free for the keep time or a
-- holder's lease ran out. A waiter sleeps no longer than the lease it was
-- refused under, so a holder's lease running out needs no wake-up: a
-- lease shortened later wakes the waiters (mutex_renew). But a release
-- wakes one waiter per process, and the others of that process may sleep
-- on an earlier holder's longer lease: the woken one's turn must pass on
-- even if the hash it was refused on expires. So an unfair Lock that waited
-- (ARGV[6] "w") sets w on the hash it takes, and its release publishes
-- (one HSET, when the hash lacks w). A hash that is not there takes no w
-- from a refusal: a Lock refused then (a free lock whose fair queue has an
-- earlier waiter) waits for a hand-off, which always publishes.
--
-- The owner's client counts its holds and sends the count, so a Lock retried
-- after a lost reply cannot add a second hold.
--
-- A nested Lock (holds > 0) joins the acquisition named by its token and
-- leaves the lease alone (it belongs to the outer hold). If that acquisition
-- is gone (expired, deleted, taken over, even by the same owner id) it is
-- refused: the client must report the loss, not start a hold the outer
-- section believes continuous.
--
-- An outermost Lock (holds = 0) always starts a new acquisition with a new
-- token, even when the hash still names this owner: the client declared the
-- previous hold lost (its loss margin passed before the server's lease),
-- a reply was lost, or another process took over with the same owner id
-- (WithOwner after a restart). Handing out the old token again would let two
-- writers present the same token. The one exception is an attempt older
-- than the one that made the current hold, from the same Mutex value
-- (attempt ids are "nonce.seq", seq increasing per value): it was abandoned
-- by its caller and arrives late; granting it would re-tag the hold so that
-- its give-back released the newer hold, so it is refused. An attempt
-- whose caller gave up before the reply is refused too if its give-back
-- (mutex_release "a") got here first and left a tombstone: the give-back is
-- sent at once, without waiting for the attempt's reply, so the two can
-- reach Redis in either order and neither order leaves a grant nobody
-- knows of.
--
-- A call that repeats the attempt id of the current hold (a hand-off from
-- mutex_release granted it to this waiting Lock, or a retry of a call whose
-- reply was lost) is told it holds the lock, with its token, and the lease
-- starts again from now. Its first value is 2, not 1, so that the client can
-- tell a hold handed over by a release from one it took.
--
-- Fair Locks (ARGV[6] = "f") queue: a fair Lock takes a free lock only if no
-- live waiter is queued before it; otherwise it adds (or refreshes) its
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
-- KEYS[1]  lock hash
-- KEYS[2]  tombstones: abandoned attempt id -> 1
-- KEYS[3]  queue: sorted set of attempt ids by arrival
-- KEYS[4]  queue entries: attempt id -> "expiry_ms owner"
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  holds the owner's client has now (0 for an outermost Lock)
-- ARGV[4]  attempt id "nonce.seq" of an outermost Lock (ignored when nested)
-- ARGV[5]  token of the hold a nested Lock joins (ignored when outermost)
-- ARGV[6]  "f" for a fair Lock, "t" for a fair TryLock (respects the queue
--          but does not join it), "w" for an unfair Lock's attempt after
--          it was refused (see w), else ""
--
-- Returns  {1, holds, token} when the owner holds the lock now ({2, holds,
--          token} when it already held it under this attempt id);
--          {0, remaining lease in ms (-1: no TTL), 0} when another owner
--          (or a newer attempt of the same Mutex) does, or the attempt was
--          abandoned ({0, 0, 0} if the lock is free);
--          {0, -2, 0} when the lock is free but a fair waiter queued
--          earlier has the turn;
--          {0, -3, 0} when a fair call dropped 16 dead entries and must
--          try again at once (it is not queued);
--          {-1, 0, 0} when a nested Lock's acquisition is gone.
-- Complexity: O(log Q) for Q queued waiters (O(1) unfair). An unfair Lock
--          of a lock whose hash is there and flags nothing (the common case:
--          a free lock that was released within the last second, no fair
--          waiters, no abandoned attempts) makes four calls: HMGET, TIME,
--          HSET, PEXPIRE. Each call costs the server about as much as four
--          fields read, so fields only rare paths need are read there. A
--          refused Lock adds one HSET, the first time the hash refuses one;
--          so does the grant of a Lock that waited, on a hash without w; an
--          outermost Lock that supersedes its owner's hold reads c.
local h = redis.call('HMGET', KEYS[1], 'o', 'f', 'k', 'w')
local holds = tonumber(ARGV[3])

if holds > 0 then
  if h[1] == ARGV[1] and h[2] == ARGV[5] then
    redis.call('HSET', KEYS[1], 'n', holds + 1)
    return {1, holds + 1, tonumber(h[2])}
  end
  return {-1, 0, 0}
end

local an, as = string.match(ARGV[4], '^(.*)%.(%d+)$')
if not an then
  return redis.error_reply('mutex_lock: malformed attempt id')
end
local known, k = h[2], h[3]
local tombs, queued = k == 'x' or k == 'qx', k == 'q' or k == 'qx'
if not known then
  local n = redis.call('EXISTS', KEYS[2], KEYS[3])
  if n == 2 then
    tombs, queued, k = true, true, 'qx'
  elseif n == 1 then
    tombs = redis.call('EXISTS', KEYS[2]) == 1
    queued = not tombs
    k = tombs and 'x' or 'q'
  end
end
if tombs then
  if redis.call('HEXISTS', KEYS[2], ARGV[4]) == 1 then
    return {0, h[1] and redis.call('PTTL', KEYS[1]) or 0, 0}
  end
end
local a -- the attempt that made the current hold, read only if it is ours
if h[1] == ARGV[1] then
  local mine = redis.call('HMGET', KEYS[1], 'a', 'n')
  a = mine[1]
  if a == ARGV[4] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {2, tonumber(mine[2]), tonumber(h[2])}
  end
end
local fair = ARGV[6] == 'f' or ARGV[6] == 't'
local t -- TIME, read once, when first needed

-- Made only where it can be called: a closure costs allocations, and the
-- common call (free, unfair) needs none.
local enqueue
if h[1] or fair then
  enqueue = function(wait)
    if known and not h[4] then
      redis.call('HSET', KEYS[1], 'w', '1') -- a waiter may subscribe
    end
    if ARGV[6] == 'f' then
      if not redis.call('ZSCORE', KEYS[3], ARGV[4]) then
        local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
        redis.call('ZADD', KEYS[3], (tonumber(last) or 0) + 1, ARGV[4])
      end
      t = t or redis.call('TIME')
      local expiry = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
      redis.call('HSET', KEYS[4], ARGV[4], string.format('%d', expiry) .. ' ' .. ARGV[1])
      -- The queue keys live as long as their longest-lived entry: a
      -- waiter with a shorter lease (WithLease) must not cut them short.
      local lease = tonumber(ARGV[2])
      if redis.call('PTTL', KEYS[3]) < lease then
        redis.call('PEXPIRE', KEYS[3], ARGV[2])
      end
      if redis.call('PTTL', KEYS[4]) < lease then
        redis.call('PEXPIRE', KEYS[4], ARGV[2])
      end
      if known and not queued then
        redis.call('HSET', KEYS[1], 'k', tombs and 'qx' or 'q')
      end
    end
    return {0, wait, 0}
  end
end

if h[1] and h[1] ~= ARGV[1] then
  return enqueue(redis.call('PTTL', KEYS[1]))
end
if h[1] and a then
  local hn, hs = string.match(a, '^(.*)%.(%d+)$')
  if hn == an and tonumber(as) < tonumber(hs) then
    if not h[4] then
      redis.call('HSET', KEYS[1], 'w', '1') -- a waiter may subscribe
    end
    return {0, redis.call('PTTL', KEYS[1]), 0}
  end
end
if fair and queued then
  -- The lock is free (or ours from an earlier, lost acquisition): take it
  -- only if no live waiter is queued before this one.
  local reaped = 0
  while true do
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if not head or head == ARGV[4] then
      break
    end
    local e = redis.call('HGET', KEYS[4], head)
    local expiry = e and tonumber(string.match(e, '^(%d+)'))
    t = t or redis.call('TIME')
    if expiry and expiry > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
      return enqueue(-2) -- free, but not this waiter's turn
    end
    if reaped == 16 then
      return {0, -3, 0}
    end
    redis.call('ZREM', KEYS[3], head)
    redis.call('HDEL', KEYS[4], head)
    reaped = reaped + 1
  end
  redis.call('ZREM', KEYS[3], ARGV[4])
  redis.call('HDEL', KEYS[4], ARGV[4])
end

t = t or redis.call('TIME')
local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(h[2])
if last and last >= token then
  token = last + 1
end
local ft = string.format('%d', token)
if not known or h[1] then
  -- A new hash starts a run. This owner's earlier acquisition, superseded,
  -- ended otherwise: c lists its token (as mutex_release does for a
  -- give-back).
  local c = ft
  if known then
    local t = {}
    for x in string.gmatch(redis.call('HGET', KEYS[1], 'c') or '', '%d+') do
      t[#t + 1] = x
    end
    if #t == 0 then
      t[1] = string.format('%d', tonumber(h[2]) + 1)
    else
      t[#t + 1] = h[2]
      if #t > 17 then
        t[1] = string.format('%d', tonumber(table.remove(t, 2)) + 1)
      end
    end
    c = table.concat(t, ' ')
  end
  if k then
    redis.call('HSET', KEYS[1], 'o', ARGV[1], 'n', '1', 'f', ft, 'a', ARGV[4], 'c', c, 'k', k)
  else
    redis.call('HSET', KEYS[1], 'o', ARGV[1], 'n', '1', 'f', ft, 'a', ARGV[4], 'c', c)
  end
else
  redis.call('HSET', KEYS[1], 'o', ARGV[1], 'n', '1', 'f', ft, 'a', ARGV[4])
end
if ARGV[6] == 'w' and not h[4] then
  redis.call('HSET', KEYS[1], 'w', '1') -- a Lock that waited passes its wake-up on
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, 1, token}
