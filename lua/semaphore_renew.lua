-- semaphore_renew: extend the lease of one live permit (the watchdog).
--
-- Layout as in semaphore_acquire. A permit that is gone or already expired
-- is not brought back: its capacity may have been counted as free already.
-- Both keys' expiry follows the latest permit expiry, or ':set' ms from
-- now if SetCapacity set the capacity and that is later.
--
-- KEYS[1]  permits hash
-- KEYS[2]  expiry sorted set
-- ARGV[1]  permit id
-- ARGV[2]  lease in milliseconds (integer >= 1)
--
-- Returns  1 if renewed, 0 if the permit is not held.
-- Complexity: O(log N) for N permits held.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) <= now then
  return 0
end
local h = redis.call('HMGET', KEYS[1], ARGV[1], ':set')
if not h[1] then
  return 0
end
local exp = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], string.format('%.0f', exp), ARGV[1])
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local at = math.max(tonumber(last[2]), exp)
local keep = tonumber(h[2])
if keep then
  at = math.max(at, now + keep)
end
at = string.format('%.0f', at)
redis.call('PEXPIREAT', KEYS[1], at)
redis.call('PEXPIREAT', KEYS[2], at)
return 1
