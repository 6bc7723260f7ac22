-- ratelimit_multi: several rate limits on one key, decided together.
--
-- Every policy is checked first, on one reading of TIME; the request is
-- counted in every policy only if every policy has room for it, so a
-- request denied by one policy (say 1000 per hour) costs nothing in the
-- others (10 per second). The algorithms are those of ratelimit_gcra,
-- ratelimit_fixed and ratelimit_sliding. A denied request does not count
-- anywhere.
--
-- The state of all policies lives in one string value, three numbers per
-- policy (encoded as said below), written with one SET whose TTL is the
-- longest any policy needs: one read and one write whatever the number of
-- policies, which keeps a multi-policy decision close to a single one.
-- Per policy: GCRA keeps its TAT (microseconds since 2024-01-01) and two
-- zeros; a fixed window its count, its end (milliseconds since
-- 2024-01-01) and a zero; a sliding window the index of its current
-- window, its count and the previous window's count. The key belongs to
-- one list of policies with their limits: the caller derives it from them.
--
-- KEYS[1]  state key
-- ARGV[2i-1], ARGV[2i]  policy i (1 <= i <= n <= 8), its algorithm told
--          by the signs:
--          GCRA: emission interval in microseconds (number > 0, may be
--               fractional), burst (integer >= 1)
--          fixed window: -limit per window (integer <= -1), window in
--               milliseconds (integer >= 1)
--          sliding window: -limit per window (integer <= -1), -window
--               in microseconds (integer <= -1000)
-- ARGV[2n+1]  cost: how many requests this call is (integer >= 0; 0 only
--          peeks); 1 when absent
--
-- Returns  when allowed (every policy has room): per policy i, two
--          integers: remaining after this call, microseconds until the
--          policy is back to its full limit; 2n values.
--          When denied: {0, then per policy i, four integers: has room
--          (1|0), remaining now, microseconds until a request of this
--          cost would fit in this policy (0 if it has room), microseconds
--          until the policy is back to its full limit}, 1 + 4n values.
--          The lengths tell the two apart; the allowed reply, the common
--          one, is the shorter, cheaper to build, send and read.
-- Complexity: O(number of policies); touches one key.
--
-- A decision over two policies should run at 0.9x or more of the rate of
-- ratelimit_gcra's single one (issue 14), and the server's time per call
-- bounds both: each argument, reply value, table, string and C function
-- call shows in it. Hence the signs, not a name, for the algorithm; the
-- cost left out when it is 1; numbers read with arithmetic ("x + 0"),
-- which converts a numeric string as tonumber does at half its cost (no
-- function call: every argument is a number the client formatted, and
-- TIME's fields are too); an allowed request deciding each policy once;
-- and a denial's longer figures computed only for a denial.
local floor, ceil, max, byte = math.floor, math.ceil, math.max, string.byte
-- rawget: embedded test servers have no cmsgpack, and raise an error on
-- reading a global that does not exist.
local msgpack = rawget(_G, 'cmsgpack')
local argv = ARGV
local n = #argv
local cost = 1
if n % 2 == 1 then cost = argv[n] + 0 end
n = (n - n % 2) / 2
local t = redis.call('TIME')
local sec, usec = t[1] + 0, t[2] + 0
local now = (sec - 1704067200) * 1000000 + usec -- GCRA, fixed window
local abs = sec * 1000000 + usec -- sliding windows align on the Unix epoch
local now_ms = (now - now % 1000) / 1000 -- floor(now / 1000): now is whole

-- Tables are made at their final size at once: {byte(s, 1, k)} is the
-- first k bytes of s as numbers in one allocation, where filling {} one
-- by one would grow it several times.
local zeros = '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'
-- The denied reply's start: 0, then has room (1) and three zeros per
-- policy.
local denied = '\0\1\0\0\0\1\0\0\0\1\0\0\0\1\0\0\0\1\0\0\0\1\0\0\0\1\0\0\0\1\0\0\0'

-- The state as read, three numbers per policy. Zeros stand for a fresh
-- state: a TAT, window end or window index of 0 is long past.
--
-- The numbers are MessagePack where the server has cmsgpack (every Redis
-- since 2.6): decoded and encoded in C, which keeps this script cheap.
-- Embedded test servers without it get text, the numbers in '%.17g'
-- separated by spaces. One server never writes both.
local st
local v = redis.call('GET', KEYS[1])
if not v then
  st = {byte(zeros, 1, 3 * n)}
elseif msgpack then
  st = {msgpack.unpack(v)}
else
  st = {}
  for x in string.gmatch(v, '%S+') do st[#st + 1] = tonumber(x) end
end

-- The allowed path: each policy in turn takes the cost if it has room,
-- its figures going to reply[1 .. 2n] and its new state to reply[2n+1 ..
-- 5n], which start as zeros. The first policy without room ends it. When
-- every policy had room, the state is written from there and the reply
-- ends at a nil set just after its figures: Redis ends a reply at its
-- first nil.
local reply = {byte(zeros, 1, 5 * n)}
local ttl = 1 -- milliseconds the written state must live
local all = true
for i = 1, n do
  local a, b = argv[2 * i - 1] + 0, argv[2 * i] + 0
  local j = 3 * i - 2 -- this policy's first number in the state
  local w = 2 * n + j -- and in the state to write
  if a > 0 then -- GCRA
    local interval = a
    local tolerance = b * interval
    local ahead = (st[j] or 0) - now
    if ahead < 0 then ahead = 0 end
    local after = ahead + cost * interval
    if not (after <= tolerance) then all = false break end
    -- after <= tolerance: the remaining is >= 0.
    reply[2 * i - 1], reply[2 * i] = floor((tolerance - after) / interval + 1e-9), ceil(after)
    reply[w] = now + after
    local live = ceil(after / 1000)
    if live > ttl then ttl = live end
  elseif b > 0 then -- fixed window
    local limit, window = -a, b
    local count, window_end = st[j] or 0, st[j + 1] or 0
    if window_end <= now_ms then count, window_end = 0, now_ms + window end
    if not (count + cost <= limit) then all = false break end
    local reset = 0
    if count + cost > 0 then reset = (window_end - now_ms) * 1000 end
    reply[2 * i - 1], reply[2 * i] = limit - count - cost, reset
    reply[w], reply[w + 1] = count + cost, window_end
    if window_end - now_ms > ttl then ttl = window_end - now_ms end
  else -- sliding window
    local limit, window = -a, -b
    local idx = floor(abs / window)
    local elapsed = abs - idx * window
    local s1 = st[j]
    local cur, prev = 0, 0
    if s1 == idx then
      cur, prev = st[j + 1] or 0, st[j + 2] or 0
    elseif s1 == idx - 1 then
      prev = st[j + 1] or 0
    end
    local estimate = prev * (window - elapsed) / window + cur
    if not (estimate + cost <= limit) then all = false break end
    -- Until the window is back to its full limit.
    local reset = 0
    if cur + cost > 0 then reset = 2 * window - elapsed elseif prev > 0 then reset = window - elapsed end
    reply[2 * i - 1], reply[2 * i] = max(floor(limit - estimate - cost), 0), ceil(reset)
    reply[w], reply[w + 1], reply[w + 2] = idx, cur + cost, prev
    local live = ceil((2 * window - elapsed) / 1000)
    if live > ttl then ttl = live end
  end
end

if all then
  if cost > 0 then
    -- %d: some Redis versions would write a round Lua number in exponent
    -- form ("1e+08"), which PX rejects.
    local value
    if msgpack then
      value = msgpack.pack(unpack(reply, 2 * n + 1, 5 * n))
    else
      local text = {}
      for k = 1, 3 * n do text[k] = string.format('%.17g', reply[2 * n + k]) end
      value = table.concat(text, ' ')
    end
    redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ttl))
  end
  reply[2 * n + 1] = nil
  return reply
end

-- Denied: nothing is written, and every policy is decided again. Pass 1
-- decides each for the cost; pass 2 decides again, for a cost of 0, the
-- policies that had room: a request that is not counted leaves them as
-- they are now, and that is what they report. (A cost of 0 always has
-- room where the cost had.)
reply = {byte(denied, 1, 4 * n + 1)}
for pass = 1, 2 do
  local c = cost
  if pass == 2 then c = 0 end
  for i = 1, n do
    local r = 4 * i - 2 -- this policy's first value in the reply
    if pass == 1 or reply[r] == 1 then
      local a, b = argv[2 * i - 1] + 0, argv[2 * i] + 0
      local j = 3 * i - 2
      local s1, s2, s3 = st[j], st[j + 1], st[j + 2]
      -- If there is room: remaining and reset after the request.
      -- If not: remaining and reset now, and the wait.
      local room, rem, reset, retry
      if a > 0 then -- GCRA
        local interval, burst = a, b
        local tolerance = burst * interval
        local ahead = (s1 or 0) - now
        if ahead < 0 then ahead = 0 end
        local after = ahead + c * interval
        room = after <= tolerance
        if room then
          rem = floor((tolerance - after) / interval + 1e-9)
          reset = ceil(after)
        else
          rem = max(floor((tolerance - ahead) / interval + 1e-9), 0)
          reset = ceil(ahead)
          retry = ceil(after - tolerance)
        end
      elseif b > 0 then -- fixed window
        local limit, window = -a, b
        local count, window_end = s1 or 0, s2 or 0
        if window_end <= now_ms then count, window_end = 0, now_ms + window end
        local left = (window_end - now_ms) * 1000
        room = count + c <= limit
        if room then
          rem = limit - count - c
          reset = 0
          if count + c > 0 then reset = left end
        else
          rem = max(limit - count, 0)
          reset = 0
          if count > 0 then reset = left end
          retry = left
        end
      else -- sliding window
        local limit, window = -a, -b
        local idx = floor(abs / window)
        local elapsed = abs - idx * window
        local cur, prev = 0, 0
        if s1 == idx then
          cur, prev = s2 or 0, s3 or 0
        elseif s1 == idx - 1 then
          prev = s2 or 0
        end
        local estimate = prev * (window - elapsed) / window + cur
        room = estimate + c <= limit
        -- The count of the current window that the reset is for.
        local counted = cur
        if room then
          rem = max(floor(limit - estimate - c), 0)
          counted = cur + c
        else
          rem = max(floor(limit - estimate), 0)
          if cur + c <= limit then
            -- The previous window's share has to shrink to limit - cur - c.
            retry = max(ceil(window - (limit - cur - c) * window / prev - elapsed), 1)
          else
            -- Wait for the next window, where this one's count has to
            -- shrink to limit - c.
            retry = max(ceil(window - elapsed + max(window - (limit - c) * window / cur, 0)), 1)
          end
        end
        -- Until the window is back to its full limit.
        reset = 0
        if counted > 0 then reset = 2 * window - elapsed elseif prev > 0 then reset = window - elapsed end
        reset = ceil(reset)
      end
      if not room then
        reply[r], reply[r + 1], reply[r + 2], reply[r + 3] = 0, rem, retry, reset
      elseif pass == 2 then
        reply[r + 1], reply[r + 3] = rem, reset -- has room, no wait: as made
      end
    end
  end
end
return reply
