-- ratelimit_multi: several rate limits on one key, decided together.
--
-- Every policy is checked first, on one reading of TIME; the request is
-- counted in every policy only if every policy has room for it, so a
-- request denied by one policy (say 1000 per hour) costs nothing in the
-- others (10 per second). The algorithms are those of ratelimit_gcra,
-- ratelimit_fixed and ratelimit_sliding, with the same stored state, each
-- policy on its own key. A denied request does not count anywhere.
-- The caller puts every key in one cluster slot (one hash tag).
--
-- KEYS[i]  state key of policy i (1 <= i <= 8)
-- ARGV[1]  cost: how many requests this call is (integer >= 0; 0 only peeks)
-- ARGV[3i-1], ARGV[3i], ARGV[3i+1]  policy i:
--          'g', emission interval in microseconds (number > 0, may be
--               fractional), burst (integer >= 1)
--          'f' or 's' (fixed or sliding window), limit per window
--               (integer >= 1), window in milliseconds (integer >= 1)
--
-- Returns  {allowed (1|0), then per policy i, four integers:
--          has room (1|0), remaining (after this call if allowed, else
--          now), microseconds until a request of this cost would fit in
--          this policy (0 if it has room), microseconds until the policy
--          is back to its full limit}
-- Complexity: O(number of policies); touches one key per policy.
local cost = tonumber(ARGV[1])
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])

-- Each check returns room (bool), the reply values, and a commit function
-- that writes the new state (called only if every policy has room).
local function gcra(key, interval, burst)
  local now = (sec - 1704067200) * 1000000 + usec
  local tolerance = burst * interval
  local tat = tonumber(redis.call('GET', key) or now)
  local ahead = math.max(tat - now, 0)
  local after = ahead + cost * interval
  if after > tolerance then
    local remaining = math.max(math.floor((tolerance - ahead) / interval + 1e-9), 0)
    return false, {remaining, math.ceil(after - tolerance), math.ceil(ahead)}
  end
  local function commit()
    if cost > 0 then
      redis.call('SET', key, string.format('%.17g', now + after),
        'PX', string.format('%d', math.max(math.ceil(after / 1000), 1)))
    end
  end
  local remaining = math.max(math.floor((tolerance - after) / interval + 1e-9), 0)
  local now_remaining = math.max(math.floor((tolerance - ahead) / interval + 1e-9), 0)
  return true, {remaining, 0, math.ceil(after)}, {now_remaining, 0, math.ceil(ahead)}, commit
end

local function fixed(key, limit, window)
  local count = tonumber(redis.call('GET', key) or '0')
  local ttl = redis.call('PTTL', key)
  if count + cost > limit then
    if ttl < 0 and count > 0 then
      redis.call('PEXPIRE', key, window)
      ttl = window
    end
    return false, {math.max(limit - count, 0), math.max(ttl, 0) * 1000, math.max(ttl, 0) * 1000}
  end
  local reset = ttl
  if ttl < 0 then reset = window end
  local function commit()
    if cost > 0 then
      redis.call('INCRBY', key, cost)
      if ttl < 0 then redis.call('PEXPIRE', key, window) end
    end
  end
  if cost == 0 then reset = math.max(ttl, 0) end
  return true, {limit - count - cost, 0, reset * 1000}, {limit - count, 0, math.max(ttl, 0) * 1000}, commit
end

local function sliding(key, limit, window_ms)
  local window = window_ms * 1000
  local now = sec * 1000000 + usec
  local idx = math.floor(now / window)
  local elapsed = now - idx * window
  local h = redis.call('HMGET', key, 'w', 'c', 'p')
  local w = tonumber(h[1])
  local cur, prev = 0, 0
  if w == idx then
    cur, prev = tonumber(h[2]) or 0, tonumber(h[3]) or 0
  elseif w == idx - 1 then
    prev = tonumber(h[2]) or 0
  end
  local estimate = prev * (window - elapsed) / window + cur
  local function reset_after(c, p)
    if c > 0 then return 2 * window - elapsed elseif p > 0 then return window - elapsed end
    return 0
  end
  if estimate + cost > limit then
    local retry
    if cur + cost <= limit then
      retry = window - (limit - cur - cost) * window / prev - elapsed
    else
      retry = window - elapsed + math.max(window - (limit - cost) * window / cur, 0)
    end
    return false, {math.max(math.floor(limit - estimate), 0), math.max(math.ceil(retry), 1),
      math.ceil(reset_after(cur, prev))}
  end
  local function commit()
    if cost > 0 then
      redis.call('HSET', key, 'w', string.format('%d', idx), 'c', cur + cost, 'p', prev)
      redis.call('PEXPIRE', key, string.format('%d', math.ceil((2 * window - elapsed) / 1000)))
    end
  end
  local after = cur
  if cost > 0 then after = cur + cost end
  return true, {math.max(math.floor(limit - estimate - cost), 0), 0, math.ceil(reset_after(after, prev))},
    {math.max(math.floor(limit - estimate), 0), 0, math.ceil(reset_after(cur, prev))}, commit
end

local checks = {g = gcra, f = fixed, s = sliding}
local all = true
local rooms, ifallowed, ifdenied, commits = {}, {}, {}, {}
for i = 1, #KEYS do
  local check = checks[ARGV[3 * i - 1]]
  local room, vals, now_vals, commit = check(KEYS[i], tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1]))
  rooms[i], ifallowed[i], ifdenied[i], commits[i] = room, vals, now_vals or vals, commit
  all = all and room
end

local reply = {0}
if all then
  reply[1] = 1
  for i = 1, #KEYS do commits[i]() end
end
for i = 1, #KEYS do
  local v = ifdenied[i]
  if all then v = ifallowed[i] end
  local room = 0
  if rooms[i] then room = 1 end
  reply[#reply + 1] = room
  reply[#reply + 1] = v[1]
  reply[#reply + 1] = v[2]
  reply[#reply + 1] = v[3]
end
return reply
