-- semaphore_release: give back one permit of a counting semaphore and, if
-- an Acquire may be waiting, wake as many waiters as the free permits
-- allow.
--
-- Layout as in semaphore_acquire. Only the permit's own entries are
-- removed, so a release of a permit that is gone (released, expired and
-- reclaimed, deleted) frees nothing and changes nothing; without the
-- state hash nothing listed is counted, so nothing is held. A permit that
-- expired but is still listed is removed and reported as not held, unless
-- the caller says it need not be judged (ARGV[3] "n": its own clock puts
-- the release well inside the lease, so the server's expiry lies ahead of
-- it; a permit still listed is still counted, so nobody else was granted
-- its capacity); that saves the release TIME and ZSCORE. Other expired
-- permits are left for the acquire that finds them in its way
-- (semaphore_acquire). When ':w' says an Acquire may be waiting, the
-- number of permits now free (at least 1) is published as the wake-up
-- budget; with no waiter, nothing is published. The keys are deleted with
-- the last permit, except that a capacity set by SetCapacity stays in the
-- hash for as long as ':set' says; a release that leaves permits listed
-- makes both keys live that long too (their expiry only moved later),
-- since their holders may never release or renew them.
--
-- KEYS[1]  state hash
-- KEYS[2]  permits sorted set
-- KEYS[3]  wake-up channel; optional: without it, KEYS[1] .. ':w' (as in
--          semaphore_acquire)
-- ARGV[1]  permit id
-- ARGV[2]  "s" to publish with SPUBLISH (cluster), else PUBLISH
-- ARGV[3]  "n" not to judge whether the permit expired (see above);
--          anything else, or nothing, to judge it
--
-- Returns  1 if the permit was held (live, or not judged) and is now
--          released, 0 if it was not held.
-- Complexity: O(log N) for N permits held, plus the publish. A release of
--          one permit not judged makes three calls and writes nothing but
--          the permit: HMGET, ZREM and ZCARD (with DEL for the last
--          permit), and a PUBLISH if ':w'; judging adds ZSCORE and TIME, a
--          heavier permit's weight field an HDEL and an HSET of ':h'.
local id = ARGV[1]
local h = redis.call('HMGET', KEYS[1], ':cap', ':set', ':w', ':h', id)
if not h[1] then
  return 0
end
local held = 1
if ARGV[3] ~= 'n' then
  local score = tonumber(redis.call('ZSCORE', KEYS[2], id))
  if not score then
    return 0
  end
  local t = redis.call('TIME')
  if score <= t[1] * 1000 + math.floor(t[2] / 1000) then
    held = 0
  end
end
-- The permits left are counted before the removal, which may delete the
-- key: while the slot migrates, a script may touch only keys its node
-- holds, and one it deleted is refused too, with its earlier writes made.
local count = redis.call('ZCARD', KEYS[2]) - 1 -- permits still listed
if redis.call('ZREM', KEYS[2], id) == 0 then
  return 0
end
local extra = tonumber(h[4]) or 0
if h[5] then
  extra = extra - (h[5] - 1)
end
local keep = tonumber(h[2])
if count == 0 then
  -- The last permit went: so do the keys, but a set capacity. That hash
  -- keeps ':cap' and ':set' and loses the rest in place, not deleted and
  -- written again (refused while the slot migrates, as above). The rest
  -- is the fields below and this permit's weight: expired permits'
  -- weights go with them (semaphore_acquire).
  extra = 0
  if keep then
    redis.call('HDEL', KEYS[1], ':h', ':w', ':x', id)
    redis.call('PEXPIRE', KEYS[1], keep)
  else
    redis.call('DEL', KEYS[1])
  end
else
  if h[5] then
    redis.call('HDEL', KEYS[1], id)
    redis.call('HSET', KEYS[1], ':h', extra)
  end
  -- PTTL counts from a time no earlier than now less 1 ms: hence the + 1.
  if keep and redis.call('PTTL', KEYS[2]) < keep + 1 then
    local t = redis.call('TIME')
    local at = t[1] * 1000 + math.floor(t[2] / 1000) + keep + 1
    redis.call('PEXPIREAT', KEYS[1], at)
    redis.call('PEXPIREAT', KEYS[2], at)
  end
end
if h[3] then
  local free = math.max(h[1] - count - extra, 1)
  local channel = KEYS[3] or KEYS[1] .. ':w'
  if ARGV[2] == 's' then
    redis.call('SPUBLISH', channel, free)
  else
    redis.call('PUBLISH', channel, free)
  end
end
return held
