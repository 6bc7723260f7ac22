-- semaphore_holders: list the live permits of a counting semaphore, for
-- operators. Read-only: expired permits are left for acquire and release to
-- reclaim, and are not listed.
--
-- Layout as in semaphore_acquire. Without the state hash nothing listed
-- is counted, so nothing is held.
--
-- KEYS[1]  state hash
-- KEYS[2]  permits sorted set
--
-- Returns  {id1, weight1, remaining ms 1, id2, ...}, earliest expiry first.
-- Complexity: O(log N + M) for N permits listed and M live ones returned.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. string.format('%d', now), '+inf', 'WITHSCORES')
local out = {}
if #live == 0 then
  return out
end
local ids = {}
for i = 1, #live, 2 do
  ids[#ids + 1] = live[i]
end
local weights = redis.call('HMGET', KEYS[1], unpack(ids))
for i = 1, #ids do
  out[#out + 1] = ids[i]
  out[#out + 1] = weights[i] or '1'
  out[#out + 1] = tonumber(live[2 * i]) - now
end
return out
