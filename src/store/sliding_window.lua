-- slidegate sliding-window decision: the requests of one call in order, each all or nothing.
--
-- Each counter is a sorted set: score = time of a hit in microseconds (Redis's own clock, so every
-- replica shares one timeline), member = a unique hit id. For each request, pass one trims what
-- left the window and decides every counter; pass two records the hits only if no enforced
-- counter is over its limit. A later request of the call sees the hits of the earlier ones, as if
-- they had come in separate calls. Redis runs a script atomically and (7.0) replicates its
-- effects, so reading TIME is safe.
--
-- ARGV[1]   the number of requests
-- ARGV[2]   '1' if each counter's provisional log follows its request's keys (cluster), else '0'
-- then per request:
--   id      the request id: member of its first hit on a key; hit n > 1 is id .. ':' .. n
--   part    '1' if this is one slot's part of a cross-slot request, else '0'
--   n       its number of counters
--   then per counter: limit, window (us), hits, shadow ('1' or '0')
-- KEYS, per request: its n counter keys (one hash slot in a cluster), then, in a cluster, their n
--   provisional logs: the hits of cross-slot requests, which the store takes back if another
--   slot denies the request
--
-- Returns one string of 64-bit little-endian integers (`struct.pack`): parsing one bulk string
-- costs the client a fraction of an array of small integers, and Redis no more. Per request:
--   allowed, then per counter: over, count, reset_after_us, reset1_us
--   over            1 if this counter cannot take the request's hits
--   count           hits in the window after the decision
--   reset_after_us  over: until the request's hits fit (the window if they never can);
--                   otherwise until the oldest hit leaves the window (0 if empty)
--   reset1_us       until one hit fits, -1 if one fits now (for the local deny cache); -2 if the
--                   counter is full but holds provisional hits, which may leave before their time.
--                   Counted from the hits the counter holds, never from the pending hits of this
--                   request's earlier counters on the same key: a denied request records none.
--
-- A denied request reports, for every counter, the hits it holds (what the request left behind);
-- an allowed one the hits held plus those this request recorded up to that counter. A check
-- (hits 0) is over only if the window holds more than the limit: 0 hits fit a full counter.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tracked = ARGV[2] == '1'
local out = {}

-- Time at which the k-th oldest hit of `key` leaves the window, or nil if it holds fewer.
local function dropped_at(key, k, window)
  local entry = redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')
  if entry[2] then
    return tonumber(entry[2]) + window
  end
  return nil
end

-- Whether the provisional log `log` holds hits in the window (only tracked in a cluster).
local function has_provisional(log, window)
  if not log then
    return false
  end
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

-- Decides one request whose keys start at KEYS[k0] and counters at ARGV[a0]; appends its answer.
local function decide(rid, part, n, k0, a0)
  local key, log = {}, {}
  local limit, window, hits, shadow = {}, {}, {}, {}
  local over, count, reset, reset1 = {}, {}, {}, {}
  local held = {}
  local pending = {}
  local allowed = 1

  for i = 1, n do
    key[i] = KEYS[k0 + i - 1]
    if tracked then
      log[i] = KEYS[k0 + n + i - 1]
    end
    local base = a0 + (i - 1) * 4
    limit[i] = tonumber(ARGV[base])
    window[i] = tonumber(ARGV[base + 1])
    hits[i] = tonumber(ARGV[base + 2])
    shadow[i] = ARGV[base + 3] == '1'

    redis.call('ZREMRANGEBYSCORE', key[i], '-inf', now - window[i])
    held[i] = redis.call('ZCARD', key[i])
    local c = held[i] + (pending[key[i]] or 0)
    count[i] = c
    reset1[i] = -1
    if held[i] + 1 > limit[i] then
      reset1[i] = until_fits(key[i], held[i] + 1 - limit[i], window[i])
      if has_provisional(log[i], window[i]) then
        reset1[i] = -2
      end
    end
    if hits[i] > limit[i] then
      over[i] = true
      reset[i] = window[i]
    elseif c + hits[i] > limit[i] then
      over[i] = true
      reset[i] = until_fits(key[i], c + hits[i] - limit[i], window[i])
    else
      over[i] = false
      pending[key[i]] = (pending[key[i]] or 0) + hits[i]
    end
    if over[i] and not shadow[i] then
      allowed = 0
    end
  end

  out[#out + 1] = allowed
  local added = {}
  for i = 1, n do
    if allowed == 0 then
      count[i] = held[i]
    end
    if allowed == 1 and not over[i] and hits[i] > 0 then
      -- Hits are numbered per key across the request, so a counter named twice gets distinct
      -- members.
      local first = (added[key[i]] or 0) + 1
      local final = first + hits[i] - 1
      added[key[i]] = final
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
        redis.call('ZADD', key[i], unpack(args))
        if part and log[i] then
          redis.call('ZADD', log[i], unpack(args))
        end
        h = last + 1
      end
      redis.call('PEXPIRE', key[i], math.ceil(window[i] / 1000))
      if part and log[i] then
        redis.call('PEXPIRE', log[i], math.ceil(window[i] / 1000))
      end
      count[i] = count[i] + hits[i]
    end
    -- Full after this request (the deny cache may remember it): unless provisional hits fill it.
    if not over[i] and count[i] >= limit[i] and has_provisional(log[i], window[i]) then
      reset1[i] = -2
    end
    if not over[i] then
      local oldest = redis.call('ZRANGE', key[i], 0, 0, 'WITHSCORES')
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
end

local a = 3
local k = 1
for _ = 1, tonumber(ARGV[1]) do
  local n = tonumber(ARGV[a + 2])
  decide(ARGV[a], ARGV[a + 1] == '1', n, k, a + 3)
  a = a + 3 + 4 * n
  if tracked then
    k = k + 2 * n
  else
    k = k + n
  end
end
-- Packed in slices: `unpack` passes its values on Lua's stack, which holds about 8000.
local packed = {}
for i = 1, #out, 1000 do
  local j = math.min(i + 999, #out)
  packed[#packed + 1] = struct.pack('<' .. string.rep('i8', j - i + 1), unpack(out, i, j))
end
return table.concat(packed)
