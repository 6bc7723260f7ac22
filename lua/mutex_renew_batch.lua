-- mutex_renew_batch: extend the leases of many held locks in one call (the
-- watchdog's batched renewal). Each lock is checked and answered on its
-- own, exactly as mutex_renew would.
--
-- KEYS[i]      lock record of the i-th lock (see mutex_lock; on a cluster,
--              all in one slot)
-- ARGV[1]      lease in milliseconds, for every lock
-- ARGV[2i]     owner id of the i-th lock
-- ARGV[2i+1]   token of the i-th lock's acquisition
--
-- A key that holds another type of value, or a string that is not a lock
-- record (overwritten by an operator's SET or another program sharing the
-- prefix), answers for its own lock only: the lock is not held, and the
-- other locks of the call are renewed as usual.
--
-- Returns  an array with one entry per key: 1 if that lock was renewed, 0
--          if its owner no longer holds that acquisition, -1 if its key
--          holds another type of value or a string that is not a lock
--          record (it is not held either).
-- Complexity: O(N) for N keys; the caller sends at most lease.MaxBatch
--          (512) per call.

-- notLock decides on a key whose value is not a lock record, given what
-- GET gave: a string, or an error of redis.pcall. Either answers for that
-- lock only if it is a string or WRONGTYPE (the key holds another type of
-- value); any other error fails the call, as redis.call would.
local function notLock(r)
  if type(r) == 'table' and not string.find(r.err, '^WRONGTYPE') then
    error(r)
  end
end

local out = {}
for i = 1, #KEYS do
  local v = redis.pcall('GET', KEYS[i]) -- a string, false, or an error
  local f, o, s
  if type(v) == 'string' then
    local k
    k, f = string.match(v, '^L(%l*):(%d+):')
    s = f and string.find(v, '|', #k + #f + 3, true)
    if s and s < #v then
      o = string.match(v, '^%d+:[^:]+:(.+)$', s + 1)
      s = o and s
    end
  end
  if v and not s then
    notLock(v)
    out[i] = -1
  elseif f and o == ARGV[2 * i] and f == ARGV[2 * i + 1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
