-- ratelimit_sliding: sliding-window rate limit, the two-window weighted
-- counter.
--
-- Time is cut into windows aligned on multiples of the window length. The
-- estimate of the requests in the last window length is the previous
-- window's count, weighted by the share of it still inside the sliding
-- window, plus the current window's count. This smooths the 2x burst a fixed
-- window lets through at its boundary while keeping two counters per key.
-- It is an estimate that assumes the previous window's requests were spread
-- evenly: if they all came at its end, up to 2*limit-1 requests can pass
-- within one window length across the boundary. One aligned window never
-- passes more than limit.
-- The counters live in one hash, so the key is known before the script reads
-- the time (cluster routing needs it). A denied request does not count.
--
-- KEYS[1]  hash key; fields w (index of the current window), c (its count),
--          p (count of the window before it)
-- ARGV[1]  limit: requests allowed per window (integer >= 1)
-- ARGV[2]  window in microseconds (integer >= 1000), the precision of TIME
-- ARGV[3]  cost: how many requests this call is (integer >= 0; 0 only peeks)
--
-- Returns  when allowed, one integer: remaining * radix + reset, where
--          radix = 2 * window + 1, remaining is what is left after this
--          call and reset the microseconds until the estimate falls back
--          to 0 (at most 2 * window); when denied, or when (limit + 1) *
--          radix passes 2^53 (a double's exact integers), {allowed (1|0),
--          remaining, microseconds until a request of this cost could be
--          allowed (0 if allowed), reset}. The integer saves the server
--          building an array reply (about 0.7 us a call) on the common
--          path.
-- Complexity: O(1); touches one key.

-- Arithmetic on the strings of ARGV, TIME and HMGET converts them to numbers
-- directly, which is cheaper than calling tonumber (the inputs are numbers).
local limit = ARGV[1] + 0
local window = ARGV[2] + 0
local cost = ARGV[3] + 0

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
-- % is a - floor(a / b) * b: the same exact values as floor(now / window).
local elapsed = now % window
local idx = (now - elapsed) / window

local h = redis.call('HMGET', KEYS[1], 'w', 'c', 'p')
local w = tonumber(h[1])
local cur, prev = 0, 0
if w == idx then
  cur, prev = tonumber(h[2]) or 0, tonumber(h[3]) or 0
elseif w == idx - 1 then
  prev = tonumber(h[2]) or 0
end

local weight = (window - elapsed) / window
local estimate = prev * weight + cur

-- Microseconds until the estimate falls back to 0 (an integer), before
-- this call.
local reset = 0
if cur > 0 then
  reset = 2 * window - elapsed
elseif prev > 0 then
  reset = window - elapsed
end

if estimate + cost > limit then
  local retry
  if cur + cost <= limit then
    -- The previous window's share has to shrink to limit - cur - cost.
    local e = window - (limit - cur - cost) * window / prev
    retry = e - elapsed
  else
    -- Wait for the next window; then this window's count is the previous
    -- one and has to shrink to limit - cost.
    local e = window - (limit - cost) * window / cur
    retry = window - elapsed + math.max(e, 0)
  end
  local remaining = math.max(math.floor(limit - estimate), 0)
  return {0, remaining, math.max(math.ceil(retry), 1), reset}
end

if cost > 0 then
  reset = 2 * window - elapsed
  if w == idx then
    -- The window's fields and TTL are already there: the write that set w
    -- to this window set its TTL to the end of the next one, past which
    -- nothing reads this count.
    redis.call('HINCRBY', KEYS[1], 'c', ARGV[3])
  else
    -- Numbers go to commands through %d: some Redis versions would write
    -- a round Lua number in exponent form ("1e+08"), which PEXPIRE
    -- rejects.
    redis.call('HSET', KEYS[1], 'w', string.format('%d', idx), 'c', cost, 'p', prev)
    -- This window's count is still needed, as the previous one, until the
    -- next window ends.
    redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil((2 * window - elapsed) / 1000)))
  end
end
local remaining = math.floor(limit - estimate - cost)
if remaining < 0 then
  remaining = 0
end
local radix = 2 * window + 1
if (limit + 1) * radix <= 9007199254740992 then
  return remaining * radix + reset
end
return {1, remaining, 0, reset}
