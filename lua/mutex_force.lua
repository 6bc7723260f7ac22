-- mutex_force: release a lock whoever holds it (an operator's tool) and wake
-- one waiter per subscribed process. The token is kept, briefly, as after
-- any release.
--
-- KEYS[1]  lock hash
-- KEYS[2]  wake-up channel
-- ARGV[1]  "s" to publish with SPUBLISH (cluster), else PUBLISH
-- ARGV[2]  how long the released hash is kept, in milliseconds
--
-- Returns  1 if the lock was held, else 0.
-- Complexity: O(1) plus the publish.
if redis.call('HEXISTS', KEYS[1], 'o') == 0 then
  return 0
end
redis.call('HDEL', KEYS[1], 'o', 'n', 'a')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if ARGV[1] == 's' then
  redis.call('SPUBLISH', KEYS[2], '1')
else
  redis.call('PUBLISH', KEYS[2], '1')
end
return 1
