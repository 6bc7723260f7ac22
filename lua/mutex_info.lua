-- mutex_info: read the state of a lock (read only), in one call so that
-- every client runs it the same way.
--
-- See mutex_lock for the keys.
--
-- KEYS[1]  lock hash
-- KEYS[2]  fair queue sorted set
--
-- Returns  {owner id or "", hold count, token of the current or last
--          acquisition (0 if unknown), ms left of the lease (PTTL: -2
--          no key, -1 no expiry), fair waiters queued}.
-- Complexity: O(1).
local h = redis.call('HMGET', KEYS[1], 'o', 'n', 'f')
return {h[1] or '', tonumber(h[2]) or 0, tonumber(h[3]) or 0,
  redis.call('PTTL', KEYS[1]), redis.call('ZCARD', KEYS[2])}
