-- rwmutex_unlock: give back one write hold of a read-write lock; on the
-- last, release the write lock and wake waiters.
--
-- See rwmutex_lock for the keys. Only the owner, for the acquisition named
-- by its token and while its lease runs, can unlock. The client sends the
-- holds it has; the lock is left with one fewer, so a retry after a lost
-- reply does not remove two. On release f (for the next token), r = "owner
-- token" of this release and c (for a retried final Unlock) stay for a
-- moment, the mark for as long as it runs. A retried final Unlock is told
-- its first try released the lock (0): at once if it was the last write
-- release (r), else from c, however many write holds came since, as long
-- as the hash lives and at most 16 of them ended otherwise (see
-- rwmutex_lock).
--
-- The release wakes one waiting writer per process and every waiting
-- reader, also while a writer-waiting mark runs: the readers are refused
-- again then, and the refusal has each one sleep until the mark ends (a
-- mark whose writer vanished ends without a message, and a reader that
-- was refused while this writer held would sleep on until this writer's
-- lease would have ended). A message's payload is a wake-up budget (see
-- package notify): 1 wakes one waiter per process, 1000000 all of them.
--
-- KEYS[1]  state hash
-- KEYS[2]  readers' wake-up channel
-- KEYS[3]  writers' wake-up channel
-- ARGV[1]  owner id
-- ARGV[2]  write holds the owner's client has (>= 1)
-- ARGV[3]  token of the acquisition
-- ARGV[4]  "s" to publish with SPUBLISH (cluster), else PUBLISH
-- ARGV[5]  how long the released hash is kept, in milliseconds
--
-- Returns  holds left (0: released), or -1 when the owner does not hold it.
-- Complexity: O(1) plus the publishes (O(subscribers)); an Unlock retried
--          after another write release reads c (O(16)).
local h = redis.call('HMGET', KEYS[1], 'o', 'f', 'r', 'e', 'q')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

if h[1] == ARGV[1] and h[2] == ARGV[3] and (tonumber(h[4]) or 0) > now then
  local n = tonumber(ARGV[2]) - 1
  if n > 0 then
    redis.call('HSET', KEYS[1], 'n', n)
    return n
  end
  redis.call('HDEL', KEYS[1], 'o', 'n', 'a', 'e')
  redis.call('HSET', KEYS[1], 'r', ARGV[1] .. ' ' .. ARGV[3])
  local keep = tonumber(ARGV[5])
  local q = tonumber(h[5]) or 0
  redis.call('PEXPIRE', KEYS[1], math.max(keep, q - now))
  local pub = ARGV[4] == 's' and 'SPUBLISH' or 'PUBLISH'
  redis.call(pub, KEYS[3], '1')
  redis.call(pub, KEYS[2], '1000000')
  return 0
end
if h[3] == ARGV[1] .. ' ' .. ARGV[3] then
  return 0 -- an earlier try of this Unlock released it; its reply was lost
end
-- Not the last write release either: the earlier try released it if the
-- token lies in the run c keeps (see rwmutex_lock), else the hold was lost.
local f, mine = tonumber(h[2]), tonumber(ARGV[3])
if f and mine and (mine < f or (mine == f and not h[1])) then
  local run = false
  for x in string.gmatch(redis.call('HGET', KEYS[1], 'c') or '', '%d+') do
    x = tonumber(x)
    if not run then
      if x > mine then
        break
      end
      run = true
    elseif x == mine then
      run = false
      break
    end
  end
  if run then
    return 0
  end
end
return -1
