-- mutex_info: read the state of a lock (read only), in one call so that
-- every client runs it the same way.
--
-- See mutex_lock for the keys and the record.
--
-- KEYS[1]  lock record
-- KEYS[2]  fair queue sorted set
--
-- Returns  {owner id or "", hold count, token of the current or last
--          acquisition (0 if unknown), ms left of the lease (PTTL: -2
--          no key, -1 no expiry), fair waiters queued}. A key whose value
--          is not a lock record fails with WRONGTYPE.
-- Complexity: O(1).
local v = redis.call('GET', KEYS[1])
local f, n, o
if v then
  local k
  k, f = string.match(v, '^L(%l*):(%d+):')
  local s = f and string.find(v, '|', #k + #f + 3, true)
  if s and s < #v then
    n, o = string.match(v, '^(%d+):[^:]+:(.+)$', s + 1)
    s = o and s
  end
  if not s then
    return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
  end
end
return {o or '', tonumber(n) or 0, tonumber(f) or 0,
  redis.call('PTTL', KEYS[1]), redis.call('ZCARD', KEYS[2])}
