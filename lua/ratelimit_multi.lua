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
-- Per policy: GCRA keeps its TAT (microseconds since 2024-01-01); a fixed
-- window its count and its end (milliseconds since 2024-01-01); a
-- sliding window the index of its current window, its count and the
-- previous window's count. The key belongs to one list of policies with
-- their limits: the caller derives it from them.
--
-- KEYS[1]  state key
-- ARGV[1]  cost: how many requests this call is (integer >= 0; 0 only peeks)
-- ARGV[3i-1], ARGV[3i], ARGV[3i+1]  policy i (1 <= i <= 8):
--          'g', emission interval in microseconds (number > 0, may be
--               fractional), burst (integer >= 1)
--          'f' or 's' (fixed or sliding window), limit per window
--               (integer >= 1), window in milliseconds (integer >= 1)
--
-- Returns  when allowed (every policy has room): {1, then per policy i,
--          two integers: remaining after this call, microseconds until
--          the policy is back to its full limit}, 1 + 2n values;
--          when denied: {0, then per policy i, four integers: has room
--          (1|0), remaining now, microseconds until a request of this
--          cost would fit in this policy (0 if it has room), microseconds
--          until the policy is back to its full limit}, 1 + 4n values.
--          The shorter allowed reply is cheaper to build, send and read.
-- Complexity: O(number of policies); touches one key.
--
-- Numbers are read with arithmetic ("x + 0"), which converts a numeric
-- string as tonumber does at half its cost (no function call); every
-- argument is a number the client formatted, and TIME's fields are too.
local floor, ceil, max, byte = math.floor, math.ceil, math.max, string.byte
-- rawget: embedded test servers have no cmsgpack, and raise an error on
-- reading a global that does not exist.
local msgpack = rawget(_G, 'cmsgpack')
local argv = ARGV
local cost = argv[1] + 0
local n = (#argv - 1) / 3
local t = redis.call('TIME')
local sec, usec = t[1] + 0, t[2] + 0
local now = (sec - 1704067200) * 1000000 + usec -- GCRA, fixed window
local abs = sec * 1000000 + usec -- sliding windows align on the Unix epoch
local now_ms = floor(now / 1000)

-- Tables are made at their final size at once: {byte(s, 1, k)} is the
-- first k bytes of s as numbers in one allocation, where filling {} one
-- by one would grow it several times.
local zeros = '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'
-- The denied reply's start: 0, then has room (1) and three zeros per
-- policy.
local denied = '\0\1\0\0\0\1\0\0\0\1\0\0\0\1\0\0\0\1\0\0\0\1\0\0\0\1\0\0\0\1\0\0\0'

local v = redis.call('GET', KEYS[1])

-- Pass 1 decides every policy for the cost. While every policy has room,
-- each one's figures go to the allowed reply and its new state over the
-- one read (no policy reads another's). At the first without room, the
-- denied reply is made: from then on, pass 1 only fills in the policies
-- without room, and pass 2 decides again, on the state as read, for a
-- cost of 0, the policies that had room: a request that is not counted
-- leaves them as they are now, and that is what they report. (A cost of
-- 0 always has room where the cost had.) So an allowed request computes
-- each policy's figures once, into two small tables.
local reply = {byte(zeros, 1, 2 * n + 1)}
reply[1] = 1
local st -- the state: three numbers per policy
local deny -- the denied reply, once some policy has no room
local ttl = 1 -- milliseconds the written state must live
for pass = 1, 2 do
  -- The state as read (again in pass 2: pass 1 wrote over it). Zeros
  -- stand for a fresh state: a TAT, window end or window index of 0 is
  -- long past.
  --
  -- The numbers are MessagePack where the server has cmsgpack (every
  -- Redis since 2.6): decoded and encoded in C, which keeps this script
  -- cheap. Embedded test servers without it get text, the numbers in
  -- '%.17g' separated by spaces. One server never writes both.
  if not v then
    st = {byte(zeros, 1, 3 * n)}
  elseif msgpack then
    st = {msgpack.unpack(v)}
  else
    st = {}
    for x in string.gmatch(v, '%S+') do st[#st + 1] = tonumber(x) end
  end
  for i = 1, n do
    local r = 4 * i - 2 -- this policy's first value in the denied reply
    if pass == 1 or deny[r] == 1 then
      local c = cost
      if pass == 2 then c = 0 end
      local kind, a, b = argv[3 * i - 1], argv[3 * i] + 0, argv[3 * i + 1] + 0
      local j = 3 * i - 2
      local s1, s2, s3 = st[j], st[j + 1], st[j + 2]
      -- If there is room: remaining and reset after the request, the new
      -- state (x1, x2, x3) and how long it must live.
      -- If not: remaining and reset now, and the wait.
      local room, rem, reset, retry, x1, x2, x3, live
      if kind == 'g' then
        local interval, burst = a, b
        local tolerance = burst * interval
        local ahead = (s1 or 0) - now
        if ahead < 0 then ahead = 0 end
        local after = ahead + c * interval
        room = after <= tolerance
        if room then
          -- after <= tolerance: rem >= 0. Comparisons rather than
          -- max where they read as well: a call costs more.
          rem = floor((tolerance - after) / interval + 1e-9)
          reset = ceil(after)
          x1, x2, x3, live = now + after, 0, 0, ceil(after / 1000)
        else
          rem = max(floor((tolerance - ahead) / interval + 1e-9), 0)
          reset = ceil(ahead)
          retry = ceil(after - tolerance)
        end
      elseif kind == 'f' then
        local limit, window = a, b
        local count, window_end = s1 or 0, s2 or 0
        if window_end <= now_ms then count, window_end = 0, now_ms + window end
        local left = (window_end - now_ms) * 1000
        room = count + c <= limit
        if room then
          rem = limit - count - c
          reset = 0
          if count + c > 0 then reset = left end
          x1, x2, x3, live = count + c, window_end, 0, window_end - now_ms
        else
          rem = max(limit - count, 0)
          reset = 0
          if count > 0 then reset = left end
          retry = left
        end
      else -- 's'
        local limit, window = a, b * 1000
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
          x1, x2, x3, live = idx, cur + c, prev, ceil((2 * window - elapsed) / 1000)
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
      if pass == 2 then
        deny[r + 1], deny[r + 3] = rem, reset -- room, no wait: as made
      elseif not room then
        if not deny then deny = {byte(denied, 1, 4 * n + 1)} end
        deny[r], deny[r + 1], deny[r + 2], deny[r + 3] = 0, rem, retry, reset
      elseif not deny then
        reply[2 * i], reply[2 * i + 1] = rem, reset
        st[j], st[j + 1], st[j + 2] = x1, x2, x3
        if live > ttl then ttl = live end
      end
    end
  end
  if not deny then break end
end

if deny then return deny end
if cost > 0 then
  -- %d: some Redis versions would write a round Lua number in exponent
  -- form ("1e+08"), which PX rejects.
  local value
  if msgpack then
    value = msgpack.pack(unpack(st, 1, 3 * n))
  else
    local text = {}
    for k = 1, 3 * n do text[k] = string.format('%.17g', st[k]) end
    value = table.concat(text, ' ')
  end
  redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ttl))
end
return reply
