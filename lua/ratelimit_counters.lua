-- ratelimit_counters: several counters, each under a key of its own,
-- decided together.
--
-- ratelimit_multi keeps several policies of one key in one value; here
-- each counter has its own key, so that one counter (an organisation's)
-- is shared by requests whose other counters (their users') differ. Every
-- counter is checked first, on one reading of TIME; the request is counted
-- in every counter only if every enforced counter has room for it, so a
-- request denied by one counter costs nothing in the others. A shadow
-- counter is decided and reported but never denies: it counts an allowed
-- request when it has room, and nothing when it has none. A denied request
-- is counted nowhere, shadow counters included.
--
-- The algorithms are those of ratelimit_multi (GCRA, fixed window from the
-- first request, sliding window), and one more: a fixed window aligned on
-- the Unix epoch (a minute's window starts at every whole minute, a day's
-- at midnight UTC), the window envoyproxy/ratelimit counts in.
--
-- The state of one counter is one string value, its numbers in MessagePack
-- where the server has cmsgpack (every Redis since 2.6), else in text
-- ('%.17g', separated by spaces: embedded test servers). GCRA keeps its TAT
-- (microseconds since 2024-01-01); a fixed window its count and its end
-- (milliseconds since 2024-01-01); a sliding window the index of its
-- current window, its count and the previous window's count; an aligned
-- window its index and its count. The caller names the algorithm and the
-- window length in the key, so that states of two algorithms never meet.
-- Each written key lives as long as its counter needs (PX).
--
-- KEYS[i]  counter i's state (1 <= i <= n <= 16), all in one cluster slot;
--          no key twice
-- ARGV[3i-2], ARGV[3i-1]  counter i's algorithm, told by the signs:
--          GCRA: emission interval in microseconds (number > 0, may be
--               fractional), burst (integer >= 1)
--          fixed window: -limit per window (integer <= -1), window in
--               milliseconds (integer >= 1)
--          sliding window: -limit (integer <= -1), -window in
--               microseconds (integer <= -1000), the precision of TIME
--          aligned window: limit (integer >= 1), -window in milliseconds
--               (integer <= -1)
-- ARGV[3i] counter i's cost (integer >= 0; 0 only peeks); for a shadow
--          counter, -1 - cost
--
-- Returns  {allowed (1|0), then per counter i four integers: has room for
--          its cost (1|0), remaining, microseconds until a request of this
--          cost would fit in this counter (0 if it has room), microseconds
--          until the counter is back to its full limit}, 1 + 4n values.
--          Remaining and the reset are after the request for a counter
--          that counted it, and as they are now for one that did not.
-- Complexity: O(n); reads n keys, writes at most n.
local floor, ceil, max, byte = math.floor, math.ceil, math.max, string.byte
-- rawget: embedded test servers have no cmsgpack, and raise an error on
-- reading a global that does not exist.
local msgpack = rawget(_G, 'cmsgpack')
local argv = ARGV
local n = #KEYS
local t = redis.call('TIME')
local sec, usec = t[1] + 0, t[2] + 0
local now = (sec - 1704067200) * 1000000 + usec -- GCRA, fixed window
local abs = sec * 1000000 + usec -- sliding and aligned windows: Unix epoch
local now_ms = (now - now % 1000) / 1000

-- Tables are made at their final size at once ({byte(s, 1, k)} is the
-- first k bytes of s as numbers, in one allocation): the reply, 1 + 4n
-- values; per counter its state to write (up to three numbers, and how
-- many: 0 for nothing to write) and its TTL; and the figures as they are
-- now, for a denial.
local zeros = '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'
local reply = {byte(zeros, 1, 1 + 4 * n)}
local st = {byte(zeros, 1, 5 * n)} -- per counter i: st[5i-4 .. 5i-2] the numbers, st[5i-1] how many, st[5i] the TTL
local nowf = {byte(zeros, 1, 2 * n)}
local allowed = 1
for i = 1, n do
  local a, b, c = argv[3 * i - 2] + 0, argv[3 * i - 1] + 0, argv[3 * i] + 0
  local shadow = c < 0
  if shadow then c = -1 - c end
  local s1, s2, s3
  local v = redis.call('GET', KEYS[i])
  if v then
    if msgpack then
      s1, s2, s3 = msgpack.unpack(v)
    else
      local txt = {}
      for x in string.gmatch(v, '%S+') do txt[#txt + 1] = tonumber(x) end
      s1, s2, s3 = txt[1], txt[2], txt[3]
    end
  end
  -- Per counter: room for the cost; remaining and reset now, and after
  -- the request if it is counted; the wait; how many numbers the state to
  -- write has (written to st), and its TTL.
  local room, rem, reset, rem_after, reset_after, retry, state, ttl
  retry = 0
  if a > 0 and b > 0 then -- GCRA
    local interval = a
    local tolerance = b * interval
    local ahead = (s1 or 0) - now
    if ahead < 0 then ahead = 0 end
    local after = ahead + c * interval
    room = after <= tolerance
    rem = max(floor((tolerance - ahead) / interval + 1e-9), 0)
    reset = ceil(ahead)
    if room then
      rem_after, reset_after = floor((tolerance - after) / interval + 1e-9), ceil(after)
      state, ttl = 1, ceil(after / 1000)
      st[5 * i - 4] = now + after
    else
      retry = ceil(after - tolerance)
    end
  elseif b > 0 then -- fixed window from the first request
    local limit, window = -a, b
    local count, window_end = s1 or 0, s2 or 0
    if window_end <= now_ms then count, window_end = 0, now_ms + window end
    local left = (window_end - now_ms) * 1000
    room = count + c <= limit
    rem, reset = max(limit - count, 0), 0
    if count > 0 then reset = left end
    if room then
      rem_after, reset_after = limit - count - c, 0
      if count + c > 0 then reset_after = left end
      state, ttl = 2, window_end - now_ms
      st[5 * i - 4], st[5 * i - 3] = count + c, window_end
    else
      retry = left
    end
  elseif a < 0 then -- sliding window
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
    rem, reset = max(floor(limit - estimate), 0), 0
    if cur > 0 then reset = 2 * window - elapsed elseif prev > 0 then reset = window - elapsed end
    reset = ceil(reset)
    if room then
      rem_after, reset_after = max(floor(limit - estimate - c), 0), 0
      if cur + c > 0 then reset_after = 2 * window - elapsed elseif prev > 0 then reset_after = window - elapsed end
      reset_after = ceil(reset_after)
      state, ttl = 3, ceil((2 * window - elapsed) / 1000)
      st[5 * i - 4], st[5 * i - 3], st[5 * i - 2] = idx, cur + c, prev
    elseif cur + c <= limit then
      -- The previous window's share has to shrink to limit - cur - c.
      retry = max(ceil(window - (limit - cur - c) * window / prev - elapsed), 1)
    else
      -- Wait for the next window, where this one's count has to shrink
      -- to limit - c.
      retry = max(ceil(window - elapsed + max(window - (limit - c) * window / cur, 0)), 1)
    end
  else -- aligned window
    local limit, window = a, -b * 1000
    local idx = floor(abs / window)
    local left = (idx + 1) * window - abs
    local count = 0
    if s1 == idx then count = s2 or 0 end
    room = count + c <= limit
    rem, reset = max(limit - count, 0), 0
    if count > 0 then reset = left end
    if room then
      rem_after, reset_after = limit - count - c, 0
      if count + c > 0 then reset_after = left end
      state, ttl = 2, ceil(left / 1000)
      st[5 * i - 4], st[5 * i - 3] = idx, count + c
    else
      retry = left
    end
  end
  if not room and not shadow then allowed = 0 end
  local r = 4 * i - 2
  if room then
    reply[r], reply[r + 1], reply[r + 2], reply[r + 3] = 1, rem_after, 0, reset_after
    -- Written only when the request is counted and adds something.
    if c > 0 then st[5 * i - 1], st[5 * i] = state, max(ttl, 1) end
  else
    reply[r], reply[r + 1], reply[r + 2], reply[r + 3] = 0, rem, retry, reset
  end
  nowf[2 * i - 1], nowf[2 * i] = rem, reset
end
reply[1] = allowed

if allowed == 1 then
  for i = 1, n do
    local k = st[5 * i - 1]
    if k > 0 then
      -- %d: some Redis versions would write a round Lua number in exponent
      -- form ("1e+08"), which PX rejects.
      local value
      if msgpack then
        value = msgpack.pack(unpack(st, 5 * i - 4, 5 * i - 5 + k))
      else
        local text = {}
        for j = 1, k do text[j] = string.format('%.17g', st[5 * i - 5 + j]) end
        value = table.concat(text, ' ')
      end
      redis.call('SET', KEYS[i], value, 'PX', string.format('%d', st[5 * i]))
    end
  end
  return reply
end

-- Denied: nothing is written, and the counters that had room report what
-- they have now, not what they would have had.
for i = 1, n do
  local r = 4 * i - 2
  if reply[r] == 1 then
    reply[r + 1], reply[r + 3] = nowf[2 * i - 1], nowf[2 * i]
  end
end
return reply
