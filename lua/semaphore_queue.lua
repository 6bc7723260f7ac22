-- semaphore_queue: the calls of a counting semaphore that grant permits to
-- its queue of fair waiters: a fair Acquire or TryAcquire, a fair Release
-- (which is also how a waiter leaves the queue), and SetCapacity.
--
-- Layout as in semaphore_acquire (state hash with ':cap', ':set', ':h',
-- ':x' and the weights above 1; permits sorted set by expiry), plus the
-- queue: the sorted set KEYS[4] maps the permit id of each waiting Acquire
-- to its arrival number, and the hash KEYS[5] maps it to its entry
-- "expiry_ms weight". An entry dies a lease after the waiter last
-- refreshed it (each fair attempt does). The field ':b' of KEYS[5] is "id
-- passes": the first waiter that did not fit, and how many grants have
-- passed it. Both queue keys expire with the longest entry lease (or up to
-- a sixteenth of a lease after it) and are deleted when the queue empties.
-- The permit keys' expiry is moved only later, and only when it comes
-- before a permit granted or renewed here (or a set capacity's retention),
-- then to that end plus 1 ms and a sixteenth of the lease; this script
-- asks PTTL rather than reading ':x', and leaves ':x' (no later than the
-- keys' expiry, which only moves later here) as it is.
--
-- Every call reclaims up to 16 expired permits (except a fair Acquire
-- granted at once, with nobody queued, which leaves them to the next
-- call they are in the way of, as semaphore_acquire does), does its own
-- work, then runs the grant pass over the first 32 entries of the queue,
-- in arrival order, with the permits free (capacity - used); it reads only as many
-- entries as the permits free could be granted to (plus one), and more
-- only if those do not use them up:
--   * a dead entry is dropped; an entry heavier than the capacity (lowered
--     by SetCapacity) is skipped, and its Acquire fails at its next attempt;
--   * an entry that fits is granted: it becomes a permit that expires when
--     its entry would have (a waiter that died since its last refresh holds
--     it no longer than that), leaves the queue, and is told by the message
--     "g ID WEIGHT" on the channel, which only that waiter takes;
--   * the first entry that does not fit is the blocked head. Lighter entries
--     behind it that fit may pass it, 16 times at most; after that nothing
--     passes it and the permits freed are kept for it until it fits.
-- If permits are still free and no entry is blocked (the queue is empty, or
-- longer than the 32 looked at), the number free is published as a wake-up
-- budget for waiters the pass did not reach.
--
-- Modes (ARGV[1]):
--   "a"  fair Acquire: take n permits for id if the pass reaches it, else
--        add (or refresh) its entry at the end of the queue. An id that
--        already holds a live permit (granted by a pass while it waited, or
--        a retry) is renewed and told it holds it.
--   "t"  fair TryAcquire: as "a", but an id not granted leaves no entry.
--   "r"  release id: remove its permit (if held) and its queue entry (a
--        waiter that gives up leaves the queue this way, and gives back a
--        grant that reached it meanwhile). A release of a permit, with a
--        set capacity, makes the permit keys live its retention from now
--        (only later), as a grant does: the permits left may never be
--        released or renewed.
--   "c"  SetCapacity: the capacity becomes ARGV[2] for every caller, kept
--        in the hash at least ARGV[5] ms after its last write. Held permits
--        are never revoked: while used >= capacity nothing is granted.
-- The capacity check of "a" and "t" is as in semaphore_acquire.
--
-- KEYS[1]  state hash
-- KEYS[2]  permits sorted set
-- KEYS[3]  channel
-- KEYS[4]  queue: sorted set of waiting ids by arrival
-- KEYS[5]  queue entries: id -> "expiry_ms weight", plus ':b'
-- ARGV[1]  mode: "a", "t", "r" or "c"
-- ARGV[2]  capacity (integer, 1 .. 2^53): the caller's, or c: the new one
-- ARGV[3]  a, t: n, permits to take (1 .. 2^53); r, c: unused
-- ARGV[4]  a, t, r: permit id; c: unused
-- ARGV[5]  a, t: lease in milliseconds; c: how long a set capacity is kept,
--          in ms; r: unused
-- ARGV[6]  "s" to publish with SPUBLISH (cluster), else PUBLISH
--
-- Returns  a, t: {status, used, capacity, wait} as semaphore_acquire;
--          r: {held, used}: held is 1 if id held a live permit, now
--          released;
--          c: {used, capacity}.
-- Complexity: O(log N + log Q) for N permits and Q waiters, plus at most
-- 32 grants and their publishes.
local function num(x)
  return string.format('%d', x)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mode = ARGV[1]
local id = ARGV[4]

-- h[3]: the id's weight if it is listed and weighs more than 1.
local h = redis.call('HMGET', KEYS[1], ':cap', ':set', id, ':h')
local stored = tonumber(h[1] or ARGV[2])
local keep = tonumber(h[2]) -- ms a set capacity is kept, or nil
-- The weight in use: count, the permits listed, and extra, their weight
-- beyond one each (':h'); every change below keeps used = count + extra.
local count, extra = 0, 0
if not h[1] then
  redis.call('DEL', KEYS[2]) -- counted nowhere (see semaphore_acquire)
else
  count = redis.call('ZCARD', KEYS[2])
end
if count > 0 then
  extra = tonumber(h[4]) or 0
end
local used = count + extra
local freed = 0
local held = 0
local latest = 0 -- the latest expiry of a permit granted or renewed here

local function publish(msg)
  if ARGV[6] == 's' then
    redis.call('SPUBLISH', KEYS[3], msg)
  else
    redis.call('PUBLISH', KEYS[3], msg)
  end
end

-- Take qid out of the queue. When that empties the queue, the entries
-- hash goes too: its ':b' would keep it alive for a lease.
local function dequeue(qid)
  local removed = redis.call('ZREM', KEYS[4], qid)
  redis.call('HDEL', KEYS[5], qid)
  if removed == 1 and redis.call('EXISTS', KEYS[4]) == 0 then
    redis.call('DEL', KEYS[5])
  end
end

-- Count a permit of weight w in (sign 1) or out (-1) of the weight in use.
local function tally(w, sign)
  count = count + sign
  extra = extra + sign * (w - 1)
  used = count + extra
end

-- Remove permits: ids, all listed (their weights from the hash), counted
-- in freed.
local function drop(ids)
  if #ids == 0 then
    return
  end
  local weights = redis.call('HMGET', KEYS[1], unpack(ids))
  for i = 1, #ids do
    local w = tonumber(weights[i] or '1')
    freed = freed + w
    tally(w, -1)
  end
  redis.call('HDEL', KEYS[1], unpack(ids))
  redis.call('ZREM', KEYS[2], unpack(ids))
end

-- own: the id's permit expiry if it is listed (held, or expired and not
-- yet reclaimed).
local own = nil
if mode ~= 'c' then
  own = redis.call('ZSCORE', KEYS[2], id)
end
if mode == 'r' then
  if own then
    if tonumber(own) > now then
      held = 1
    end
    freed = tonumber(h[3] or '1')
    tally(freed, -1)
    if h[3] then
      redis.call('HDEL', KEYS[1], id)
    end
    redis.call('ZREM', KEYS[2], id)
  else
    dequeue(id) -- a held permit is never queued
  end
  own = nil
end
-- A fair Acquire that fits as things are, with nobody queued, is granted
-- below without the reclaim, as in semaphore_acquire: a later call that
-- finds expired permits in its way (and every release) reclaims them.
local quick = false
if (mode == 'a' or mode == 't') and not own then
  local c = tonumber(ARGV[2])
  if keep then
    c = stored
  elseif used > 0 and stored ~= c then
    c = -1
  end
  quick = used + tonumber(ARGV[3]) <= c and redis.call('EXISTS', KEYS[4]) == 0
end
-- Reclaim expired permits, and this id's own earlier grant if it expired.
local expired = {}
if not quick then
  expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', num(now), 'LIMIT', '0', '16')
end
if own and tonumber(own) <= now then
  local listed = false
  for i = 1, #expired do
    listed = listed or expired[i] == id
  end
  if not listed then
    expired[#expired + 1] = id
  end
  own = nil
end
drop(expired)

local cap = tonumber(ARGV[2])
if mode == 'c' then
  keep = tonumber(ARGV[5])
  stored = cap
elseif used == 0 and not keep then
  stored = cap
end
local dirty = freed > 0 or mode == 'c' -- the hash needs writing back
-- A permit was granted or renewed, or a set capacity must be kept from a
-- release (the permits left may never be released or renewed): set expiries.
local extend = mode == 'c' or mode == 'r' and keep ~= nil
local grants = {} -- permits the pass granted of more than 1: id, weight, ...

-- Write back ':h', the capacity and the permits granted, and, if extend,
-- make both keys last until latest (and a set capacity's retention).
local function save()
  if count <= 0 then
    used = 0
    redis.call('DEL', KEYS[1], KEYS[2])
    if keep then
      redis.call('HSET', KEYS[1], ':cap', num(stored), ':set', num(keep))
      redis.call('PEXPIRE', KEYS[1], num(keep))
    end
    return
  end
  grants[#grants + 1] = ':h'
  grants[#grants + 1] = num(extra)
  grants[#grants + 1] = ':cap'
  grants[#grants + 1] = num(stored)
  if keep then
    grants[#grants + 1] = ':set'
    grants[#grants + 1] = num(keep)
  end
  redis.call('HSET', KEYS[1], unpack(grants))
  if not extend then
    return
  end
  local lease = math.max(latest - now, 0)
  local need = lease
  if keep and keep > need then
    need = keep
  end
  -- PTTL counts from a time no earlier than now less 1 ms: hence the + 1.
  if not h[1] or redis.call('PTTL', KEYS[2]) < need + 1 then
    local at = num(now + need + 1 + math.floor(lease / 16))
    redis.call('PEXPIREAT', KEYS[1], at)
    redis.call('PEXPIREAT', KEYS[2], at)
  end
end

-- How long until the earliest permit expires (-1: none held).
local function wait()
  local first = redis.call('ZRANGE', KEYS[2], '0', '0', 'WITHSCORES')
  if #first == 0 then
    return -1
  end
  return math.max(tonumber(first[2]) - now, 0)
end

-- The grant pass (see the header). It reports whether self was granted,
-- without a message to it. announce: publish a budget if permits stay free.
-- Entries leave the queue together at the end, so that ranks stay put
-- while the pass reads them.
local function pass(self, announce)
  local free = stored - used
  if free <= 0 then
    return false
  end
  local blocked, passes = nil, 0
  local granted = false
  local seen, want = 0, math.min(free + 1, 32)
  local ids = redis.call('ZRANGE', KEYS[4], '0', num(want - 1))
  local gone = {} -- entries leaving the queue
  local zargs = {} -- expiry, id, ... of the permits granted
  while #ids > 0 do
    local es = redis.call('HMGET', KEYS[5], unpack(ids))
    local stop = false
    for i = 1, #ids do
      local qid = ids[i]
      local expiry, w = string.match(es[i] or '', '^(%d+) (%d+)$')
      expiry, w = tonumber(expiry), tonumber(w)
      if not expiry or expiry <= now then
        gone[#gone + 1] = qid
      elseif w > stored then
        -- never fits; its Acquire fails at its next attempt
      elseif w <= free and (not blocked or passes < 16) then
        tally(w, 1)
        free = free - w
        if w > 1 then
          grants[#grants + 1] = qid
          grants[#grants + 1] = num(w)
        end
        zargs[#zargs + 1] = num(expiry)
        zargs[#zargs + 1] = qid
        gone[#gone + 1] = qid
        if expiry > latest then
          latest = expiry
        end
        dirty, extend = true, true
        if blocked then
          passes = passes + 1
        end
        if qid == self then
          granted = true
        else
          publish('g ' .. qid .. ' ' .. num(w))
        end
      elseif not blocked then
        blocked = qid
        local bid, bpasses = string.match(redis.call('HGET', KEYS[5], ':b') or '', '^(.*) (%d+)$')
        passes = (bid == qid) and tonumber(bpasses) or 0
      end
      if free <= 0 or (blocked and passes >= 16) then
        stop = true
        break
      end
    end
    seen = seen + #ids
    if stop or #ids < want or seen >= 32 then
      break
    end
    want = 32 - seen
    ids = redis.call('ZRANGE', KEYS[4], num(seen), '31')
  end
  if #zargs > 0 then
    redis.call('ZADD', KEYS[2], unpack(zargs))
  end
  if #gone > 0 then
    redis.call('ZREM', KEYS[4], unpack(gone))
    redis.call('HDEL', KEYS[5], unpack(gone))
  end
  if blocked then
    redis.call('HSET', KEYS[5], ':b', blocked .. ' ' .. num(passes))
  elseif #gone > 0 and #gone == seen and redis.call('EXISTS', KEYS[4]) == 0 then
    -- (An entry read and not gone is still queued.)
    redis.call('DEL', KEYS[4], KEYS[5])
  end
  if announce and free > 0 and not blocked then
    publish(num(free))
  end
  return granted
end

if mode == 'r' then
  pass(nil, true)
  if dirty then
    save()
  end
  return {held, used}
end
if mode == 'c' then
  pass(nil, true)
  save()
  return {used, stored}
end

-- a, t
local n = tonumber(ARGV[3])
local function finish(status)
  if dirty then
    save()
  end
  return {status, used, stored, status == 1 and 0 or wait()}
end
if stored ~= cap and not keep then
  dequeue(id)
  pass(nil, freed > 0)
  return finish(-1)
end
if n > stored then
  dequeue(id)
  pass(nil, freed > 0)
  return finish(-2)
end
local lease = tonumber(ARGV[5])
local exp = now + lease
if own then
  -- Granted to this id already (by a pass while it waited, or a retry):
  -- renew, do not count twice.
  redis.call('ZADD', KEYS[2], num(exp), id)
  latest = exp
  dequeue(id)
  dirty, extend = true, true
  pass(nil, freed > 0)
  return finish(1)
end
if used + n <= stored and (quick or redis.call('EXISTS', KEYS[4]) == 0) then
  -- Nobody queued and it fits: granted without touching the queue.
  tally(n, 1)
  if n > 1 then
    grants[1], grants[2] = id, ARGV[3]
  end
  redis.call('ZADD', KEYS[2], num(exp), id)
  latest = exp
  dirty, extend = true, true
  if freed > 0 and stored > used then
    publish(num(stored - used))
  end
  return finish(1)
end
-- Join the end of the queue, or keep the place held (NX).
local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]
redis.call('ZADD', KEYS[4], 'NX', num((tonumber(last) or 0) + 1), id)
redis.call('HSET', KEYS[5], id, num(exp) .. ' ' .. ARGV[3])
-- A sixteenth of a lease more, so that the next joins and refreshes of the
-- next moments need not extend them again.
for k = 4, 5 do
  if redis.call('PTTL', KEYS[k]) < lease then
    redis.call('PEXPIRE', KEYS[k], num(lease + math.floor(lease / 16)))
  end
end
if pass(id, freed > 0) then
  return finish(1)
end
if mode == 't' then
  dequeue(id)
  if redis.call('EXISTS', KEYS[4]) == 0 then
    redis.call('DEL', KEYS[4], KEYS[5])
  end
end
return finish(0)
