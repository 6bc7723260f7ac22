-- mutex_release: end a hold of a reentrant lease lock, and hand the lock
-- straight to the first live waiter of its queue, if any.
--
-- Three callers, one release:
--   ARGV[1] = "u"  Unlock by the owner of the acquisition named by its
--                  token. The client sends the holds it has; the lock is
--                  left with one fewer, so a retry after a lost reply does
--                  not remove two. A retried final Unlock is recognised
--                  through c and f (see mutex_lock), however many holds
--                  began and ended since, as long as the hash lives and
--                  at most 16 of them ended otherwise.
--   ARGV[1] = "a"  give-back of an abandoned Lock (its caller stopped
--                  waiting, or the connection failed). It leaves a
--                  tombstone (its attempt id, kept for a lease) so that the
--                  attempt refuses itself if it reaches Redis later, takes
--                  the attempt's queue entry out, and releases the lock if
--                  that very attempt holds it (granted by itself or handed
--                  to it), never a hold a later attempt made.
--   ARGV[1] = "f"  ForceUnlock: release whoever holds it.
--
-- On release the hash keeps only the token (for the next token), c, k and
-- w, for a short time. An Unlock leaves c alone; the other modes end a hold
-- without its owner's Unlock and list it in c (see mutex_lock), so that the
-- holder's own Unlock is told it lost the lock, while an Unlock retried
-- for an earlier hold of the run is still told that its first try released
-- it. Then the queue (fair waiters, see mutex_lock) is looked at if k says
-- it may hold anyone (k = "q" or "qx"; a release that finds the queue empty
-- clears q): up to 16 dead entries at its head are dropped, and the first
-- live waiter is granted the lock at once, with a new token and a lease
-- that ends when its queue entry would have (so a waiter that died since
-- its last refresh blocks the lock no longer than its entry's lease), and
-- told so by a message "g <attempt> <token>". With no live waiter, "1"
-- wakes one waiter per subscribed process to try; an Unlock publishes it
-- only if a Lock may be waiting (w, see mutex_lock) or the queue was
-- flagged, while a give-back or ForceUnlock always does.
--
-- KEYS[1]  lock hash
-- KEYS[2]  wake-up channel
-- KEYS[3]  queue: sorted set of attempt ids by arrival
-- KEYS[4]  queue entries: attempt id -> "expiry_ms owner"
-- KEYS[5]  tombstones: abandoned attempt id -> 1
-- ARGV[2]  "s" to publish with SPUBLISH (cluster), else PUBLISH
-- ARGV[3]  how long the released hash is kept, in milliseconds
-- ARGV[4]  u: owner id     a: owner id               f: unused
-- ARGV[5]  u: holds (>= 1) a: attempt id "nonce.seq"  f: unused
-- ARGV[6]  u: token        a: tombstone lifetime ms  f: unused
--
-- Returns  u: holds left (0: released), or -1 when the owner does not hold
--          that acquisition;
--          a, f: 1 if a hold was released, else 0.
-- Complexity: O(log Q) for Q queued waiters, plus the publish. A final
--          Unlock with no queue flagged makes three calls (HMGET, HDEL,
--          PEXPIRE), and a PUBLISH if a Lock was refused while the hash
--          lived; TIME is read only when a queue entry is judged. Fields
--          only rare paths need are read there (see the cost note in
--          mutex_lock): c by a retried Unlock, and by a give-back or a
--          ForceUnlock that ends a hold (one more call).
local mode = ARGV[1]
local h = redis.call('HMGET', KEYS[1], 'o', 'f', 'k', 'w')
local k = h[3]
local c -- a, f: what c becomes, the ended hold listed
local setx = false -- a give-back whose tombstone the hash does not flag yet

if mode == 'u' then
  if h[1] ~= ARGV[4] or h[2] ~= ARGV[6] then
    -- Not the current hold: an earlier try of this Unlock released it and
    -- its reply was lost if the token lies in the current run (the hold it
    -- names ended by its owner's Unlock), else the hold was lost.
    -- The run is c's first token up to f, less the tokens c lists after
    -- it (see mutex_lock).
    local f, mine = tonumber(h[2]), tonumber(ARGV[6])
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
  end
  local n = tonumber(ARGV[5]) - 1
  if n > 0 then
    redis.call('HSET', KEYS[1], 'n', n)
    return n
  end
elseif mode == 'a' then
  if not string.find(ARGV[5], '^.*%.%d+$') then
    return redis.error_reply('mutex_release: malformed attempt id')
  end
  -- The tombstone names this attempt only: other Locks of the same Mutex
  -- value (several goroutines may wait at once) are not abandoned.
  redis.call('HSET', KEYS[5], ARGV[5], 1)
  if redis.call('PTTL', KEYS[5]) < tonumber(ARGV[6]) then
    redis.call('PEXPIRE', KEYS[5], ARGV[6])
  end
  redis.call('ZREM', KEYS[3], ARGV[5])
  redis.call('HDEL', KEYS[4], ARGV[5])
  -- Without f the hash is not there: whoever makes it asks the keys.
  setx = h[2] and k ~= 'x' and k ~= 'qx'
  if h[1] ~= ARGV[4] or redis.call('HGET', KEYS[1], 'a') ~= ARGV[5] then
    if setx then
      redis.call('HSET', KEYS[1], 'k', k == 'q' and 'qx' or 'x')
    end
    return 0
  end
elseif not h[1] then
  return 0
end

if mode ~= 'u' then
  -- The hold ends otherwise than by its owner's Unlock: c lists its token,
  -- and past 16 listed the oldest goes and the run starts after it (see
  -- mutex_lock).
  local t = {}
  for x in string.gmatch(redis.call('HGET', KEYS[1], 'c') or '', '%d+') do
    t[#t + 1] = x
  end
  if #t == 0 then
    c = string.format('%d', tonumber(h[2]) + 1)
  else
    t[#t + 1] = h[2]
    if #t > 17 then
      t[1] = string.format('%d', tonumber(table.remove(t, 2)) + 1)
    end
    c = table.concat(t, ' ')
  end
end

-- The hold ends. First the queue, if the hash says it may hold anyone.
local emptied = false
if k == 'q' or k == 'qx' then
  local t, now -- read once, when the first entry is judged
  for _ = 1, 16 do
    local head = redis.call('ZPOPMIN', KEYS[3])[1]
    if not head then
      emptied = true
      break
    end
    local e = redis.call('HGET', KEYS[4], head)
    if e then
      redis.call('HDEL', KEYS[4], head)
      if not t then
        t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      local expiry, owner = string.match(e, '^(%d+) (.*)$')
      expiry = tonumber(expiry)
      if expiry and expiry > now then
        local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
        local last = tonumber(h[2])
        if last and last >= token then
          token = last + 1
        end
        local ft = string.format('%d', token)
        -- One write for the release and the grant; the queue stays flagged.
        local w = {'o', owner, 'n', '1', 'f', ft, 'a', head}
        if mode ~= 'u' then
          w[9], w[10] = 'c', c
        end
        if setx then
          w[#w + 1], w[#w + 2] = 'k', 'qx'
        end
        redis.call('HSET', KEYS[1], unpack(w))
        redis.call('PEXPIRE', KEYS[1], string.format('%d', expiry - now))
        redis.call(ARGV[2] == 's' and 'SPUBLISH' or 'PUBLISH', KEYS[2], 'g ' .. head .. ' ' .. ft)
        return mode == 'u' and 0 or 1
      end
    end
  end
end

-- Nobody to hand it to: the lock is free.
if mode == 'u' and not emptied then
  redis.call('HDEL', KEYS[1], 'o', 'n', 'a')
else
  local d = {'o', 'n', 'a'}
  if emptied and k == 'q' and not setx then
    d[#d + 1] = 'k'
  end
  redis.call('HDEL', KEYS[1], unpack(d))
  local w = {}
  if mode ~= 'u' then
    w[1], w[2] = 'c', c
  end
  if setx or (emptied and k == 'qx') then
    w[#w + 1], w[#w + 2] = 'k', (emptied or k == nil) and 'x' or 'qx'
  end
  if #w > 0 then
    redis.call('HSET', KEYS[1], unpack(w))
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if h[4] or mode ~= 'u' or k == 'q' or k == 'qx' then
  redis.call(ARGV[2] == 's' and 'SPUBLISH' or 'PUBLISH', KEYS[2], '1')
end
return mode == 'u' and 0 or 1
