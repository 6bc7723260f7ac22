-- mutex_renew: give a held lock a new lease (Mutex.Extend of a fixed
-- lease; the watchdog renews with mutex_renew_batch).
--
-- Waiting Locks sleep at most until the end of the lease they were refused
-- under (see mutex_lock). A new lease that ends before the old one would
-- leave them asleep past the hold's end, and if the hold then runs out, the
-- hash goes with its w, so that the next hash's releases publish nothing:
-- so when a Lock was refused while the hash lived (w), a shorter lease
-- wakes every waiter, and each one's next refusal gives it the new lease.
--
-- KEYS[1]  lock hash
-- KEYS[2]  wake-up channel
-- ARGV[1]  owner id
-- ARGV[2]  token of the acquisition
-- ARGV[3]  lease in milliseconds
-- ARGV[4]  "s" to publish with SPUBLISH (cluster), else PUBLISH
--
-- Returns  1 if renewed, 0 if the owner no longer holds that acquisition.
-- Complexity: O(1): HMGET, PTTL, PEXPIRE, and for a shorter lease HEXISTS
--          and, with waiters, the publish.
local h = redis.call('HMGET', KEYS[1], 'o', 'f')
if h[1] == ARGV[1] and h[2] == ARGV[2] then
  if redis.call('PTTL', KEYS[1]) > tonumber(ARGV[3]) and redis.call('HEXISTS', KEYS[1], 'w') == 1 then
    redis.call(ARGV[4] == 's' and 'SPUBLISH' or 'PUBLISH', KEYS[2], '1000000')
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
