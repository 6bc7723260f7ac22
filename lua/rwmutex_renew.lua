-- rwmutex_renew: extend the lease of a write or read acquisition of a
-- read-write lock (the watchdog's call).
--
-- See rwmutex_lock for the keys. The lease runs from the server's TIME; the
-- keys' TTLs are only stretched, never shortened, since they also cover
-- other holders.
--
-- KEYS[1]  state hash
-- KEYS[2]  readers sorted set
-- ARGV[1]  "w" for the write acquisition, "r" for a read acquisition
-- ARGV[2]  w: owner id; r: read acquisition id
-- ARGV[3]  w: token of the acquisition; r: ignored
-- ARGV[4]  lease in milliseconds
--
-- Returns  1 if renewed, 0 if that acquisition is not held any more.
-- Complexity: O(1) for w, O(log R) for R readers for r.
local function num(x) return string.format('%.0f', x) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[4])
local key = KEYS[1]
if ARGV[1] == 'w' then
  local h = redis.call('HMGET', key, 'o', 'f', 'e')
  if h[1] ~= ARGV[2] or h[2] ~= ARGV[3] or (tonumber(h[3]) or 0) <= now then
    return 0
  end
  redis.call('HSET', key, 'e', num(now + lease))
else
  key = KEYS[2]
  local s = tonumber(redis.call('ZSCORE', key, ARGV[2]))
  if not s or s <= now then
    return 0
  end
  redis.call('ZADD', key, 'XX', num(now + lease), ARGV[2])
end
if redis.call('PTTL', key) < lease then
  redis.call('PEXPIRE', key, lease)
end
return 1
