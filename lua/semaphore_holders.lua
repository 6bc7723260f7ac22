-- semaphore_holders: list the live permits of a counting semaphore, for
-- operators. Read-only: expired permits are left for acquire and release to
-- reclaim, and are not listed.
--
-- Layout as in semaphore_acquire.
--
-- KEYS[1]  permits hash
-- KEYS[2]  expiry sorted set
--
-- Returns  {id1, weight1, remaining ms 1, id2, ...}, earliest expiry first.
-- Complexity: O(log N + M) for N permits stored and M live permits listed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. string.format('%d', now), '+inf', 'WITHSCORES')
local out = {}
for i = 1, #live, 2 do
  local w = redis.call('HGET', KEYS[1], live[i])
  if w then
    out[#out + 1] = live[i]
    out[#out + 1] = w
    out[#out + 1] = tonumber(live[i + 1]) - now
  end
end
return out
