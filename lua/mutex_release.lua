-- mutex_release: end a hold of a reentrant lease lock, and hand the lock
-- straight to the first live waiter of its queue, if any.
--
-- Three callers, one release (ARGV[1]; in upper case, the wake-ups go out
-- with SPUBLISH, for a Redis 7 cluster, else with PUBLISH):
--   "u"  Unlock by the owner of the acquisition named by its token. The
--        client sends the holds it has (none: one); the lock is left with
--        one fewer, so a retry after a lost reply does not remove two. A retried
--        final Unlock is recognised through c and f (see mutex_lock),
--        however many holds began and ended since, as long as the record
--        lives and at most 16 of them ended otherwise.
--   "a"  give-back of an abandoned Lock (its caller stopped waiting, or the
--        connection failed). It leaves a tombstone (its attempt id, kept
--        for a lease) so that the attempt refuses itself if it reaches
--        Redis later, takes the attempt's queue entry out, and releases
--        the lock if that very attempt holds it (granted by itself or
--        handed to it), never a hold a later attempt made.
--   "f"  ForceUnlock: release whoever holds it.
--
-- On release the record (see mutex_lock) keeps only f (for the next
-- token), k and c, for a short time. An Unlock leaves c alone; the other
-- modes end a hold without its owner's Unlock and list it in c, so that
-- the holder's own Unlock is told it lost the lock, while an Unlock retried
-- for an earlier hold of the run is still told that its first try released
-- it. Then the queue (fair waiters, see mutex_lock) is looked at if k says
-- it may hold anyone (q; a release that finds the queue empty clears q):
-- up to 16 dead entries at its head are dropped, and the first live waiter
-- is granted the lock at once, with a new token and a lease that ends when
-- its queue entry would have (so a waiter that died since its last refresh
-- blocks the lock no longer than its entry's lease), and told so by a
-- message "g <attempt> <token>". With no live waiter, "1" wakes one waiter
-- per subscribed process to try; an Unlock publishes it only if a Lock may
-- be waiting (w, see mutex_lock) or the queue was flagged, while a
-- give-back or ForceUnlock always does.
--
-- An Unlock may send only KEYS[1] and KEYS[2] (the client of an unfair
-- lock does): a final Unlock that finds q flagged then answers -2 before
-- it changes anything, and the client calls again with every key.
--
-- KEYS[1]  lock record
-- KEYS[2]  wake-up channel
-- KEYS[3]  queue: sorted set of attempt ids by arrival
-- KEYS[4]  queue entries: attempt id -> "expiry_ms owner"
-- KEYS[5]  tombstones: abandoned attempt id -> 1
-- ARGV[2]  how long the released record is kept, in milliseconds
-- ARGV[3]  u: owner id                a: owner id
-- ARGV[4]  u: token                   a: attempt id "nonce.seq"
-- ARGV[5]  u: holds, if more than 1   a: tombstone lifetime in ms
--          (f: none of these)
--
-- Returns  u: holds left (0: released), or -1 when the owner does not hold
--          that acquisition, or -2: call again with every key;
--          a, f: 1 if a hold was released, else 0.
-- Complexity: O(log Q) for Q queued waiters, plus the publish. A final
--          Unlock with no queue flagged makes two calls (GET, SET PX),
--          and a PUBLISH if a Lock was refused while the record lived;
--          TIME is read only when a queue entry is judged. A partial
--          Unlock is a GET and a SET KEEPTTL; a retried one a GET.
local mode = ARGV[1]
local pub = 'PUBLISH'
if mode < 'a' then
  mode, pub = string.lower(mode), 'SPUBLISH'
end
local v = redis.call('GET', KEYS[1])
local k, f, r, s -- flags, token, where ":" c "|" starts and where it ends
local n, a, o -- the hold's fields; nil if the lock is free
if v then
  k, f = string.match(v, '^L(%l*):(%d+):')
  r = f and #k + #f + 3
  s = f and string.find(v, '|', r, true)
  if s and s < #v then
    n, a, o = string.match(v, '^(%d+):([^:]+):(.+)$', s + 1)
    s = o and s
  end
  if not s then
    return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
  end
end
local queued = k and string.find(k, 'q', 1, true)
local setx = false -- a give-back whose tombstone the record does not flag yet

if mode == 'u' then
  if o ~= ARGV[3] or f ~= ARGV[4] then
    -- Not the current hold: an earlier try of this Unlock released it and
    -- its reply was lost if the token lies in the current run (the hold it
    -- names ended by its owner's Unlock), else the hold was lost.
    -- The run is c's first token up to f, less the tokens c lists after
    -- it (see mutex_lock).
    local last, mine = tonumber(f), tonumber(ARGV[4])
    if last and mine and (mine < last or (mine == last and not o)) then
      local run = false
      for x in string.gmatch(string.sub(v, r + 1, s - 1), '%d+') do
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
  if ARGV[5] then
    local left = tonumber(ARGV[5]) - 1
    if left > 0 then
      redis.call('SET', KEYS[1], string.sub(v, 1, s) .. left .. ':' .. a .. ':' .. o, 'KEEPTTL')
      return left
    end
  end
  if not queued then
    -- The common release: the record without its hold, and a wake-up
    -- only if a Lock may wait.
    redis.call('SET', KEYS[1], string.sub(v, 1, s), 'PX', ARGV[2])
    if k ~= '' and string.find(k, 'w', 1, true) then
      redis.call(pub, KEYS[2], '1')
    end
    return 0
  end
  if not KEYS[3] then
    return -2
  end
elseif mode == 'a' then
  if not string.find(ARGV[4], '^[^:]*%.%d+$') then
    return redis.error_reply('mutex_release: malformed attempt id')
  end
  -- The tombstone names this attempt only: other Locks of the same Mutex
  -- value (several goroutines may wait at once) are not abandoned.
  redis.call('HSET', KEYS[5], ARGV[4], 1)
  if redis.call('PTTL', KEYS[5]) < tonumber(ARGV[5]) then
    redis.call('PEXPIRE', KEYS[5], ARGV[5])
  end
  redis.call('ZREM', KEYS[3], ARGV[4])
  redis.call('HDEL', KEYS[4], ARGV[4])
  -- Without a record there is nothing to flag: whoever makes it asks the
  -- keys.
  setx = f and not string.find(k, 'x', 1, true)
  if o ~= ARGV[3] or a ~= ARGV[4] then
    if setx then
      redis.call('SET', KEYS[1], 'L' .. k .. 'x' .. string.sub(v, #k + 2), 'KEEPTTL')
    end
    return 0
  end
  if setx then
    k = k .. 'x'
  end
elseif not o then
  return 0
end

local run = string.sub(v, r, s) -- ":" c "|", c the run
if mode ~= 'u' then
  -- The hold ends otherwise than by its owner's Unlock: c lists its token,
  -- and past 16 listed the oldest goes and the run starts after it (see
  -- mutex_lock).
  local l = {}
  for x in string.gmatch(run, '%d+') do
    l[#l + 1] = x
  end
  if #l == 0 then
    l[1] = string.format('%d', tonumber(f) + 1)
  else
    l[#l + 1] = f
    if #l > 17 then
      l[1] = string.format('%d', tonumber(table.remove(l, 2)) + 1)
    end
  end
  run = ':' .. table.concat(l, ' ') .. '|'
end

-- The hold ends. First the queue, if the record says it may hold anyone.
if queued then
  local t, now -- read once, when the first entry is judged
  local emptied = false
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
        if tonumber(f) >= token then
          token = tonumber(f) + 1
        end
        local ft = string.format('%d', token)
        -- One write for the release and the grant; the queue stays flagged.
        redis.call('SET', KEYS[1], 'L' .. k .. ':' .. ft .. run .. '1:' .. head .. ':' .. owner,
          'PX', string.format('%d', expiry - now))
        redis.call(pub, KEYS[2], 'g ' .. head .. ' ' .. ft)
        return mode == 'u' and 0 or 1
      end
    end
  end
  if emptied then
    k = string.gsub(k, 'q', '')
  end
end

-- Nobody to hand it to: the lock is free.
redis.call('SET', KEYS[1], 'L' .. k .. ':' .. f .. run, 'PX', ARGV[2])
if mode ~= 'u' or queued or string.find(k, 'w', 1, true) then
  redis.call(pub, KEYS[2], '1')
end
return mode == 'u' and 0 or 1
