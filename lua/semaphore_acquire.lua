-- semaphore_acquire: take n permits of a counting semaphore with expiring
-- permits, reclaiming expired ones when they are in the way.
--
-- Layout of one semaphore: the sorted set KEYS[2] lists the permits, each
-- id scored by its expiry in server milliseconds, so that one structure
-- answers who holds, which permits expired and, with ZCARD, how many are
-- held. The hash KEYS[1] holds the weight of each permit of more than one
-- (id -> weight; a permit without a field weighs 1, the common case,
-- which then costs no field) and what the permits share: ':cap' (the
-- capacity they were granted under; present whenever the hash is),
-- ':set' (SetCapacity set it: how long it is kept, in ms), ':h' (the
-- weight of the permits listed beyond one each, so that the weight in use
-- is ZCARD plus ':h'; absent is 0), ':w' ("1": an Acquire may be waiting,
-- see below) and ':x' (a time in server ms no later than both keys'
-- expiry: the one this script last set; every script that sets an expiry
-- sets none before it, and the others may set a later one without
-- writing ':x', so it is a floor, not the expiry). The weight in use counts expired permits until
-- they are reclaimed. The hash exists whenever a permit is listed; a
-- script that finds no hash deletes whatever the sorted set lists first
-- (left from a hash an operator deleted or overwrote, and counted
-- nowhere), so that every permit listed is counted. Both keys expire no
-- earlier than the latest permit expiry (at most 1 + lease/16 ms after it)
-- and are deleted when the last permit goes, so nothing outlives the
-- permits for long.
--
-- A request that fits as things are (the capacity in force, the weight
-- held plus n at most the capacity) is granted without looking at
-- expiries: expired permits still counted are not in its way. A grant of
-- one permit, with the capacity stored and the keys' expiry far enough,
-- makes four calls and writes nothing but the permit: TIME, HMGET of four
-- fields, ZCARD and ZADD NX (which also tells a retried grant, already
-- listed, from a new one); an HSET follows when the hash changes (a
-- heavier permit, a grant after a wait, a new capacity, or ':x', with
-- PTTL and PEXPIREAT twice, at most once every lease/16 ms). It passes numbers to
-- Redis as they are (no string.format), reads the numbers it is sent with
-- + 0 (tonumber reads a text twice), makes no function on its way (a
-- closure and its upvalues cost the server more than the lines they save)
-- and answers an integer. Any other
-- call first reclaims up to 16 expired permits, the oldest first (bounded
-- work), plus the caller's own id if its earlier grant expired, so that it
-- is not counted twice; if more remain and the request is not granted,
-- the reply's wait is 0 and the caller simply calls again. When the
-- reclaim frees capacity that this call does not take, the free count is
-- published so waiters elsewhere try again.
--
-- ':w' is set by a refused Acquire before it answers (a TryAcquire, which
-- does not wait, sets nothing), and by the grant of an Acquire that waited:
-- a release publishes its wake-up only when ':w' is set (semaphore_release).
-- A waiting Acquire attempts once more after its subscription is
-- confirmed, so a release after that attempt sees ':w'. Nothing clears it
-- while the hash lives; when the last permit goes, the hash goes with it,
-- after that release published, and each waiter that wake-up reaches sets
-- ':w' again on the next hash, by its refusal or by its grant, so the
-- waiters it did not reach (a budget wakes only as many as the permits
-- freed) are woken by the releases after. A waiter sleeps at most until
-- the earliest permit expiry it was told of, so a hash deleted or expired
-- without a release needs no wake-up.
--
-- The capacity comes from the callers, or from SetCapacity. A capacity
-- brought by callers is fixed while any permit is held: a caller with
-- another capacity is refused (status -1); when no permit is held, the
-- caller's capacity applies. A capacity set by SetCapacity applies to every
-- caller whatever capacity it brings, and the keys are kept at least ':set'
-- ms after the last grant (the hash also when no permit is held). A request
-- for more than the capacity is refused (status -2). Granting an id that is
-- already listed and live renews it instead of counting it twice, so a
-- retry after a lost reply is harmless.
--
-- The keys' expiry is only ever moved later here, and only when ':x' comes
-- before the new permit's (or the set capacity's) end: then to that end
-- plus 1 + lease/16 ms, so that the grants of the next few milliseconds
-- need not move it again, or to the expiry PTTL reports if that is later
-- (set by another script: ':x' is a floor).
--
-- KEYS[1]  state hash
-- KEYS[2]  permits sorted set
-- KEYS[3]  wake-up channel; optional: without it, KEYS[1] .. ':w' (the
--          library's name for it, sent no more: a key costs the server a
--          string and a table slot on every call)
-- ARGV[1]  capacity (integer, 1 .. 2^53)
-- ARGV[2]  n: permits to take (1 .. capacity; 0 only reclaims and reports)
-- ARGV[3]  permit id (no field name of the hash: those start with ':')
-- ARGV[4]  lease in milliseconds (integer >= 1)
-- ARGV[5]  "s" to publish with SPUBLISH (cluster), else "p"; then "a" for
--          an Acquire's first attempt, "w" for an Acquire's attempt after
--          it waited, "t" for TryAcquire and Available (nothing: "a")
--
-- Returns  1 when n > 0 permits are granted (or renewed); -1 - wait (0 or
--          less) when they are not and no permit is free; else {status,
--          used, capacity, wait}: status 1 (n = 0), 0 not granted, -1
--          capacity mismatch (capacity is then the stored one), -2 n above
--          the capacity; used is the weight in use after the call (it can
--          exceed a capacity that SetCapacity lowered); wait is, when not
--          granted, the milliseconds until the earliest permit expiry, 0 if
--          expired permits remain to reclaim, -1 if none is known. (The
--          integers spare the common answers a table.)
-- Complexity: O(log N) for N permits held, plus the publish.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
-- Arithmetic reads a number from its text once, tonumber twice (it checks
-- the text is a number, then converts it): the numbers known to be there
-- are read with + 0.
local cap = ARGV[1] + 0
local n = ARGV[2] + 0
local id = ARGV[3]
local lease = ARGV[4] + 0
local mode = ARGV[5] -- "pa", "sw", ...: letter 2 is the mode
local waited = string.sub(mode, 2) == 'w'

local h = redis.call('HMGET', KEYS[1], ':cap', ':set', ':x', ':h')
local keep = tonumber(h[2]) -- ms a set capacity is kept, or nil
local x = h[3] and h[3] + 0 -- no later than both keys' expiry, or nil
local count = 0 -- permits listed
if not h[1] then
  redis.call('DEL', KEYS[2]) -- counted nowhere (see the layout)
else
  count = redis.call('ZCARD', KEYS[2])
end
local saved = 0 -- ':h' as stored
if h[4] then
  saved = h[4] + 0
end
local extra = 0 -- the weight of the permits listed beyond one each
if count > 0 then
  extra = saved
end
local used = count + extra
local stored = cap
if h[1] ~= ARGV[1] and (used > 0 or keep) then
  stored = tonumber(h[1]) or cap -- (the same text is the same number)
end
local capSaved = h[1] == ARGV[1] or stored == tonumber(h[1]) -- ':cap' holds it already
local mismatch = stored ~= cap and not keep
local need = lease -- how long from now the keys must live
if keep and keep > need then
  need = keep
end

-- The common grant: it fits, and the hash needs no change (as save below
-- would find: a permit of one, no wait before it, the capacity stored and
-- the keys' expiry far enough), so no function is made for it.
local granted = false
local taken = false -- granted by the reclaim of the last permits (below)
if n > 0 and not mismatch and used + n <= stored then
  if redis.call('ZADD', KEYS[2], 'NX', now + lease, id) == 1 then
    if n == 1 and extra == saved and not waited and capSaved and x and x >= now + need + 1 then
      return 1
    end
    granted = true
  end
  -- Listed already (a retry): decided below, as any call that does not fit.
end

-- Whether n more permits fit: the grant check, for every grant below.
local function fits()
  return used + n <= stored
end

-- Write what a grant or renewal changes in the hash, if anything: the
-- weight of a new grant g of more than one permit (its field and ':h'),
-- ':w' after a wait, ':cap' if it changed, and ':x' with both keys' expiry
-- when that comes before the end of a permit granted now (or a set
-- capacity's retention): then it moves to that end plus 1 + lease/16 ms.
local function save(g)
  local f = {}
  local function add(k, v)
    f[#f + 1] = k
    f[#f + 1] = v
  end
  if g and n > 1 then
    add(id, n)
    extra = extra + n - 1
  end
  if extra ~= saved then
    add(':h', extra) -- (also clears one left over with no permit listed)
  end
  if waited then
    add(':w', 1)
  end
  if not capSaved then
    add(':cap', stored)
  end
  local at = nil
  if not x or x < now + need + 1 then
    at = now + need + 1 + math.floor(lease / 16)
    if h[1] and not taken then
      -- ':x' is only a floor: the fair queue, renewals and releases move
      -- the expiry later without it. Never set it earlier (PTTL counts
      -- from the script's start, no later than now). (An expiry kept for
      -- the permits reclaimed before a grant is not kept for them.)
      local ttl = redis.call('PTTL', KEYS[2])
      if ttl > 0 and now + ttl > at then
        at = now + ttl
      end
    end
    add(':x', at)
  end
  if #f > 0 then
    redis.call('HSET', KEYS[1], unpack(f))
  end
  if at then
    redis.call('PEXPIREAT', KEYS[1], at)
    redis.call('PEXPIREAT', KEYS[2], at)
  end
end

if granted then
  save(true)
  return 1
end

-- Reclaim expired permits, the oldest first, and this id's own earlier
-- grant if it expired (a retry after a lost reply) but is not among them.
-- head: the 17 earliest permits, those expired to reclaim and the first
-- one after them, whose expiry is the wait.
local own = nil -- the id's own expiry if it is listed
if n > 0 and count > 0 then
  own = tonumber(redis.call('ZSCORE', KEYS[2], id))
end
local head = {}
if count > 0 then
  head = redis.call('ZRANGE', KEYS[2], '0', '16', 'WITHSCORES')
end
local expired, after = {}, nil
for i = 1, #head, 2 do
  local score = tonumber(head[i + 1])
  if score <= now and #expired < 16 then
    expired[#expired + 1] = head[i]
  elseif not after then
    after = score
  end
end
if own and own <= now then
  own = nil
  local listed = false
  for i = 1, #expired do
    listed = listed or expired[i] == id
  end
  if not listed then
    expired[#expired + 1] = id
  end
end
local freed = 0
if #expired > 0 then
  local weights = redis.call('HMGET', KEYS[1], unpack(expired))
  local heavy = {}
  for i = 1, #expired do
    local w = tonumber(weights[i]) or 1
    freed = freed + w
    if w > 1 then
      heavy[#heavy + 1] = expired[i]
      extra = extra - (w - 1)
    end
  end
  count = count - #expired
  used = count + extra
  if count <= 0 then
    -- The last permits go: so do the keys, but a grant's and a set
    -- capacity's. While the slot migrates, a script may not touch again a
    -- key it emptied (the call fails there, its writes made): so a grant
    -- is listed before the expired permits go, the permits' key is not
    -- touched once empty, and a hash that stays loses its fields in place
    -- (':cap' stays, so it is never empty).
    used, extra, after = 0, 0, nil
    if not keep then
      stored, mismatch = cap, false
    end
    if n > 0 and n <= stored then -- granted below, by fits()
      redis.call('ZADD', KEYS[2], now + lease, id)
      taken = true
      for i = #expired, 1, -1 do
        if expired[i] == id then
          table.remove(expired, i)
        end
      end
    end
    if #expired > 0 then
      redis.call('ZREM', KEYS[2], unpack(expired))
    end
    if taken or keep then
      heavy[#heavy + 1] = ':h'
      heavy[#heavy + 1] = ':w'
      redis.call('HDEL', KEYS[1], unpack(heavy))
      saved, x = 0, nil
      capSaved = stored == tonumber(h[1])
      if not taken then
        x = now + keep
        redis.call('HSET', KEYS[1], ':cap', stored, ':x', x)
        redis.call('PEXPIREAT', KEYS[1], x)
        capSaved = true
      end
    else
      redis.call('DEL', KEYS[1])
      saved, capSaved, x = 0, false, nil
    end
  else
    redis.call('ZREM', KEYS[2], unpack(expired))
    if #heavy > 0 then
      redis.call('HDEL', KEYS[1], unpack(heavy))
    end
    if extra ~= saved then
      redis.call('HSET', KEYS[1], ':h', extra)
      saved = extra
    end
  end
end
if used == 0 and not keep then
  stored = cap
  mismatch = false
end

-- Capacity freed here and not taken by this call: tell waiters elsewhere.
local function wake()
  if freed > 0 and stored > used then
    local channel = KEYS[3] or KEYS[1] .. ':w'
    if string.sub(mode, 1, 1) == 's' then
      redis.call('SPUBLISH', channel, stored - used)
    else
      redis.call('PUBLISH', channel, stored - used)
    end
  end
end

local function answer(status)
  wake()
  local wait = -1
  if after then
    wait = math.max(after - now, 0)
  end
  if status == 0 and used >= stored then
    return -1 - wait -- (nothing free: the integer says all)
  end
  return {status, used, stored, wait}
end

if mismatch then
  return answer(-1)
end
if n > stored then
  return answer(-2)
end
if n == 0 then
  return answer(1)
end
if own then
  -- Already granted to this id (a retry): renew, do not count twice.
  redis.call('ZADD', KEYS[2], now + lease, id)
  save(false)
  wake()
  return 1
end
if fits() then
  if not taken then
    redis.call('ZADD', KEYS[2], now + lease, id)
  end
  used = used + n
  save(true)
  wake()
  return 1
end
if string.sub(mode, 2) ~= 't' then
  redis.call('HSET', KEYS[1], ':w', 1) -- a waiter may subscribe
end
return answer(0)
