-- mutex_lock: take, or re-enter, a reentrant lease lock.
--
-- The lock is a hash: o = owner id, n = holds, f = fencing token of the
-- current acquisition, a = the attempt that made it (see mutex_abandon),
-- r = "owner token" of the last release (kept so that a retried Unlock can
-- tell its first try succeeded). A hash without o is free.
-- The owner's client counts its holds and sends the count, so a Lock retried
-- after a lost reply cannot add a second hold. A fresh acquisition sets the
-- lease; a nested one leaves it alone (the lease belongs to the outer hold).
--
-- Fencing tokens are the server's TIME in microseconds, or one more than the
-- previous token if that is larger (it is kept briefly after a release), so
-- they increase across acquisitions without a counter key that lives forever.
--
-- KEYS[1]  lock hash
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  holds the owner's client has now (0 for an outermost Lock)
-- ARGV[4]  attempt id of an outermost Lock (ignored when nested)
--
-- Returns  {1, holds, token} when the owner holds the lock now;
--          {0, remaining lease in ms (-1: no TTL), 0} when another owner does.
-- Complexity: O(1).
local h = redis.call('HMGET', KEYS[1], 'o', 'f')
local holds = tonumber(ARGV[3])

if h[1] == ARGV[1] then
  local n = holds + 1
  if holds == 0 then
    redis.call('HSET', KEYS[1], 'n', n, 'a', ARGV[4])
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  else
    redis.call('HSET', KEYS[1], 'n', n)
  end
  return {1, n, tonumber(h[2])}
end
if h[1] then
  return {0, redis.call('PTTL', KEYS[1]), 0}
end

local t = redis.call('TIME')
local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(h[2])
if last and last >= token then
  token = last + 1
end
redis.call('HSET', KEYS[1], 'o', ARGV[1], 'n', 1, 'f', string.format('%.0f', token), 'a', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, 1, token}
