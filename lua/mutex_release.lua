-- mutex_release: end a hold of a reentrant lease lock, and hand the lock
-- straight to the first live waiter of its queue, if any.
--
-- Three callers, one release:
--   ARGV[1] = "u"  Unlock by the owner of the acquisition named by its
--                  token. The client sends the holds it has; the lock is
--                  left with one fewer, so a retry after a lost reply does
--                  not remove two. A retried final Unlock is recognised
--                  through r ("owner token" of the last release).
--   ARGV[1] = "a"  give-back of an abandoned Lock (its caller stopped
--                  waiting, or the connection failed). It leaves a
--                  tombstone (nonce -> seq, kept for a lease) so that the
--                  attempt refuses itself if it reaches Redis later, takes
--                  the attempt's queue entry out, and releases the lock if
--                  that very attempt holds it (granted by itself or handed
--                  to it), never a hold a later attempt made.
--   ARGV[1] = "f"  ForceUnlock: release whoever holds it.
--
-- On release the hash keeps only the token (for the next token) and r, for
-- a short time. Then the queue (fair waiters, see mutex_lock) is looked at:
-- up to 16 dead entries at its head are dropped, and the first live waiter
-- is granted the lock at once, with a new token and a lease that ends when
-- its queue entry would have (so a waiter that died since its last refresh
-- blocks the lock no longer than its entry's lease), and told so by a
-- message "g <attempt> <token>". With no live waiter, "1" wakes one waiter
-- per subscribed process to try.
--
-- KEYS[1]  lock hash
-- KEYS[2]  wake-up channel
-- KEYS[3]  queue: sorted set of attempt ids by arrival
-- KEYS[4]  queue entries: attempt id -> "expiry_ms owner"
-- KEYS[5]  tombstones: nonce -> highest abandoned seq
-- ARGV[2]  "s" to publish with SPUBLISH (cluster), else PUBLISH
-- ARGV[3]  how long the released hash is kept, in milliseconds
-- ARGV[4]  u: owner id     a: owner id               f: unused
-- ARGV[5]  u: holds (>= 1) a: attempt id "nonce.seq"  f: unused
-- ARGV[6]  u: token        a: tombstone lifetime ms  f: unused
--
-- Returns  u: holds left (0: released), or -1 when the owner does not hold
--          that acquisition;
--          a, f: 1 if a hold was released, else 0.
-- Complexity: O(log Q) for Q queued waiters, plus the publish.
local mode = ARGV[1]
local h = redis.call('HMGET', KEYS[1], 'o', 'f', 'r', 'a')

local function publish(msg)
  if ARGV[2] == 's' then
    redis.call('SPUBLISH', KEYS[2], msg)
  else
    redis.call('PUBLISH', KEYS[2], msg)
  end
end

if mode == 'u' then
  if h[1] ~= ARGV[4] or h[2] ~= ARGV[6] then
    if h[3] == ARGV[4] .. ' ' .. ARGV[6] then
      return 0 -- an earlier try of this Unlock released it; its reply was lost
    end
    return -1
  end
  local n = tonumber(ARGV[5]) - 1
  if n > 0 then
    redis.call('HSET', KEYS[1], 'n', n)
    return n
  end
  redis.call('HSET', KEYS[1], 'r', ARGV[4] .. ' ' .. ARGV[6])
elseif mode == 'a' then
  local nonce, seq = string.match(ARGV[5], '^(.*)%.(%d+)$')
  if not nonce then
    return redis.error_reply('mutex_release: malformed attempt id')
  end
  local dead = tonumber(redis.call('HGET', KEYS[5], nonce))
  if not dead or dead < tonumber(seq) then
    redis.call('HSET', KEYS[5], nonce, seq)
  end
  if redis.call('PTTL', KEYS[5]) < tonumber(ARGV[6]) then
    redis.call('PEXPIRE', KEYS[5], ARGV[6])
  end
  redis.call('ZREM', KEYS[3], ARGV[5])
  redis.call('HDEL', KEYS[4], ARGV[5])
  if h[1] ~= ARGV[4] or h[4] ~= ARGV[5] then
    return 0
  end
elseif not h[1] then
  return 0
end

redis.call('HDEL', KEYS[1], 'o', 'n', 'a')
redis.call('PEXPIRE', KEYS[1], ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _ = 1, 16 do
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not head then
    break
  end
  redis.call('ZREM', KEYS[3], head)
  local e = redis.call('HGET', KEYS[4], head)
  redis.call('HDEL', KEYS[4], head)
  local expiry, owner = nil, nil
  if e then
    expiry, owner = string.match(e, '^(%d+) (.*)$')
    expiry = tonumber(expiry)
  end
  if expiry and expiry > now then
    local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local last = tonumber(h[2])
    if last and last >= token then
      token = last + 1
    end
    local ft = string.format('%.0f', token)
    redis.call('HSET', KEYS[1], 'o', owner, 'n', 1, 'f', ft, 'a', head)
    redis.call('PEXPIRE', KEYS[1], string.format('%d', expiry - now))
    publish('g ' .. head .. ' ' .. ft)
    return mode == 'u' and 0 or 1
  end
end
publish('1')
return mode == 'u' and 0 or 1
