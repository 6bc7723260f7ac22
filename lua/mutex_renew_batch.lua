-- mutex_renew_batch: extend the leases of many held locks in one call (the
-- watchdog's batched renewal). Each lock is checked and answered on its
-- own, exactly as mutex_renew would.
--
-- KEYS[i]      lock hash of the i-th lock (on a cluster, all in one slot)
-- ARGV[1]      lease in milliseconds, for every lock
-- ARGV[2i]     owner id of the i-th lock
-- ARGV[2i+1]   token of the i-th lock's acquisition
--
-- A key that holds another type of value (overwritten by an operator's SET
-- or another program sharing the prefix) answers for its own lock only: the
-- lock is not held, and the other locks of the call are renewed as usual.
--
-- Returns  an array with one entry per key: 1 if that lock was renewed, 0
--          if its owner no longer holds that acquisition, -1 if its key
--          holds another type of value (it is not held either).
-- Complexity: O(N) for N keys; the caller sends at most lease.MaxBatch
--          (512) per call.

-- An error e that redis.pcall gave on a key of this call decides only the
-- answer of that lock if it is WRONGTYPE (the key holds another type of
-- value); any other error fails the call, as redis.call would.
local function wrongType(e)
  if not string.find(e.err, '^WRONGTYPE') then
    error(e)
  end
end

local out = {}
for i = 1, #KEYS do
  local h = redis.pcall('HMGET', KEYS[i], 'o', 'f')
  if h.err then -- (an array has no err)
    wrongType(h)
    out[i] = -1
  elseif h[1] == ARGV[2 * i] and h[2] == ARGV[2 * i + 1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
