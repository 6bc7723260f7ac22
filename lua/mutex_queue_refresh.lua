-- mutex_queue_refresh: keep the queue entries of many waiting fair Locks
-- alive in one call (the batched counterpart of the refresh a waiting
-- Lock's own mutex_lock call makes).
--
-- A fair waiter's entry ("expiry_ms owner", see mutex_lock) dies a lease
-- after it was last written unless refreshed. This script rewrites the
-- entries of waiters that are still queued, with the same expiry a
-- mutex_lock call would give. It never grants, reaps or re-queues: it only
-- tells the client which waiters must look for themselves, with their own
-- mutex_lock call, which the client then makes at once:
--   - a waiter no longer queued was either handed the lock by a release
--     whose message it missed (its attempt id is in the lock record) or
--     dropped as dead (it queues again at the tail);
--   - a waiter queued on a lock that nobody holds: no release will come
--     (the holder's lease ran out, or a waiter handed the lock died before
--     it knew), so the head must take it, and dead entries before it must
--     be dropped, which mutex_lock does;
--   - a waiter one of whose keys holds another type of value, or whose
--     lock record is a string that is not one (overwritten by an
--     operator's SET or another program sharing the prefix): its own call
--     gets the error and reports it. The other waiters of the call are
--     refreshed as usual.
--
-- KEYS[3i-2]   lock record of the i-th waiter's lock
-- KEYS[3i-1]   its queue (sorted set of attempt ids)
-- KEYS[3i]     its queue entries (attempt id -> "expiry_ms owner")
--              (on a cluster, all keys of one call in one slot)
-- ARGV[3i-2]   attempt id of the i-th waiter
-- ARGV[3i-1]   its owner id
-- ARGV[3i]     its lease in milliseconds
--
-- Returns  an array with one entry per waiter: 1 if its entry was
--          refreshed, 0 if it is not queued (granted, or dropped) or a key
--          of it holds another type of value (or its lock record a string
--          that is not one), 2 if its entry was refreshed
--          but the lock is free.
-- Complexity: O(N log Q) for N waiters of queues of length up to Q; the
--          caller sends at most lease.MaxBatch (512) per call.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- An error e that redis.pcall gave on a key of this call decides only the
-- answer of that waiter if it is WRONGTYPE (the key holds another type of
-- value); any other error fails the call, as redis.call would.
local function wrongType(e)
  if not string.find(e.err, '^WRONGTYPE') then
    error(e)
  end
end

local out = {}
for i = 1, #KEYS / 3 do
  local h, q, e = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local id, lease = ARGV[3 * i - 2], ARGV[3 * i]
  out[i] = 0
  local r = redis.pcall('ZSCORE', q, id) -- r: each reply in turn, or an error
  if r and type(r) ~= 'table' then
    r = redis.pcall('HSET', e, id, string.format('%d', now + tonumber(lease)) .. ' ' .. ARGV[3 * i - 1])
    if type(r) ~= 'table' then
      -- Only ever extended, as in mutex_lock: a shorter lease of another
      -- waiter must not cut the queue short.
      if redis.call('PTTL', q) < tonumber(lease) then
        redis.call('PEXPIRE', q, lease)
      end
      if redis.call('PTTL', e) < tonumber(lease) then
        redis.call('PEXPIRE', e, lease)
      end
      r = redis.pcall('GET', h) -- the lock record (see mutex_lock)
      if not r then
        out[i] = 2
      elseif type(r) == 'string' then
        local k, f = string.match(r, '^L(%l*):(%d+):')
        local s = f and string.find(r, '|', #k + #f + 3, true)
        if s and s < #r and string.find(r, '^%d+:[^:]+:.', s + 1) then
          out[i] = 1
        elseif s == #r then
          out[i] = 2
        end -- else not a lock record: answered 0
      end
    end
  end
  if type(r) == 'table' then
    wrongType(r) -- answered 0
  end
end
return out
