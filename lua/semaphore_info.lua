-- semaphore_info: read the state of a counting semaphore (read only), in
-- one call so that every client runs it the same way: the capacity stored,
-- the weight held, how many permits are live and how many expired but not
-- reclaimed yet, and how many fair waiters are queued.
--
-- Layout as in semaphore_acquire (state hash with ':cap', ':set', ':h'
-- and the weights above 1; permits sorted set) and semaphore_queue (the
-- queue). The weight in use (ZCARD plus ':h') still counts expired
-- permits until an acquire or release reclaims them; the weight of the 16
-- oldest expired ones is taken off here (bounded work), so the weight
-- returned is that of the live permits whenever at most 16 expired ones
-- remain.
--
-- KEYS[1]  state hash
-- KEYS[2]  permits sorted set
-- KEYS[3]  queue sorted set (absent on an unfair semaphore)
--
-- Returns  {capacity stored (0 if none), 1 if SetCapacity set it else 0,
--          weight held (the weight in use less that of up to 16 expired
--          permits), live permits, expired permits not reclaimed yet,
--          waiters queued (live or not yet found dead)}; without the state
--          hash, nothing listed is counted: {0, 0, 0, 0, 0, waiters}.
-- Complexity: O(log N) for N permits stored, plus at most 16 expired
-- permits read.
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))

local h = redis.call('HMGET', KEYS[1], ':cap', ':set', ':h')
local queued = redis.call('ZCARD', KEYS[3])
if not h[1] then
  return {0, 0, 0, 0, 0, queued} -- nothing listed is counted
end
local count = redis.call('ZCARD', KEYS[2])
local used = count
if count > 0 then
  used = used + (tonumber(h[3]) or 0)
end
local expired = redis.call('ZCOUNT', KEYS[2], '-inf', now)
if expired > 0 then
  local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', '0', '16')
  local weights = redis.call('HMGET', KEYS[1], unpack(ids))
  for i = 1, #ids do
    used = used - tonumber(weights[i] or '1')
  end
end
local set = 0
if h[2] then
  set = 1
end
return {tonumber(h[1]), set, math.max(used, 0), count - expired, expired, queued}
