-- mutex_nest: one more hold of an acquisition its owner holds (a nested
-- Lock of a reentrant lease lock; see mutex_lock for the record).
--
-- A nested Lock joins the acquisition named by its token and leaves the
-- lease alone (it belongs to the outer hold: SET KEEPTTL). If that
-- acquisition is gone (expired, deleted, taken over, even by the same
-- owner id) it is refused: the client must report the loss, not start a
-- hold the outer section believes continuous. The owner's client counts
-- its holds and sends the count, so a Lock retried after a lost reply
-- cannot add a second hold.
--
-- KEYS[1]  lock record
-- ARGV[1]  owner id
-- ARGV[2]  token of the acquisition the Lock joins
-- ARGV[3]  holds the owner's client has now (at least 1)
--
-- Returns  holds now, or -1 when that acquisition is gone. A key whose
--          value is not a lock record fails with WRONGTYPE.
-- Complexity: O(1): GET, and SET KEEPTTL when it joins.
local v = redis.call('GET', KEYS[1])
if not v then
  return -1
end
local k, f = string.match(v, '^L(%l*):(%d+):')
local s = f and string.find(v, '|', #k + #f + 3, true)
local a, o
if s and s < #v then
  a, o = string.match(v, '^%d+:([^:]+):(.+)$', s + 1)
  s = o and s
end
if not s then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
if o == ARGV[1] and f == ARGV[2] then
  local holds = tonumber(ARGV[3]) + 1
  redis.call('SET', KEYS[1], string.sub(v, 1, s) .. holds .. ':' .. a .. ':' .. o, 'KEEPTTL')
  return holds
end
return -1
