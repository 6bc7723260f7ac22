-- semaphore_renew_batch: extend the leases of many live permits, of one or
-- more semaphores, in one call (the watchdog's batched renewal). Each
-- permit is checked and answered on its own, exactly as semaphore_renew
-- did: a permit that is gone or already expired is not brought back, since
-- its capacity may have been counted as free already.
--
-- Layout as in semaphore_acquire. Each semaphore's two keys are sent once,
-- however many of its permits the call renews; on a cluster every key of
-- the call is in one slot (semaphores whose hash tags share a slot). A
-- permit is renewed if it is listed with an expiry still to come and its
-- semaphore's state hash exists (without it, nothing listed is counted:
-- an operator deleted it). After its permits, each semaphore that
-- had one renewed gets both keys' expiry set to its latest permit expiry,
-- or ':set' ms from now if SetCapacity set the capacity and that is later,
-- never before the expiry ':x' records.
-- Time is the server's (TIME). A key that holds another type of value
-- (overwritten by an operator's SET or another program sharing the
-- prefix) answers for the permits of its own semaphore only: they are not
-- held, and the others of the call are renewed as usual.
--
-- KEYS[2j-1]   state hash of the j-th semaphore
-- KEYS[2j]     permits sorted set of the j-th semaphore
-- ARGV[1]      lease in milliseconds (integer >= 1), for every permit
-- ARGV[2i]     j: the semaphore of the i-th permit (1 .. #KEYS/2)
-- ARGV[2i+1]   id of the i-th permit
--
-- Returns  an array with one entry per permit: 1 if it was renewed, 0 if
--          it is not held, -1 if a key of its semaphore holds another type
--          of value (it is not held either).
-- Complexity: O((N + S) log M) for N permits of S semaphores holding at
--          most M permits each; the caller sends at most lease.MaxBatch
--          (512) permits per call.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local exp = now + tonumber(ARGV[1])

-- An error e that redis.pcall gave on a key of this call decides only the
-- answer of that semaphore's permits if it is WRONGTYPE (the key holds
-- another type of value); any other error fails the call, as redis.call
-- would.
local function wrongType(e)
  if not string.find(e.err, '^WRONGTYPE') then
    error(e)
  end
end

-- j -> the state of the j-th semaphore, read once: {answer = 0 or -1}
-- when none of its permits is held, else {keep = ms or nil, x = ':x'}.
local sems = {}
local function look(j)
  local s = sems[j]
  if s then
    return s
  end
  local h = redis.pcall('HMGET', KEYS[2 * j - 1], ':cap', ':set', ':x')
  if h.err then -- (an array has no err)
    wrongType(h)
    s = {answer = -1}
  elseif not h[1] then
    s = {answer = 0}
  else
    s = {keep = tonumber(h[2]), x = tonumber(h[3]) or 0}
  end
  sems[j] = s
  return s
end

local out = {}
local renewed = {} -- j -> true once a permit of semaphore j is renewed
for i = 1, (#ARGV - 1) / 2 do
  local j = tonumber(ARGV[2 * i])
  local id = ARGV[2 * i + 1]
  local s = look(j)
  -- score: ZSCORE's reply, false, or its error.
  local score = s.answer == nil and redis.pcall('ZSCORE', KEYS[2 * j], id)
  if s.answer then
    out[i] = s.answer
  elseif type(score) == 'table' then -- (a score is a string)
    wrongType(score)
    s.answer = -1
    out[i] = -1
  elseif score and tonumber(score) > now then
    redis.call('ZADD', KEYS[2 * j], exp, id)
    renewed[j] = true
    out[i] = 1
  else
    out[i] = 0
  end
end

for j = 1, #KEYS / 2 do
  if renewed[j] then
    local last = redis.call('ZRANGE', KEYS[2 * j], '-1', '-1', 'WITHSCORES')
    -- Never before ':x' (see semaphore_acquire): grants rely on it.
    local s = sems[j]
    local at = math.max(tonumber(last[2]), exp, s.x)
    if s.keep then
      at = math.max(at, now + s.keep)
    end
    redis.call('PEXPIREAT', KEYS[2 * j - 1], at)
    redis.call('PEXPIREAT', KEYS[2 * j], at)
  end
end
return out
