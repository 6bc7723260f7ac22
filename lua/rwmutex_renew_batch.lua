-- rwmutex_renew_batch: extend the leases of many write and read
-- acquisitions, of one or more read-write locks, in one call (the
-- watchdog's batched renewal). Each acquisition is checked and answered on
-- its own: one that is gone (deleted, released, forced) or whose lease has
-- already ended is not brought back, since a writer or the readers may have
-- been let in meanwhile.
--
-- See rwmutex_lock for the keys. Each lock's two keys are sent once,
-- however many of its acquisitions the call renews (RWMutex values of one
-- name share them); on a cluster every key of the call is in one slot
-- (locks whose hash tags share a slot). Every lease renewed ends ARGV[1] ms
-- after the server's TIME. After the acquisitions, each key in which one
-- was renewed gets that lease as its TTL if its TTL is shorter: TTLs are
-- only stretched, never shortened, since they also cover other holders,
-- the writer-waiting mark and the last token. A key that holds another
-- type of value (overwritten by an operator's SET or another program
-- sharing the prefix) answers for the acquisitions kept in it only: they
-- are not held, and the others of the call are renewed as usual.
--
-- KEYS[2j-1]   state hash of the j-th lock
-- KEYS[2j]     readers sorted set of the j-th lock
-- ARGV[1]      lease in milliseconds (integer >= 1), for every acquisition
-- ARGV[3i-1]   j: the lock of the i-th acquisition (1 .. #KEYS/2)
-- ARGV[3i]     owner id for a write acquisition; "" for a read acquisition
-- ARGV[3i+1]   write: token of the acquisition; read: read acquisition id
--
-- Returns  an array with one entry per acquisition: 1 if it was renewed,
--          0 if it is not held any more, -1 if the key that keeps it holds
--          another type of value (it is not held either).
-- Complexity: O(N log R + L) for N acquisitions of L locks having at most R
--          readers each; the caller sends at most lease.MaxBatch (512)
--          acquisitions per call.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
local ends = string.format('%.0f', now + lease)

-- An error e that redis.pcall gave on a key of this call decides only the
-- answer of the acquisitions kept in that key if it is WRONGTYPE (the key
-- holds another type of value); any other error fails the call, as
-- redis.call would.
local function wrongType(e)
  if not string.find(e.err, '^WRONGTYPE') then
    error(e)
  end
end

local out = {}
local renewed = {} -- k -> true once a lease kept in KEYS[k] is renewed
for i = 1, (#ARGV - 1) / 3 do
  local j = tonumber(ARGV[3 * i - 1])
  local owner, id = ARGV[3 * i], ARGV[3 * i + 1]
  out[i] = 0
  if owner ~= '' then
    local h = redis.pcall('HMGET', KEYS[2 * j - 1], 'o', 'f', 'e')
    if h.err then -- (an array has no err)
      wrongType(h)
      out[i] = -1
    elseif h[1] == owner and h[2] == id and (tonumber(h[3]) or 0) > now then
      redis.call('HSET', KEYS[2 * j - 1], 'e', ends)
      renewed[2 * j - 1] = true
      out[i] = 1
    end
  else
    local s = redis.pcall('ZSCORE', KEYS[2 * j], id)
    if type(s) == 'table' then -- (a score is a string)
      wrongType(s)
      out[i] = -1
    elseif s and tonumber(s) > now then
      redis.call('ZADD', KEYS[2 * j], 'XX', ends, id)
      renewed[2 * j] = true
      out[i] = 1
    end
  end
end

for k = 1, #KEYS do
  if renewed[k] and redis.call('PTTL', KEYS[k]) < lease then
    redis.call('PEXPIRE', KEYS[k], lease)
  end
end
return out
