-- semaphore_release: give back one permit of a counting semaphore and wake
-- as many waiters as the free permits allow.
--
-- Layout as in semaphore_acquire. Only the permit's own entry is removed, so
-- a release of a permit that is gone (released, expired and reclaimed,
-- deleted) frees nothing. A permit that expired but is still stored is
-- removed and reported as not held. Up to 16 other expired permits are
-- reclaimed on the way. When capacity was freed, the number of permits now
-- free is published as the wake-up budget. The keys are deleted with the
-- last permit, except that a capacity set by SetCapacity stays in the hash
-- for as long as ':set' says.
--
-- KEYS[1]  permits hash
-- KEYS[2]  expiry sorted set
-- KEYS[3]  wake-up channel
-- ARGV[1]  permit id
-- ARGV[2]  "s" to publish with SPUBLISH (cluster), else PUBLISH
--
-- Returns  {held, used}: held is 1 if the permit was live and is now
--          released, 0 if it was not held; used is the weight still held.
-- Complexity: O(log N) for N permits held, plus the publish.
local function num(x)
  return string.format('%.0f', x)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]

local h = redis.call('HMGET', KEYS[1], ':used', ':cap', id, ':set')
local used = tonumber(h[1] or '0')
local cap = tonumber(h[2] or '0')
local freed = 0
local held = 0

local score = redis.call('ZSCORE', KEYS[2], id)
if h[3] then
  if score and tonumber(score) > now then
    held = 1
  end
  freed = tonumber(h[3])
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end

local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', num(now), 'LIMIT', 0, 16)
if #expired > 0 then
  local weights = redis.call('HMGET', KEYS[1], unpack(expired))
  for i = 1, #expired do
    freed = freed + tonumber(weights[i] or '0')
  end
  redis.call('HDEL', KEYS[1], unpack(expired))
  redis.call('ZREM', KEYS[2], unpack(expired))
end

if freed > 0 then
  used = used - freed
  if used <= 0 or redis.call('ZCARD', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[1], KEYS[2])
    used = 0
    if h[4] then
      redis.call('HSET', KEYS[1], ':used', '0', ':cap', h[2], ':set', h[4])
      redis.call('PEXPIRE', KEYS[1], h[4])
    end
  else
    redis.call('HSET', KEYS[1], ':used', num(used))
  end
  local free = math.max(cap - used, 1)
  if ARGV[2] == 's' then
    redis.call('SPUBLISH', KEYS[3], num(free))
  else
    redis.call('PUBLISH', KEYS[3], num(free))
  end
end
return {held, used}
