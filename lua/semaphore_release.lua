-- semaphore_release: give back one permit of a counting semaphore and wake
-- as many waiters as the free permits allow.
--
-- Layout as in semaphore_acquire. Only the permit's own entry is removed, so
-- a release of a permit that is gone (released, expired and reclaimed,
-- deleted) frees nothing and changes nothing. A permit that expired but is
-- still stored is removed and reported as not held. Other expired permits
-- are left for the acquire that finds them in its way (semaphore_acquire).
-- When capacity was freed, the number of permits now free (at least 1) is
-- published as the wake-up budget. The keys are deleted with the last
-- permit, except that a capacity set by SetCapacity stays in the hash for
-- as long as ':set' says; a release that leaves permits stored makes both
-- keys live that long too (their expiry only moved later), since their
-- holders may never release or renew them.
--
-- KEYS[1]  permits hash
-- KEYS[2]  expiry sorted set
-- KEYS[3]  wake-up channel
-- ARGV[1]  permit id
-- ARGV[2]  "s" to publish with SPUBLISH (cluster), else PUBLISH
--
-- Returns  {held, used}: held is 1 if the permit was live and is now
--          released, 0 if it was not held; used is the weight still held
--          (expired permits not reclaimed yet count in it).
-- Complexity: O(log N) for N permits held, plus the publish.
local id = ARGV[1]
local h = redis.call('HMGET', KEYS[1], ':used', ':cap', id, ':set')
local used = tonumber(h[1] or '0')
if not h[3] then
  return {0, used}
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = tonumber(redis.call('ZSCORE', KEYS[2], id))
local held = 0
if score and score > now then
  held = 1
end
redis.call('HDEL', KEYS[1], id)
redis.call('ZREM', KEYS[2], id)

used = used - tonumber(h[3])
local keep = h[4]
if used <= 0 or redis.call('ZCARD', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[1], KEYS[2])
  used = 0
  if keep then
    redis.call('HSET', KEYS[1], ':used', '0', ':cap', h[2], ':set', keep)
    redis.call('PEXPIRE', KEYS[1], keep)
  end
else
  redis.call('HSET', KEYS[1], ':used', string.format('%d', used))
  -- PTTL counts from a time no earlier than now less 1 ms: hence the + 1.
  if keep and redis.call('PTTL', KEYS[2]) < tonumber(keep) + 1 then
    local at = string.format('%d', now + tonumber(keep) + 1)
    redis.call('PEXPIREAT', KEYS[1], at)
    redis.call('PEXPIREAT', KEYS[2], at)
  end
end
local free = string.format('%d', math.max(tonumber(h[2] or '0') - used, 1))
if ARGV[2] == 's' then
  redis.call('SPUBLISH', KEYS[3], free)
else
  redis.call('PUBLISH', KEYS[3], free)
end
return {held, used}
