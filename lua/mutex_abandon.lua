-- mutex_abandon: give back an acquisition whose caller gave up waiting for
-- the reply of its Lock, so that nobody holds a lock nobody knows of.
--
-- The client sends this once the late reply of the abandoned attempt shows
-- a grant (or its connection failed, outcome unknown). It releases only if
-- the hold was made by that very attempt: a later Lock of the same Mutex
-- records its own attempt id, and mutex_lock refuses an older attempt that
-- arrives after a newer one holds, so the give-back cannot hit a newer hold.
--
-- KEYS[1]  lock hash
-- KEYS[2]  wake-up channel
-- ARGV[1]  owner id
-- ARGV[2]  attempt id of the abandoned Lock
-- ARGV[3]  "s" to publish with SPUBLISH (cluster), else PUBLISH
-- ARGV[4]  how long the released hash is kept, in milliseconds
--
-- Returns  1 if the abandoned attempt had acquired the lock and it was
--          released, else 0.
-- Complexity: O(1) plus the publish.
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
