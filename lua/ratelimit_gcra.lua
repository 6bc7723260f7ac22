-- ratelimit_gcra: generic cell rate algorithm, a token bucket kept as one
-- timestamp.
--
-- The key holds the theoretical arrival time (TAT): the time at which the
-- bucket would be full again. One request of cost n moves it n emission
-- intervals (period / rate) later; the request is allowed if the TAT it
-- leads to is no more than burst intervals ahead of now. Time comes from
-- TIME, in microseconds since 2024-01-01 so that a double keeps sub-
-- microsecond precision; the TAT is stored with full precision and expires
-- when the bucket is full again. A denied request does not count.
--
-- KEYS[1]  TAT key
-- ARGV[1]  emission interval in microseconds (number > 0, may be fractional)
-- ARGV[2]  burst: bucket size in requests (integer >= 1)
-- ARGV[3]  cost: how many requests this call is (integer >= 0; 0 only peeks)
--
-- Returns  when allowed, one integer: remaining * radix + full, where
--          radix = ceil(burst * interval) + 1, remaining is what is left
--          after this call and full the microseconds until the bucket is
--          full; when denied, or when (burst + 1) * radix passes 2^53 (a
--          double's exact integers), {allowed (1|0), remaining, microseconds
--          until a request of this cost could be allowed (0 if allowed),
--          microseconds until the bucket is full}. The integer saves the
--          server building an array reply (about 0.7 us a call, a tenth of
--          the script) on the common path.
-- Complexity: O(1); touches one key.

-- Arithmetic on the strings of ARGV, TIME and GET converts them to numbers
-- directly, which is cheaper than calling tonumber (the inputs are numbers).
local interval = ARGV[1] + 0
local burst = ARGV[2] + 0
local cost = ARGV[3] + 0

local t = redis.call('TIME')
local now = (t[1] - 1704067200) * 1000000 + t[2]
local tolerance = burst * interval

-- Work relative to now: small numbers, no rounding of absolute times.
local tat = redis.call('GET', KEYS[1])
local ahead = 0
if tat then
  ahead = tat - now
  if ahead < 0 then
    ahead = 0
  end
end
local after = ahead + cost * interval

-- The 1e-9 absorbs float error in a division that should be exact.
if after > tolerance then
  local remaining = math.max(math.floor((tolerance - ahead) / interval + 1e-9), 0)
  return {0, remaining, math.ceil(after - tolerance), math.ceil(ahead)}
end

if cost > 0 then
  -- A whole TAT (any whole interval) and the PX go as '%d' text: Redis
  -- before 7.2 writes every number argument with snprintf('%.17g'), about
  -- 0.3 us for a 14-digit TAT, where string.format('%d') takes about 0.1
  -- and writes the same text (a whole number below 1e17 has no exponent
  -- in either). A fractional TAT goes as a number, written with full
  -- precision (%.17g; Valkey and Redis 7.2+ the shortest text that reads
  -- back the same), cheaper than '%.17g' in Lua. after > 0 here, so the
  -- TTL is >= 1 ms. PSETEX key ms value is SET key value PX ms (the same
  -- code in Redis and Valkey, replicated alike as SET ... PXAT) without
  -- SET's option parsing: about 0.2 us less a call.
  local tat = now + after
  if tat % 1 == 0 then
    tat = string.format('%d', tat)
  end
  redis.call('PSETEX', KEYS[1], string.format('%d', math.ceil(after / 1000)), tat)
end
-- after <= tolerance here: 0 <= remaining <= burst, 0 <= full < radix.
local remaining = math.floor((tolerance - after) / interval + 1e-9)
local full = math.ceil(after)
local radix = math.ceil(tolerance) + 1
if (burst + 1) * radix <= 9007199254740992 then
  return remaining * radix + full
end
return {1, remaining, 0, full}
