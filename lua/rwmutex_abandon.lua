-- rwmutex_abandon: give back what an abandoned attempt of a read-write lock
-- took, or withdraw a writer-waiting mark whose writer gave up.
--
-- As mutex_abandon: the client sends this as soon as it abandons an attempt
-- (its context ended, or the connection failed with the outcome unknown),
-- without waiting for the attempt's reply, so it may reach Redis first. The
-- tombstone written here then makes rwmutex_lock or rwmutex_rlock refuse the
-- attempt when it arrives; if it arrives later, it releases exactly the
-- acquisition that attempt made (the write hold tagged with it, or the read
-- acquisition named by it) and nothing a later attempt took. Tombstones
-- live for a lease.
--
-- The writer-waiting mark of one Lock call, named by its mark id (ARGV[7]),
-- is withdrawn too, so readers are not held up for the rest of that mark
-- by a writer that gave up; the marks of other waiting writers, of this
-- RWMutex value or another, stay (see rwmutex_lock). Kind "m" only
-- withdraws it (a Lock that gave up while waiting); kind "w" also
-- withdraws the mark its Lock call left if the attempt was refused, in
-- case the attempt reached Redis before an "m" sent after it.
--
-- A write hold given back is listed in c (see rwmutex_lock), and its
-- release wakes every waiting reader, as rwmutex_unlock's does. A
-- withdrawal wakes the readers when it ends the mark, or brings its end
-- forward (another waiting writer's mark, shorter, still runs): readers
-- refused until the withdrawn mark's end would sleep through the other's.
--
-- Wake-up payloads as in rwmutex_unlock.
--
-- KEYS[1]  state hash
-- KEYS[2]  readers sorted set
-- KEYS[3]  tombstones hash
-- KEYS[4]  readers' wake-up channel
-- KEYS[5]  writers' wake-up channel
-- KEYS[6]  writers' marks (see rwmutex_lock)
-- ARGV[1]  owner id
-- ARGV[2]  attempt id "nonce.seq" ("m": the mark id)
-- ARGV[3]  "w" (a Lock), "r" (an RLock) or "m" (withdraw the mark)
-- ARGV[4]  "s" to publish with SPUBLISH (cluster), else PUBLISH
-- ARGV[5]  how long a released hash is kept, in milliseconds
-- ARGV[6]  how long the tombstone is kept (the lease), in milliseconds
-- ARGV[7]  the mark id of the attempt's Lock call, or "" (a read, TryLock)
--
-- Returns  1 if something was released or withdrawn, else 0.
-- Complexity: O(log R + log W) for R readers and W waiting writers, plus at
--          most 16 removals and the publishes; a write hold given back
--          reads and writes c (two more calls).
local function num(x) return string.format('%.0f', x) end
local nonce = string.match(ARGV[2], '^(.*)%.%d+$')
if not nonce then
  return redis.error_reply('rwmutex_abandon: malformed attempt id')
end
local pub = ARGV[4] == 's' and 'SPUBLISH' or 'PUBLISH'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local h = redis.call('HMGET', KEYS[1], 'o', 'a', 'q')
local q = tonumber(h[3]) or 0

-- Withdraw the Lock call's mark: q comes back to the latest mark still
-- running (as in rwmutex_lock), and marks of writers that vanished go, 16
-- at most. Readers are woken if no mark runs any more, or the mark now
-- ends sooner (unless told not to: a release below wakes them). Returns
-- whether there was a mark.
local function withdraw(wake)
  if ARGV[7] == '' or redis.call('ZREM', KEYS[6], ARGV[7]) == 0 then
    return false
  end
  local dead = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', num(now), 'LIMIT', 0, 16)
  if #dead > 0 then
    redis.call('ZREM', KEYS[6], unpack(dead))
  end
  local top = tonumber(redis.call('ZRANGE', KEYS[6], -1, -1, 'WITHSCORES')[2])
  if top and top > now then
    if h[3] and top ~= q then -- the hash outlives q, and q every mark
      redis.call('HSET', KEYS[1], 'q', num(top))
      if top < q and wake then
        -- Readers refused until q may go in sooner: they try again, and
        -- a refusal gives them the mark's new end.
        redis.call(pub, KEYS[4], '1000000')
      end
      q = top
    end
    return true
  end
  if h[3] then
    redis.call('HDEL', KEYS[1], 'q')
  end
  if q > now and wake then
    redis.call(pub, KEYS[4], '1000000') -- readers may go in now
  end
  q = 0
  return true
end

if ARGV[3] == 'm' then
  return withdraw(true) and 1 or 0
end

-- The tombstone names this attempt only: other Locks of the same value
-- (several goroutines may wait at once) are not abandoned.
redis.call('HSET', KEYS[3], ARGV[2], 1)
if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[6]) then
  redis.call('PEXPIRE', KEYS[3], ARGV[6])
end

if ARGV[3] == 'w' then
  if h[1] ~= ARGV[1] or h[2] ~= ARGV[2] then
    withdraw(true)
    return 0
  end
  withdraw(false)
  -- The hold ends otherwise than by its owner's Unlock: c lists its token
  -- (see rwmutex_lock).
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
  redis.call('PEXPIRE', KEYS[1], math.max(tonumber(ARGV[5]), q - now))
  redis.call(pub, KEYS[5], '1')
  redis.call(pub, KEYS[4], '1000000')
  return 1
end

local s = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[2]))
if not s or s <= now then
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[2])
if redis.call('ZCOUNT', KEYS[2], '(' .. num(now), '+inf') == 0 then
  -- No live reader left: the set lasts only as long as released marks
  -- (see rwmutex_runlock).
  if redis.call('PTTL', KEYS[2]) > tonumber(ARGV[5]) then
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
  end
  redis.call(pub, KEYS[5], '1')
end
return 1
