-- rwmutex_info: read the state of a read-write lock (read only).
--
-- See rwmutex_lock for the keys. Expired holds that no call has removed yet
-- are not reported.
--
-- KEYS[1]  state hash
-- KEYS[2]  readers sorted set
--
-- Returns  {writer's owner id or "", write holds, token of the current or
--          last write acquisition (0 if unknown), ms left of the write
--          lease, live read acquisitions, ms left of the writer-waiting
--          mark}.
-- Complexity: O(log R) for R readers.
local function num(x) return string.format('%.0f', x) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'o', 'n', 'f', 'e', 'q')
local owner, holds, remain = '', 0, 0
local e = tonumber(h[4]) or 0
if h[1] and e > now then
  owner, holds, remain = h[1], tonumber(h[2]) or 0, e - now
end
local readers = redis.call('ZCOUNT', KEYS[2], '(' .. num(now), '+inf')
local mark = math.max((tonumber(h[5]) or 0) - now, 0)
return {owner, holds, tonumber(h[3]) or 0, remain, readers, mark}
