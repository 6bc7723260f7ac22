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
-- policies, which keeps a multi-policy decision close to a single one. Per policy: GCRA keeps its TAT (microseconds since 2024-01-01); a
-- fixed window its count and its end (milliseconds since 2024-01-01); a
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
local floor, ceil, max = math.floor, math.ceil, math.max
-- rawget: embedded test servers have no cmsgpack, and raise an error on
-- reading a global that does not exist.
local msgpack = rawget(_G, 'cmsgpack')
local argv = ARGV
local cost = tonumber(argv[1])
local n = (#argv - 1) / 3
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local now = (sec - 1704067200) * 1000000 + usec -- GCRA, fixed window
local abs = sec * 1000000 + usec -- sliding windows align on the Unix epoch
local now_ms = floor(now / 1000)

-- Tables are what this script spends most on after the calls themselves
-- (allocation, growth, garbage collection), so it makes two, each at its
-- final size at once: {string.byte(zeros, 1, k)} is k zeros in one
-- allocation, where filling {} one by one would grow it several times.
local zeros = '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'
-- reply[1 .. 4n+1] is the denied reply as it is built; reply[4n+2 ..
-- 7n+1] the state to write, three numbers per policy. Whichever reply is
-- returned, it ends at a nil set just after it: Redis ends a reply at its
-- first nil.
local reply = {string.byte(zeros, 1, 7 * n + 1)}
-- st: the state read, three numbers per policy. Zeros stand for a fresh
-- state: a TAT, window end or window index of 0 is long past.
--
-- The numbers are MessagePack where the server has cmsgpack (every Redis
-- since 2.6): decoded and encoded in C, which keeps this script cheap.
-- Embedded test servers without it get text, the numbers in '%.17g'
-- separated by spaces. One server never writes both.
local st
local v = redis.call('GET', KEYS[1])
if not v then
  st = {string.byte(zeros, 1, 3 * n)}
elseif msgpack then
  st = {msgpack.unpack(v)}
else
  st = {}
  for x in string.gmatch(v, '%S+') do st[#st + 1] = tonumber(x) end
end

-- Pass 1 decides every policy for the cost. Only if some policy has no
-- room, pass 2 decides again, for a cost of 0, the policies that had: a
-- request that is not counted leaves them as they are now, and that is
-- what they report. (A cost of 0 always has room where the cost had.) So
-- an allowed request computes each policy's figures once.
local all = true
local ttl = 1 -- milliseconds the written state must live
for pass = 1, 2 do
  for i = 1, n do
    local r = 4 * i - 2 -- this policy's first value in the denied reply
    if pass == 1 or reply[r] == 1 then
      local c = cost
      if pass == 2 then c = 0 end
      local kind, a, b = argv[3 * i - 1], tonumber(argv[3 * i]), tonumber(argv[3 * i + 1])
      local j = 3 * i - 2
      local s1, s2, s3 = st[j], st[j + 1], st[j + 2]
      local w = 4 * n + 1 + j -- this policy's state to write, in reply
      -- If there is room: remaining and reset after the request.
      -- If not: remaining and reset now, and the wait.
      local room, rem, reset, retry
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
          reply[w], reply[w + 1], reply[w + 2] = now + after, 0, 0
          local live = ceil(after / 1000)
          if live > ttl then ttl = live end
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
          reply[w], reply[w + 1], reply[w + 2] = count + c, window_end, 0
          if window_end - now_ms > ttl then ttl = window_end - now_ms end
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
          reply[w], reply[w + 1], reply[w + 2] = idx, cur + c, prev
          ttl = max(ttl, ceil((2 * window - elapsed) / 1000))
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
      if room then
        reply[r], reply[r + 1], reply[r + 2], reply[r + 3] = 1, rem, 0, reset
      else
        all = false
        reply[r], reply[r + 1], reply[r + 2], reply[r + 3] = 0, rem, retry, reset
      end
    end
  end
  if all then break end
end

if not all then
  reply[4 * n + 2] = nil
  return reply
end
if cost > 0 then
  -- %d: some Redis versions would write a round Lua number in exponent
  -- form ("1e+08"), which PX rejects.
  local value
  if msgpack then
    value = msgpack.pack(unpack(reply, 4 * n + 2, 7 * n + 1))
  else
    local text = {}
    for k = 1, 3 * n do text[k] = string.format('%.17g', reply[4 * n + 1 + k]) end
    value = table.concat(text, ' ')
  end
  redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ttl))
end
-- The allowed reply: remaining and reset of each policy, moved forward
-- over the has-room and wait values (each source lies beyond every
-- value written before it).
reply[1] = 1
for i = 1, n do
  reply[2 * i], reply[2 * i + 1] = reply[4 * i - 1], reply[4 * i + 1]
end
reply[2 * n + 2] = nil
return reply
