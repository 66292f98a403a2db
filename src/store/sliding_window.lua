-- slidegate sliding-window decision: all counters of one request, all or nothing.
--
-- Each counter is a sorted set: score = time of a hit in microseconds (Redis's own clock, so every
-- replica shares one timeline), member = a unique hit id. Pass one trims what left the window and
-- decides every counter; pass two records the hits only if no enforced counter is over its limit.
-- Redis runs a script atomically and (7.0) replicates its effects, so reading TIME is safe.
--
-- KEYS[1..n]         the counter keys (one hash slot in a cluster)
-- KEYS[n+1..2n]      cluster only: each counter's provisional log, the hits of cross-slot requests,
--                    which the store takes back if another slot denies the request
-- ARGV[1]            the request id: member of its first hit on a key; hit n > 1 is ARGV[1] .. ':' .. n
-- ARGV[2]            '1' if this call is one slot's part of a cross-slot request, else '0'
-- ARGV[3 + 4(i-1)..] per counter: limit, window (us), hits, shadow ('1' or '0')
--
-- Returns { allowed, then per counter: over, count, reset_after_us, reset1_us }
--   over            1 if this counter cannot take the request's hits
--   count           hits in the window after the decision
--   reset_after_us  over: until the request's hits fit (the window if they never can);
--                   otherwise until the oldest hit leaves the window (0 if empty)
--   reset1_us       until one hit fits, -1 if one fits now (for the local deny cache); -2 if the
--                   counter is full but holds provisional hits, which may leave before their time

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rid = ARGV[1]
local part = ARGV[2] == '1'
local n = (#ARGV - 2) / 4
local tracked = #KEYS == 2 * n

-- Time at which the k-th oldest hit of `key` leaves the window, or nil if it holds fewer.
local function dropped_at(key, k, window)
  local entry = redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')
  if entry[2] then
    return tonumber(entry[2]) + window
  end
  return nil
end

-- Whether counter i holds provisional hits in its window (only tracked in a cluster).
local function has_provisional(i, window)
  if not tracked then
    return false
  end
  local log = KEYS[n + i]
  redis.call('ZREMRANGEBYSCORE', log, '-inf', now - window)
  return redis.call('ZCARD', log) > 0
end

local function until_fits(key, excess, window)
  local at = dropped_at(key, excess, window)
  if at == nil then
    return window
  end
  return math.max(at - now, 0)
end

local limit, window, hits, shadow = {}, {}, {}, {}
local over, count, reset, reset1 = {}, {}, {}, {}
local pending = {}
local allowed = 1

for i = 1, n do
  local key = KEYS[i]
  local base = 3 + (i - 1) * 4
  limit[i] = tonumber(ARGV[base])
  window[i] = tonumber(ARGV[base + 1])
  hits[i] = tonumber(ARGV[base + 2])
  shadow[i] = ARGV[base + 3] == '1'

  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window[i])
  local c = redis.call('ZCARD', key) + (pending[key] or 0)
  local ask = math.max(hits[i], 1)
  count[i] = c
  reset1[i] = -1
  if c + 1 > limit[i] then
    reset1[i] = until_fits(key, c + 1 - limit[i], window[i])
    if has_provisional(i, window[i]) then
      reset1[i] = -2
    end
  end
  if hits[i] > limit[i] then
    over[i] = true
    reset[i] = window[i]
  elseif c + ask > limit[i] then
    over[i] = true
    reset[i] = until_fits(key, c + ask - limit[i], window[i])
  else
    over[i] = false
    pending[key] = (pending[key] or 0) + hits[i]
  end
  if over[i] and not shadow[i] then
    allowed = 0
  end
end

local out = { allowed }
local added = {}
for i = 1, n do
  local key = KEYS[i]
  if allowed == 1 and not over[i] and hits[i] > 0 then
    -- Hits are numbered per key across the request, so a counter named twice gets distinct members.
    local first = (added[key] or 0) + 1
    local final = first + hits[i] - 1
    added[key] = final
    -- ZADD in chunks: Lua's unpack has a stack limit of a few thousand values.
    local h = first
    while h <= final do
      local args = {}
      local last = math.min(h + 255, final)
      for j = h, last do
        args[#args + 1] = now
        if j == 1 then
          args[#args + 1] = rid
        else
          args[#args + 1] = rid .. ':' .. j
        end
      end
      redis.call('ZADD', key, unpack(args))
      if part and tracked then
        redis.call('ZADD', KEYS[n + i], unpack(args))
      end
      h = last + 1
    end
    redis.call('PEXPIRE', key, math.ceil(window[i] / 1000))
    if part and tracked then
      redis.call('PEXPIRE', KEYS[n + i], math.ceil(window[i] / 1000))
    end
    count[i] = count[i] + hits[i]
  end
  -- Full after this request (the deny cache may remember it): unless provisional hits fill it.
  if not over[i] and count[i] >= limit[i] and has_provisional(i, window[i]) then
    reset1[i] = -2
  end
  if not over[i] then
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if oldest[2] then
      reset[i] = math.max(tonumber(oldest[2]) + window[i] - now, 0)
    else
      reset[i] = 0
    end
  end
  local o = 0
  if over[i] then
    o = 1
  end
  out[#out + 1] = o
  out[#out + 1] = count[i]
  out[#out + 1] = reset[i]
  out[#out + 1] = reset1[i]
end
return out
