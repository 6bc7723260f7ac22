-- rwmutex_runlock: release a read acquisition of a read-write lock (the
-- final RUnlock of a value; nested holds are counted by the client).
--
-- See rwmutex_lock for the keys. The member stays for a moment with score
-- -(now + keep), which marks it released: a retried RUnlock whose first
-- try's reply was lost then succeeds instead of reporting a loss. When the
-- last live reader leaves, one waiting writer per subscribed process is
-- woken, and the set expires when the marks do (the keep time) instead of
-- a reader's lease after the last read.
--
-- KEYS[1]  readers sorted set
-- KEYS[2]  writers' wake-up channel
-- ARGV[1]  read acquisition id
-- ARGV[2]  "s" to publish with SPUBLISH (cluster), else PUBLISH
-- ARGV[3]  how long the released member is kept, in milliseconds
--
-- Returns  0 when released (now or by an earlier try), -1 when the
--          acquisition is not held (expired, deleted, forced).
-- Complexity: O(log R) for R readers, plus the publish.
local function num(x) return string.format('%.0f', x) end
local s = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if not s then
  return -1
end
if s < 0 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if s <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return -1
end
local keep = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], num(-(now + keep)), ARGV[1])
if redis.call('PTTL', KEYS[1]) < keep then
  redis.call('PEXPIRE', KEYS[1], keep)
end
if redis.call('ZCOUNT', KEYS[1], '(' .. num(now), '+inf') == 0 then
  -- No live reader is left: the set need only last as long as the
  -- released members' marks, not a reader's lease.
  redis.call('PEXPIRE', KEYS[1], keep)
  if ARGV[2] == 's' then
    redis.call('SPUBLISH', KEYS[2], '1')
  else
    redis.call('PUBLISH', KEYS[2], '1')
  end
end
return 0
