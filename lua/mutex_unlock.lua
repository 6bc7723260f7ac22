-- mutex_unlock: give back one hold of a reentrant lease lock; on the last,
-- release it and wake one waiter per subscribed process.
--
-- Only the owner, for the acquisition named by its token, can unlock. The
-- client sends the holds it has; the lock is left with one fewer, so a retry
-- after a lost reply does not remove two. On release the hash keeps only the
-- token (for the next token) and r = "owner token" (so a retried final
-- Unlock succeeds), for a short time.
--
-- KEYS[1]  lock hash
-- KEYS[2]  wake-up channel
-- ARGV[1]  owner id
-- ARGV[2]  holds the owner's client has (>= 1)
-- ARGV[3]  token of the acquisition
-- ARGV[4]  "s" to publish with SPUBLISH (cluster), else PUBLISH
-- ARGV[5]  how long the released hash is kept, in milliseconds
--
-- Returns  holds left (0: released), or -1 when the owner does not hold it.
-- Complexity: O(1) plus the publish (O(subscribers of the channel)).
local h = redis.call('HMGET', KEYS[1], 'o', 'f', 'r')

if h[1] == ARGV[1] and h[2] == ARGV[3] then
  local n = tonumber(ARGV[2]) - 1
  if n > 0 then
    redis.call('HSET', KEYS[1], 'n', n)
    return n
  end
  redis.call('HDEL', KEYS[1], 'o', 'n', 'a')
  redis.call('HSET', KEYS[1], 'r', ARGV[1] .. ' ' .. ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  if ARGV[4] == 's' then
    redis.call('SPUBLISH', KEYS[2], '1')
  else
    redis.call('PUBLISH', KEYS[2], '1')
  end
  return 0
end
if h[3] == ARGV[1] .. ' ' .. ARGV[3] then
  return 0 -- an earlier try of this Unlock released it; its reply was lost
end
return -1
