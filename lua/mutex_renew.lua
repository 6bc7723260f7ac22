-- mutex_renew: give a held lock a new lease (Mutex.Extend of a fixed
-- lease; the watchdog renews with mutex_renew_batch).
--
-- Waiting Locks sleep at most until the end of the lease they were refused
-- under (see mutex_lock). A new lease that ends before the old one would
-- leave them asleep past the hold's end, and if the hold then runs out, the
-- record goes with its w, so that the next record's releases publish
-- nothing: so when a Lock was refused while the record lived (w), a
-- shorter lease wakes every waiter, and each one's next refusal gives it
-- the new lease.
--
-- KEYS[1]  lock record (see mutex_lock)
-- KEYS[2]  wake-up channel
-- ARGV[1]  owner id
-- ARGV[2]  token of the acquisition
-- ARGV[3]  lease in milliseconds
-- ARGV[4]  "s" to publish with SPUBLISH (cluster), else PUBLISH
--
-- Returns  1 if renewed, 0 if the owner no longer holds that acquisition.
--          A key whose value is not a lock record fails with WRONGTYPE.
-- Complexity: O(1): GET, PEXPIRE, and with w a PTTL and, for a shorter
--          lease, the publish.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local k, f = string.match(v, '^L(%l*):(%d+):')
local s = f and string.find(v, '|', #k + #f + 3, true)
local o
if s and s < #v then
  o = string.match(v, '^%d+:[^:]+:(.+)$', s + 1)
  s = o and s
end
if not s then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
if o == ARGV[1] and f == ARGV[2] then
  if string.find(k, 'w', 1, true) and redis.call('PTTL', KEYS[1]) > tonumber(ARGV[3]) then
    redis.call(ARGV[4] == 's' and 'SPUBLISH' or 'PUBLISH', KEYS[2], '1000000')
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
