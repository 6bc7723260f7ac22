-- semaphore_queue_refresh: keep the queue entries of many waiting fair
-- Acquires, of one or more semaphores, alive in one call (the batched
-- counterpart of the refresh a waiter's own semaphore_queue "a" call makes).
--
-- Layout as in semaphore_queue. A waiter's entry ("expiry_ms weight") dies
-- a lease after it was last written unless refreshed. This script rewrites
-- the entries of waiters that are still queued with the expiry an "a" call
-- would give them, and makes both queue keys live at least as long (their
-- TTL is only ever extended: a waiter of another process with a shorter
-- lease must not cut the queue short). It never grants, reclaims, drops or
-- re-queues: it tells the client which waiters must look for themselves,
-- with their own "a" call, which then does all of that:
--   0  not queued: a grant pass granted it permits and the message was
--      lost (its own call then finds and renews the permit), or its entry
--      was dropped as dead (its own call queues it again, at the tail);
--   2  refreshed, but its own call is needed:
--        * its weight is above the capacity in force (SetCapacity lowered
--          it): its Acquire must fail, and no release would tell it;
--        * or, for the first waiter of a semaphore in the call that is
--          still queued (one is enough: any "a" call runs the grant pass
--          for the whole queue), a grant pass would grant or drop
--          something now although no call may come to run one. That is,
--          checked in this order, each in O(log) time:
--            - a permit's expiry has passed (ZRANGE of the first expiry):
--              its holder died or stalled and will not release, so only a
--              call that reclaims it frees its capacity;
--            - nothing is held (no state hash): the queue's head fits;
--            - permits are free (capacity - weight in use > 0) and the
--              queue's head either fits in them or is dead (a pass drops
--              it and serves those behind it; a dead head blocked past
--              its 16 passes would otherwise keep the permits idle).
--          A head that does not fit, with nothing expired, is left alone:
--          that is the ordinary wait for a release, which runs the pass.
--          Each condition is cleared by the call it causes (reclaimed,
--          granted, dropped), or by at most 16 reclaimed per call, so a
--          semaphore costs at most one extra call per refresh round.
--   1  refreshed; nothing to do.
-- A waiter one of whose semaphore's keys holds another type of value
-- (overwritten by an operator's SET or another program sharing the
-- prefix) is answered 0: its own call gets the error and reports it. The
-- other waiters of the call are refreshed as usual.
-- An entry whose expiry passed but that no pass has dropped yet is
-- refreshed like any other, as the waiter's own "a" call would do.
--
-- Each semaphore's four keys are sent once, however many of its waiters
-- the call refreshes; on a cluster every key of the call is in one slot
-- (semaphores whose hash tags share a slot). Time is the server's (TIME).
--
-- KEYS[4j-3]   state hash of the j-th semaphore
-- KEYS[4j-2]   its permits sorted set
-- KEYS[4j-1]   its queue: sorted set of waiting ids by arrival
-- KEYS[4j]     its queue entries: id -> "expiry_ms weight", plus ':b'
-- ARGV[1]      lease in milliseconds (integer >= 1), for every entry
-- ARGV[3i-1]   j: the semaphore of the i-th waiter (1 .. #KEYS/4)
-- ARGV[3i]     id of the i-th waiter
-- ARGV[3i+1]   its weight, as queued
--
-- Returns  an array with one entry per waiter: 1, 0 or 2 as above.
-- Complexity: O(N log Q + S (log M + log Q)) for N waiters of S semaphores
--          with queues of at most Q entries and M permits; the caller sends
--          at most lease.MaxBatch (512) waiters per call.
local function num(x)
  return string.format('%d', x)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
local exps = num(now + lease)
local ttl = num(lease + math.floor(lease / 16)) -- as semaphore_queue sets it

-- An error e that redis.pcall gave on a key of this call decides only the
-- answer of that semaphore's waiters if it is WRONGTYPE (the key holds
-- another type of value); any other error fails the call, as redis.call
-- would.
local function wrongType(e)
  if not string.find(e.err, '^WRONGTYPE') then
    error(e)
  end
end

-- j -> {stored = capacity or false, stuck = bool, woken = bool, wrong = bool}
local sems = {}

-- What the j-th semaphore is like now: its capacity in force (false if
-- nothing is held), whether a grant pass would do something, and whether
-- its state hash or permits set holds another type of value. Its queue
-- keys are known to be of the right type: a refresh of one of its entries
-- went through them.
local function look(j)
  local s = sems[j]
  if s then
    return s
  end
  local hk, ek, qk, qek = KEYS[4 * j - 3], KEYS[4 * j - 2], KEYS[4 * j - 1], KEYS[4 * j]
  local h = redis.pcall('HMGET', hk, ':cap', ':h')
  if h.err then -- (an array has no err)
    wrongType(h)
    s = {wrong = true}
    sems[j] = s
    return s
  end
  s = {stored = tonumber(h[1]) or false, stuck = false, woken = false, wrong = false}
  sems[j] = s
  if not h[1] then
    s.stuck = true -- nothing held, yet waiters queued
    return s
  end
  local first = redis.pcall('ZRANGE', ek, '0', '0', 'WITHSCORES')
  if first.err then
    wrongType(first)
    s.wrong = true
    return s
  end
  if first[2] and tonumber(first[2]) <= now then
    s.stuck = true -- an expired permit that nobody will release
    return s
  end
  local count = redis.call('ZCARD', ek) -- the weight in use: see semaphore_acquire
  local used = count
  if count > 0 then
    used = used + (tonumber(h[2]) or 0)
  end
  local free = (s.stored or 0) - used
  if free > 0 then
    local head = redis.call('ZRANGE', qk, '0', '0')[1]
    if head then
      local expiry, w = string.match(redis.call('HGET', qek, head) or '', '^(%d+) (%d+)$')
      expiry, w = tonumber(expiry), tonumber(w)
      s.stuck = not expiry or expiry <= now or w <= free
    end
  end
  return s
end

local out = {}
local extended = {} -- j -> true once its queue keys' TTL was seen to
for i = 1, (#ARGV - 1) / 3 do
  local j = tonumber(ARGV[3 * i - 1])
  local id, w = ARGV[3 * i], ARGV[3 * i + 1]
  local qk, qek = KEYS[4 * j - 1], KEYS[4 * j]
  out[i] = 0
  local r = redis.pcall('ZSCORE', qk, id) -- r: each reply in turn, or an error
  if r and type(r) ~= 'table' then
    r = redis.pcall('HSET', qek, id, exps .. ' ' .. w)
  end
  if type(r) == 'table' then
    wrongType(r) -- answered 0
  elseif r then
    if not extended[j] then
      extended[j] = true
      for _, k in ipairs({qk, qek}) do
        if redis.call('PTTL', k) < lease then
          redis.call('PEXPIRE', k, ttl)
        end
      end
    end
    local s = look(j)
    if s.wrong then
      out[i] = 0
    elseif s.stored and tonumber(w) > s.stored then
      out[i] = 2
    elseif s.stuck and not s.woken then
      s.woken = true
      out[i] = 2
    else
      out[i] = 1
    end
  end
end
return out
