-- semaphore_acquire: take n permits of a counting semaphore with expiring
-- permits, reclaiming expired ones when they are in the way.
--
-- Layout of one semaphore: the hash KEYS[1] maps each permit id to its
-- weight, plus two reserved fields: ':used' (the sum of the weights held)
-- and ':cap' (the capacity the held permits were granted under). The sorted
-- set KEYS[2] maps each permit id to its expiry in server milliseconds. Both
-- keys expire no earlier than the latest permit expiry (at most 1 + lease/16
-- ms after it) and are deleted when the last permit goes, so nothing
-- outlives the permits for long.
--
-- A request that fits as things are (the id not held before, the capacity
-- in force, the weight held plus n at most the capacity) is granted
-- without looking at expiries: expired permits still counted in ':used'
-- are not in its way. Any other call first reclaims up to 16 expired
-- permits, the oldest first (bounded work), plus the caller's own id if
-- its earlier grant expired, so that it is not counted twice; if more
-- remain and the request is not granted, the reply's wait is 0 and the
-- caller simply calls again. When the reclaim frees capacity that this call
-- does not take, the free count is published so waiters elsewhere try again.
--
-- The capacity comes from the callers, or from SetCapacity. A capacity
-- brought by callers is fixed while any permit is held: a caller with
-- another capacity is refused (status -1); when no permit is held, the
-- caller's capacity applies. A capacity set by SetCapacity (the field
-- ':set' holds how long it is kept, in ms) applies to every caller whatever
-- capacity it brings, and the keys are kept at least that long after the
-- last grant (the hash also when no permit is held; the expiry set lives as
-- long as the hash, so that ':used' never outlives the permits it counts).
-- A request for more than the capacity is refused (status -2). Granting an
-- id that is already held and live renews it instead of counting it twice,
-- so a retry after a lost reply is harmless.
--
-- The keys' expiry is only ever moved later here, and only when it comes
-- before the new permit's (or the set capacity's) end: then to that end
-- plus 1 + lease/16 ms, so that the grants of the next few milliseconds
-- need not move it again.
--
-- KEYS[1]  permits hash
-- KEYS[2]  expiry sorted set
-- KEYS[3]  wake-up channel
-- ARGV[1]  capacity (integer, 1 .. 2^53)
-- ARGV[2]  n: permits to take (1 .. capacity; 0 only reclaims and reports)
-- ARGV[3]  permit id
-- ARGV[4]  lease in milliseconds (integer >= 1)
-- ARGV[5]  "s" to publish with SPUBLISH (cluster), else PUBLISH
--
-- Returns  {status, used, capacity, wait}: status 1 granted (or n = 0),
--          0 not granted, -1 capacity mismatch (capacity is then the stored
--          one), -2 n above the capacity; used is the weight held after the
--          call (it can exceed a capacity that SetCapacity lowered, and, on
--          a grant, count expired permits not reclaimed yet); wait is, when
--          not granted, the milliseconds until the earliest permit expiry,
--          0 if expired permits remain to reclaim, -1 if none is known.
-- Complexity: O(log N) for N permits held, plus the publish.
local function num(x)
  return string.format('%d', x)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local id = ARGV[3]

-- h[4]: the id's weight if it is stored (held, or expired and not yet
-- reclaimed); the hash and the expiry set always list the same ids.
local h = redis.call('HMGET', KEYS[1], ':used', ':cap', ':set', id)
local used = tonumber(h[1] or '0')
local stored = tonumber(h[2] or ARGV[1])
local keep = tonumber(h[3]) -- ms a set capacity is kept, or nil
local freed = 0
local score -- the id's own expiry, if it is stored

local fits = n > 0 and not h[4]
if fits then
  local c = cap
  if keep then
    c = stored
  elseif used > 0 and stored ~= cap then
    fits = false
  end
  fits = fits and used + n <= c
end

if not fits then
  -- Reclaim expired permits, the oldest first, and this id's own earlier
  -- grant if it expired (a retry after a lost reply) but is not among them.
  -- Everything freed goes through the one write-back of ':used' below.
  local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', num(now), 'LIMIT', '0', '16')
  if h[4] then
    score = tonumber(redis.call('ZSCORE', KEYS[2], id))
    if score and score <= now then
      score = nil
      local listed = false
      for i = 1, #expired do
        if expired[i] == id then
          listed = true
        end
      end
      if not listed then
        expired[#expired + 1] = id
      end
    end
  end
  if #expired > 0 then
    local weights = redis.call('HMGET', KEYS[1], unpack(expired))
    for i = 1, #expired do
      freed = freed + tonumber(weights[i] or '0')
    end
    redis.call('HDEL', KEYS[1], unpack(expired))
    redis.call('ZREM', KEYS[2], unpack(expired))
    used = used - freed
    if used <= 0 or redis.call('ZCARD', KEYS[2]) == 0 then
      redis.call('DEL', KEYS[1], KEYS[2])
      used = 0
      if keep then
        redis.call('HSET', KEYS[1], ':used', '0', ':cap', num(stored), ':set', h[3])
        redis.call('PEXPIRE', KEYS[1], h[3])
      end
    else
      redis.call('HSET', KEYS[1], ':used', num(used))
    end
  end
end
if used == 0 and not keep then
  stored = cap
end

local function wake()
  local free = stored - used
  if freed > 0 and free > 0 then
    if ARGV[5] == 's' then
      redis.call('SPUBLISH', KEYS[3], num(free))
    else
      redis.call('PUBLISH', KEYS[3], num(free))
    end
  end
end

-- How long until the earliest permit expires.
local function wait()
  local first = redis.call('ZRANGE', KEYS[2], '0', '0', 'WITHSCORES')
  if #first == 0 then
    return -1
  end
  return math.max(tonumber(first[2]) - now, 0)
end

if stored ~= cap and not keep then
  wake()
  return {-1, used, stored, wait()}
end
cap = stored
if n > cap then
  wake()
  return {-2, used, cap, wait()}
end
if n == 0 then
  wake()
  return {1, used, cap, wait()}
end

local lease = tonumber(ARGV[4])
local exp = now + lease
if score then
  -- Already granted to this id (a retry): renew, do not count twice.
  redis.call('ZADD', KEYS[2], num(exp), id)
elseif used + n <= cap then
  used = used + n
  if h[2] == ARGV[1] then
    redis.call('HSET', KEYS[1], id, ARGV[2], ':used', num(used))
  else
    redis.call('HSET', KEYS[1], id, ARGV[2], ':used', num(used), ':cap', num(cap))
  end
  redis.call('ZADD', KEYS[2], num(exp), id)
else
  wake()
  return {0, used, cap, wait()}
end
-- Both keys must last until exp (and a set capacity's retention). They
-- expire together, no earlier than every permit listed, so if the expiry
-- set lasts long enough the hash does too. PTTL counts from a time no
-- earlier than now less 1 ms: hence the + 1.
local need = lease
if keep and keep > need then
  need = keep
end
if not h[1] or redis.call('PTTL', KEYS[2]) < need + 1 then
  local at = num(now + need + 1 + math.floor(lease / 16))
  redis.call('PEXPIREAT', KEYS[1], at)
  redis.call('PEXPIREAT', KEYS[2], at)
end
wake()
return {1, used, cap, 0}
