-- mutex_lock: take, or re-enter, a reentrant lease lock.
--
-- The lock is a hash: o = owner id, n = holds, f = fencing token of the
-- current acquisition, a = the attempt that made it (see mutex_abandon),
-- r = "owner token" of the last release (kept so that a retried Unlock can
-- tell its first try succeeded). A hash without o is free.
--
-- The owner's client counts its holds and sends the count, so a Lock retried
-- after a lost reply cannot add a second hold.
--
-- A nested Lock (holds > 0) joins the acquisition named by its token and
-- leaves the lease alone (it belongs to the outer hold). If that acquisition
-- is gone (expired, deleted, taken over, even by the same owner id) it is
-- refused: the client must report the loss, not start a hold the outer
-- section believes continuous.
--
-- An outermost Lock (holds = 0) always starts a new acquisition with a new
-- token, even when the hash still names this owner: the client declared the
-- previous hold lost (its loss margin passed before the server's lease),
-- a reply was lost, or another process took over with the same owner id
-- (WithOwner after a restart). Handing out the old token again would let two
-- writers present the same token. The one exception is an attempt older
-- than the one that made the current hold, from the same Mutex value
-- (attempt ids are "nonce.seq", seq increasing per value): it was abandoned
-- by its caller and arrives late; granting it would re-tag the hold so that
-- its give-back released the newer hold, so it is refused. An attempt
-- whose caller gave up before the reply is refused too if its give-back
-- (mutex_abandon) got here first and left a tombstone: the give-back is
-- sent at once, without waiting for the attempt's reply, so the two can
-- reach Redis in either order and neither order leaves a grant nobody
-- knows of.
--
-- Fencing tokens are the server's TIME in microseconds, or one more than the
-- previous token if that is larger (it is kept briefly after a release), so
-- they increase across acquisitions without a counter key that lives forever.
--
-- KEYS[1]  lock hash
-- KEYS[2]  tombstones: Mutex value nonce -> highest abandoned attempt seq
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  holds the owner's client has now (0 for an outermost Lock)
-- ARGV[4]  attempt id "nonce.seq" of an outermost Lock (ignored when nested)
-- ARGV[5]  token of the hold a nested Lock joins (ignored when outermost)
--
-- Returns  {1, holds, token} when the owner holds the lock now;
--          {0, remaining lease in ms (-1: no TTL), 0} when another owner
--          (or a newer attempt of the same Mutex) does, or the attempt was
--          abandoned ({0, 0, 0} if the lock is free);
--          {-1, 0, 0} when a nested Lock's acquisition is gone.
-- Complexity: O(1).
local h = redis.call('HMGET', KEYS[1], 'o', 'f', 'a')
local holds = tonumber(ARGV[3])

if holds > 0 then
  if h[1] == ARGV[1] and h[2] == ARGV[5] then
    redis.call('HSET', KEYS[1], 'n', holds + 1)
    return {1, holds + 1, tonumber(h[2])}
  end
  return {-1, 0, 0}
end

if h[1] and h[1] ~= ARGV[1] then
  return {0, redis.call('PTTL', KEYS[1]), 0}
end
local an, as = string.match(ARGV[4], '^(.*)%.(%d+)$')
if not an then
  return redis.error_reply('mutex_lock: malformed attempt id')
end
if h[1] and h[3] then
  local hn, hs = string.match(h[3], '^(.*)%.(%d+)$')
  if hn == an and tonumber(as) < tonumber(hs) then
    return {0, redis.call('PTTL', KEYS[1]), 0}
  end
end
local dead = redis.call('HGET', KEYS[2], an)
if dead and tonumber(as) <= tonumber(dead) then
  return {0, h[1] and redis.call('PTTL', KEYS[1]) or 0, 0}
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
