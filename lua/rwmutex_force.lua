-- rwmutex_force: release a read-write lock whoever holds it, writer and
-- readers alike (an operator's tool), and wake the waiters. The last token
-- is kept, briefly, as after any release, with the write hold listed in c
-- as one that ended otherwise (see rwmutex_lock); a writer-waiting mark
-- stays.
--
-- Wake-up payloads as in rwmutex_unlock.
--
-- KEYS[1]  state hash
-- KEYS[2]  readers sorted set
-- KEYS[3]  readers' wake-up channel
-- KEYS[4]  writers' wake-up channel
-- ARGV[1]  "s" to publish with SPUBLISH (cluster), else PUBLISH
-- ARGV[2]  how long the released hash is kept, in milliseconds
--
-- Returns  {1 if a writer held it else 0, number of live readers released}.
-- Complexity: O(R) for R readers (the set is deleted), plus the publishes;
--          a forced write hold reads and writes c (two more calls).
local function num(x) return string.format('%.0f', x) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'o', 'e', 'q')
local writer = 0
if h[1] and (tonumber(h[2]) or 0) > now then
  writer = 1
end
if h[1] then
  -- The write hold ends otherwise than by its owner's Unlock: c lists its
  -- token (see rwmutex_lock).
  local fc = redis.call('HMGET', KEYS[1], 'f', 'c')
  local c = {}
  for x in string.gmatch(fc[2] or '', '%d+') do
    c[#c + 1] = x
  end
  if #c == 0 then
    c[1] = num(tonumber(fc[1]) + 1)
  else
    c[#c + 1] = fc[1]
    if #c > 17 then
      c[1] = num(tonumber(table.remove(c, 2)) + 1)
    end
  end
  redis.call('HDEL', KEYS[1], 'o', 'n', 'a', 'e')
  redis.call('HSET', KEYS[1], 'c', table.concat(c, ' '))
  redis.call('PEXPIRE', KEYS[1], math.max(tonumber(ARGV[2]), (tonumber(h[3]) or 0) - now))
end
local readers = redis.call('ZCOUNT', KEYS[2], '(' .. num(now), '+inf')
redis.call('DEL', KEYS[2])
if writer + readers > 0 then
  local pub = ARGV[1] == 's' and 'SPUBLISH' or 'PUBLISH'
  redis.call(pub, KEYS[4], '1')
  redis.call(pub, KEYS[3], '1000000')
end
return {writer, readers}
