-- rwmutex_lock: take, or re-enter, the write side of a read-write lock.
--
-- State hash: o = writer's owner id, n = its holds, f = fencing token of the
-- current (or last) write acquisition, a = the attempt that made it (see
-- rwmutex_abandon), e = end of the writer's lease (server ms), r = "owner
-- token" of the last write release and c = the run of write holds (so a
-- retried Unlock can tell its first try succeeded; see below), q = end of
-- the writer-waiting mark (server ms): the latest
-- end of the waiting writers' own marks, kept in a sorted set (member = the
-- waiting Lock's mark id, score = end of its mark). A writer holds while o
-- is set and e is in the future: expiry is judged from e, not from the
-- key's TTL, which only collects garbage and may be longer (it also covers
-- the mark and f).
--
-- Readers: a sorted set, member = read acquisition id, score = end of its
-- lease (server ms). A released read acquisition stays for a moment with
-- score -(release time + keep) so a retried RUnlock can tell; entries with a
-- score in [-now, now] (expired, or released long enough ago) are garbage,
-- removed at most 16 per call by this script and rwmutex_rlock.
--
-- Starvation: an outermost Lock that is refused (readers or another writer
-- hold) sets its own mark for ARGV[6] ms and pushes q to its end if later;
-- while q is in the future, rwmutex_rlock refuses new read acquisitions
-- (nested ones and the writer's own go through), so the readers drain and
-- the writer gets in. The waiting writer refreshes its mark on each
-- attempt; a writer that vanishes blocks new readers for one mark at most.
-- A grant takes the granted Lock's own mark out, and q comes back to the
-- latest mark still running (rwmutex_abandon does the same for a Lock that
-- gives up): one writer's grant or withdrawal never ends a mark that
-- another waiting writer, of this RWMutex value or another, still set.
--
-- Tokens are the server's TIME in microseconds, or one more than the last
-- token if that is larger (f stays for a while after a release).
--
-- c is the run of write holds, as in mutex_lock: the token where it starts,
-- then the tokens of the write holds in it that ended otherwise than by
-- their owner's Unlock (at most 16, oldest first; a 17th pushes the oldest
-- out and the run starts after it). A grant on a hash without f starts a
-- run; a grant that finds o still there lists the hold it replaces (its
-- lease ran out, or this owner's is superseded: an Unlock, a give-back and
-- ForceUnlock take o out); a give-back (rwmutex_abandon) and ForceUnlock
-- list the hold they end. A retried Unlock is told its first try released
-- the lock when its token is in the run and not listed (rwmutex_unlock).
-- Listing reads c, on those rare paths only.
--
-- The same value's attempts are ordered (ids "nonce.seq"), as in
-- mutex_lock: an attempt older than the one holding is refused, and one
-- whose give-back came first (a tombstone naming it) refuses itself.
--
-- KEYS[1]  state hash
-- KEYS[2]  readers sorted set
-- KEYS[3]  tombstones hash: abandoned attempt id -> 1
-- KEYS[4]  writers' marks: sorted set, mark id -> end of the mark (ms)
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  write holds the owner's client has now (0 for an outermost Lock)
-- ARGV[4]  attempt id "nonce.seq" of an outermost Lock (ignored if nested)
-- ARGV[5]  token of the hold a nested Lock joins (ignored if outermost)
-- ARGV[6]  writer-waiting mark to set if refused, in ms (0: none, TryLock)
-- ARGV[7]  the Lock's mark id (one per Lock call; "" for TryLock)
--
-- Returns  {1, holds, token} when the owner holds the write lock now;
--          {0, ms until the writer's lease, or the first reader's, ends, 0}
--          when refused;
--          {-1, 0, 0} when a nested Lock's acquisition is gone.
-- Complexity: O(log R + log W) for R readers and W waiting writers, plus at
--          most 16 removals of each. A grant that replaces an expired or
--          superseded hold reads c (one more call).
local function num(x) return string.format('%.0f', x) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'o', 'f', 'a', 'e', 'q')
local e = tonumber(h[4]) or 0
local held = h[1] and e > now
local holds = tonumber(ARGV[3])

if holds > 0 then
  if held and h[1] == ARGV[1] and h[2] == ARGV[5] then
    redis.call('HSET', KEYS[1], 'n', holds + 1)
    return {1, holds + 1, tonumber(h[2])}
  end
  return {-1, 0, 0}
end

local an, as = string.match(ARGV[4], '^(.*)%.(%d+)$')
if not an then
  return redis.error_reply('rwmutex_lock: malformed attempt id')
end
if redis.call('HEXISTS', KEYS[3], ARGV[4]) == 1 then
  return {0, held and e - now or 0, 0}
end

local mark = tonumber(ARGV[6])
local function refuse(wait)
  if mark > 0 and ARGV[7] ~= '' then
    redis.call('ZADD', KEYS[4], num(now + mark), ARGV[7])
    if redis.call('PTTL', KEYS[4]) < mark then
      redis.call('PEXPIRE', KEYS[4], mark)
    end
    if (tonumber(h[5]) or 0) < now + mark then
      redis.call('HSET', KEYS[1], 'q', num(now + mark))
    end
    if redis.call('PTTL', KEYS[1]) < mark then
      redis.call('PEXPIRE', KEYS[1], mark)
    end
  end
  return {0, math.max(wait, 1), 0}
end

if held and h[1] ~= ARGV[1] then
  return refuse(e - now)
end
if held and h[3] then
  local hn, hs = string.match(h[3], '^(.*)%.(%d+)$')
  if hn == an and tonumber(as) < tonumber(hs) then
    return {0, e - now, 0}
  end
end

-- Readers hold: wait for the first lease to end, not the last. A reader
-- whose lease runs out publishes nothing, and the others' releases wake
-- the writers only when no live reader is left. (Read before the old
-- members go: while the slot migrates, a script may not touch again a key
-- it emptied.)
local first = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. num(now), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local old = redis.call('ZRANGEBYSCORE', KEYS[2], num(-now), num(now), 'LIMIT', 0, 16)
if #old > 0 then
  redis.call('ZREM', KEYS[2], unpack(old))
end
if #first > 0 then
  return refuse(tonumber(first[2]) - now)
end

local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(h[2])
if last and last >= token then
  token = last + 1
end
local lease = tonumber(ARGV[2])
if not h[2] then
  -- A new hash (or one whose last token expired): a new run.
  redis.call('HSET', KEYS[1], 'o', ARGV[1], 'n', 1, 'f', num(token), 'a', ARGV[4], 'e', num(now + lease), 'c', num(token))
elseif h[1] then
  -- The last write hold ended otherwise (its lease ran out, or this
  -- owner's is superseded): c lists its token.
  local c = {}
  for x in string.gmatch(redis.call('HGET', KEYS[1], 'c') or '', '%d+') do
    c[#c + 1] = x
  end
  if #c == 0 then
    c[1] = num(tonumber(h[2]) + 1)
  else
    c[#c + 1] = h[2]
    if #c > 17 then
      c[1] = num(tonumber(table.remove(c, 2)) + 1)
    end
  end
  redis.call('HSET', KEYS[1], 'o', ARGV[1], 'n', 1, 'f', num(token), 'a', ARGV[4], 'e', num(now + lease), 'c', table.concat(c, ' '))
else
  redis.call('HSET', KEYS[1], 'o', ARGV[1], 'n', 1, 'f', num(token), 'a', ARGV[4], 'e', num(now + lease))
end
if h[5] and ARGV[7] ~= '' and redis.call('ZSCORE', KEYS[4], ARGV[7]) then
  -- This writer's mark goes, q comes back to the latest mark still
  -- running (as in rwmutex_abandon), and marks of writers that vanished
  -- go, 16 at most. The marks are read before any is removed, and removed
  -- in one ZREM: while the slot migrates, a script may not touch again a
  -- key it emptied.
  local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', num(now), 'LIMIT', 0, 16)
  local top2 = redis.call('ZRANGE', KEYS[4], -2, -1, 'WITHSCORES')
  redis.call('ZREM', KEYS[4], ARGV[7], unpack(dead))
  local top = nil -- the latest mark but this writer's
  for i = #top2 - 1, 1, -2 do
    if top2[i] ~= ARGV[7] then
      top = tonumber(top2[i + 1])
      break
    end
  end
  if top and top > now then
    redis.call('HSET', KEYS[1], 'q', num(top))
  else
    redis.call('HDEL', KEYS[1], 'q')
  end
end
if redis.call('PTTL', KEYS[1]) < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
end
return {1, 1, token}
