-- mutex_renew: extend the lease of a held lock (the watchdog's renewal, and
-- Mutex.Extend of a fixed lease).
--
-- KEYS[1]  lock hash
-- ARGV[1]  owner id
-- ARGV[2]  token of the acquisition
-- ARGV[3]  lease in milliseconds
--
-- Returns  1 if renewed, 0 if the owner no longer holds that acquisition.
-- Complexity: O(1).
local h = redis.call('HMGET', KEYS[1], 'o', 'f')
if h[1] == ARGV[1] and h[2] == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
