-- ratelimit_fixed: fixed-window rate limit, the INCR/PEXPIRE design.
--
-- The first hit of a window creates the counter and gives it the window as
-- TTL, in the same script, so a counter can never exist without a TTL. A
-- counter found without one (left by an older, non-atomic client) gets the
-- window again instead of living forever. A denied request does not count.
--
-- KEYS[1]  counter key
-- ARGV[1]  limit: requests allowed per window (integer >= 1)
-- ARGV[2]  window in milliseconds (integer >= 1)
-- ARGV[3]  cost: how many requests this call is (integer >= 0; 0 only peeks)
--
-- Returns  {allowed (1|0), count after this call, milliseconds until the
--          window resets}
-- Complexity: O(1); touches one key.
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local count = tonumber(redis.call('GET', KEYS[1]) or '0')
local ttl = redis.call('PTTL', KEYS[1])

if count + cost > limit then
  if ttl < 0 and count > 0 then
    redis.call('PEXPIRE', KEYS[1], window)
    ttl = window
  end
  return {0, count, math.max(ttl, 0)}
end
if cost == 0 then
  return {1, count, math.max(ttl, 0)}
end

count = redis.call('INCRBY', KEYS[1], cost)
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], window)
  ttl = window
end
return {1, count, ttl}
