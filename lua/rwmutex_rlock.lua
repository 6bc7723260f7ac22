-- rwmutex_rlock: take, or re-enter, a read hold of a read-write lock.
--
-- See rwmutex_lock for the keys. Each outermost read acquisition is its own
-- member of the readers set, named by its attempt id, with its own lease
-- (the score), so a crashed reader's hold ends with its lease without
-- holding up a writer any longer.
--
-- An outermost RLock is refused while another owner's write lease runs, or
-- while a writer-waiting mark is in the future (writers are not starved).
-- It goes through both when this RWMutex value holds the write lock itself
-- (ARGV[5] names that acquisition): a writer may take read holds. A nested
-- RLock only checks that its acquisition is still there, so a reader that
-- holds is never blocked by a waiting writer (that would deadlock); the
-- client counts nested holds.
--
-- KEYS[1]  state hash
-- KEYS[2]  readers sorted set
-- KEYS[3]  tombstones hash
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  read holds the owner's client has now (0 for an outermost RLock)
-- ARGV[4]  outermost: the attempt id "nonce.seq", which becomes the read
--          acquisition id; nested: the id of the acquisition it joins
-- ARGV[5]  token of the write hold this value has, or "" if none
--
-- Returns  {1, 0, 0} when the read hold is granted (or nested);
--          {0, ms until the blocking writer's lease or mark ends, 0} when
--          refused; {-1, 0, 0} when a nested RLock's acquisition is gone.
-- Complexity: O(log R) for R readers, plus at most 16 removals.
local function num(x) return string.format('%.0f', x) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if tonumber(ARGV[3]) > 0 then
  local s = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[4]))
  if s and s > now then
    return {1, 0, 0}
  end
  return {-1, 0, 0}
end

if not string.find(ARGV[4], '^.*%.%d+$') then
  return redis.error_reply('rwmutex_rlock: malformed attempt id')
end
if redis.call('HEXISTS', KEYS[3], ARGV[4]) == 1 then
  return {0, 1, 0}
end

local h = redis.call('HMGET', KEYS[1], 'o', 'f', 'e', 'q')
local e = tonumber(h[3]) or 0
local held = h[1] and e > now
local mine = held and h[1] == ARGV[1] and ARGV[5] ~= '' and h[2] == ARGV[5]
if not mine then
  if held then
    return {0, e - now, 0}
  end
  local q = tonumber(h[4])
  if q and q > now then
    return {0, q - now, 0}
  end
end

-- The new reader is listed before the old ones go, so that the set is
-- never emptied and then written: while the slot migrates, a script may
-- not touch again a key it emptied.
local old = redis.call('ZRANGEBYSCORE', KEYS[2], num(-now), num(now), 'LIMIT', 0, 16)
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], num(now + lease), ARGV[4])
for i = #old, 1, -1 do
  if old[i] == ARGV[4] then
    table.remove(old, i) -- this attempt's own, listed again just now
  end
end
if #old > 0 then
  redis.call('ZREM', KEYS[2], unpack(old))
end
if redis.call('PTTL', KEYS[2]) < lease then
  redis.call('PEXPIRE', KEYS[2], lease)
end
return {1, 0, 0}
