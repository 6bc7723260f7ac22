-- ratelimit_fixed: fixed-window rate limit, the INCR/PEXPIRE design.
--
-- The first hit of a window creates the counter and gives it the window as
-- TTL, in the same script, so a counter can never exist without a TTL. A
-- counter found without one (left by an older, non-atomic client) gets the
-- window again instead of living forever. A denied request does not count.
--
-- The counter is raised first and lowered again if that went past the
-- limit: an allowed request, the common case, then costs two calls (INCRBY,
-- and PTTL or, for a window's first request, PEXPIRE) instead of three
-- (GET, PTTL, INCRBY), and a denied one three. A call costs the server far
-- more than its command does (INFO commandstats: INCRBY 0.3 us, the script
-- around two calls 3-4 us), and so does turning a Lua number back into a
-- string, so arguments go to commands as the strings they came as. Floods
-- of denied requests are mostly answered by the client's deny cache. A
-- denial that would leave a counter at zero deletes it instead, so no
-- counter is ever left without a TTL.
--
-- KEYS[1]  counter key
-- ARGV[1]  limit: requests allowed per window (integer >= 1)
-- ARGV[2]  window in milliseconds (integer >= 1)
-- ARGV[3]  cost: how many requests this call is (integer >= 0; 0 only peeks)
--
-- Returns  {allowed (1|0), count after this call, milliseconds until the
--          window resets}
-- Complexity: O(1); touches one key; two calls when allowed.
local limit = tonumber(ARGV[1])
local cost = tonumber(ARGV[3])

if cost == 0 then
  local count = tonumber(redis.call('GET', KEYS[1]) or '0')
  return {count <= limit and 1 or 0, count, math.max(redis.call('PTTL', KEYS[1]), 0)}
end

local count = redis.call('INCRBY', KEYS[1], ARGV[3])
local before = count - cost
if count > limit then
  if before == 0 then
    redis.call('DEL', KEYS[1])
    return {0, 0, 0}
  end
  redis.call('DECRBY', KEYS[1], ARGV[3])
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    ttl = tonumber(ARGV[2])
  end
  return {0, before, ttl}
end
if before == 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, count, tonumber(ARGV[2])}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  ttl = tonumber(ARGV[2])
end
return {1, count, ttl}
