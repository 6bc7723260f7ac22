-- mutex_abandon: give back an acquisition whose caller gave up waiting for
-- the reply of its Lock, so that nobody holds a lock nobody knows of.
--
-- The client sends this as soon as it abandons an attempt (its context
-- ended, or the connection failed with the outcome unknown), without waiting
-- for the attempt's reply, so it may reach Redis before or after the
-- attempt. Either order works:
--   - after: the hold was made by that very attempt (a names it) and is
--     released; a later Lock of the same Mutex records its own attempt id,
--     and mutex_lock refuses an older attempt that arrives after a newer
--     one holds, so the give-back cannot hit a newer hold;
--   - before: the tombstone written here (nonce -> seq) makes mutex_lock
--     refuse the attempt when it arrives.
-- Tombstones live for a lease: an attempt delayed longer than that may
-- still grant, and the grant then ends with its lease, never later.
--
-- KEYS[1]  lock hash
-- KEYS[2]  wake-up channel
-- KEYS[3]  tombstones hash
-- ARGV[1]  owner id
-- ARGV[2]  attempt id "nonce.seq" of the abandoned Lock
-- ARGV[3]  "s" to publish with SPUBLISH (cluster), else PUBLISH
-- ARGV[4]  how long the released hash is kept, in milliseconds
-- ARGV[5]  how long the tombstone is kept (the lease), in milliseconds
--
-- Returns  1 if the abandoned attempt had acquired the lock and it was
--          released, else 0.
-- Complexity: O(1) plus the publish.
local nonce, seq = string.match(ARGV[2], '^(.*)%.(%d+)$')
if not nonce then
  return redis.error_reply('mutex_abandon: malformed attempt id')
end
local dead = tonumber(redis.call('HGET', KEYS[3], nonce))
if not dead or dead < tonumber(seq) then
  redis.call('HSET', KEYS[3], nonce, seq)
end
if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[5]) then
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
end

local h = redis.call('HMGET', KEYS[1], 'o', 'a')
if h[1] ~= ARGV[1] or h[2] ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], 'o', 'n', 'a')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if ARGV[3] == 's' then
  redis.call('SPUBLISH', KEYS[2], '1')
else
  redis.call('PUBLISH', KEYS[2], '1')
end
return 1
