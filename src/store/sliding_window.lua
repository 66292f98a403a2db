#!lua
-- The flags line above (no flags: Redis 7.0 or later) makes Redis check `maxmemory` before the
-- script runs: at the limit with `noeviction` it refuses the whole call with an OOM error. A
-- script without it would be refused only at its first write, and once a script has written
-- (the trim below always does), Redis lets the rest of it write past the limit. Redis 6.x cannot
-- read the line: it gets this script with a first line of its own instead (`HEADERLESS` in
-- `redis/script.rs`), which makes the same check with a write that changes nothing. Every
-- command here must exist in Redis 6.0.
-- slidegate sliding-window decision: the requests of one call in order, each all or nothing.
--
-- Each counter is a sorted set: score = time of a hit in microseconds (Redis's own clock, so every
-- replica shares one timeline), member = a unique hit id. A bucket counter (width > 0) is a hash
-- instead: field = bucket index (time / width), value = the hits admitted in that bucket; every
-- bucket that overlaps the window counts, the oldest one whole. For each request, pass one trims what
-- left the window and decides every counter; pass two records the hits only if no enforced
-- counter is over its limit. A later request of the call sees the hits of the earlier ones, as if
-- they had come in separate calls. Redis runs a script atomically and (7.0) replicates its
-- effects, so reading TIME is safe.
--
-- ARGV[1]   the number of requests
-- ARGV[2]   '1' if each counter's provisional log follows its request's keys (cluster), else '0'
-- ARGV[3]   the call's deadline in this server's clock (microseconds of TIME), '0' for none: a
--           call that starts later decides nothing and writes nothing (its caller has given up)
-- then per request:
--   id      the request id: member of its first hit on a key; hit n > 1 is id .. ':' .. n
--   part    '1' if this is one slot's part of a cross-slot request, else '0'
--   n       its number of counters
--   then per counter: limit, window (us), hits, shadow ('1' or '0'), bucket width (us; 0: the log)
-- KEYS, per request: its n counter keys (one hash slot in a cluster), then, in a cluster, their n
--   provisional logs: the hits of cross-slot requests, which the store takes back if another
--   slot denies the request (for a bucket counter a hash: bucket index -> provisional hits)
--
-- Returns one string of 64-bit little-endian integers (`struct.pack`): parsing one bulk string
-- costs the client a fraction of an array of small integers, and Redis no more. First the header:
--   now             TIME in microseconds (the client estimates this server's clock from it)
--   expired         1 if the deadline had passed: then the reply ends here and nothing was written
-- then per request:
--   allowed, then per counter: over, count, reset_after_us, reset1_us, bucket
--   over            1 if this counter cannot take the request's hits
--   count           hits in the window after the decision
--   reset_after_us  over: until the request's hits fit (the window if they never can);
--                   otherwise until the oldest hit leaves the window (0 if empty)
--   reset1_us       until one hit fits, -1 if one fits now (for the local deny cache); -2 if the
--                   counter is full but holds provisional hits, which may leave before their time.
--                   Counted from the hits the counter holds, never from the pending hits of this
--                   request's earlier counters on the same key: a denied request records none.
--   bucket          the bucket a bucket counter's hits went to (for taking them back), else -1
--
-- A denied request reports, for every counter, the hits it holds (what the request left behind);
-- an allowed one the hits held plus those this request recorded up to that counter. A check
-- (hits 0) is over only if the window holds more than the limit: 0 hits fit a full counter. All
-- of this holds alike for logs and bucket counters.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local deadline = tonumber(ARGV[3])
if deadline > 0 and now > deadline then
  return struct.pack('<i8i8', now, 1)
end
local tracked = ARGV[2] == '1'
-- The reply's header, then each request's answer.
local out = { now, 0 }

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

-- Bucket counters. `span` buckets of `width` make the window; at `now` the buckets
-- `floor(now / width) - span ..= floor(now / width)` count (the oldest overlaps the window). Besides
-- the buckets, the hash keeps 't', the hits of the buckets it holds, and 'o', the index of its
-- oldest bucket (at or before it after a compensation): a decision reads those two fields, and
-- the buckets themselves only as they leave the window or when it needs the oldest ones' hits.
-- Every bucket is within `span` of 'o' (trimming runs before each record), so a range of buckets
-- is at most `span + 1` fields.

local function bucket_field(index)
  return string.format('%d', index)
end

-- The instant at which bucket `index` stops overlapping the window.
local function bucket_leaves(index, width, span)
  return (index + span + 1) * width
end

-- The fields of buckets `from ..= to`.
local function bucket_fields(from, to)
  local fields = {}
  for index = from, to do
    fields[#fields + 1] = bucket_field(index)
  end
  return fields
end

-- Deletes the buckets of `key` that left the window; returns the hits of the others and the index
-- of the oldest of them (nil when none is left).
local function buckets_trim(key, width, span)
  local meta = redis.call('HMGET', key, 't', 'o')
  local total, oldest = tonumber(meta[1]) or 0, tonumber(meta[2])
  local current = math.floor(now / width)
  local first = current - span
  if total <= 0 or oldest == nil then
    return 0, nil
  end
  if oldest >= first then
    return total, oldest
  end
  if oldest + span < first then
    -- Every bucket is within `span` of the oldest: all of them left.
    redis.call('DEL', key)
    return 0, nil
  end
  local stale = bucket_fields(oldest, first - 1)
  local hits = redis.call('HMGET', key, unpack(stale))
  for j = 1, #stale do
    total = total - (tonumber(hits[j]) or 0)
  end
  redis.call('HDEL', key, unpack(stale))
  if total <= 0 then
    redis.call('DEL', key)
    return 0, nil
  end
  local rest = bucket_fields(first, current)
  hits = redis.call('HMGET', key, unpack(rest))
  oldest = current
  for j = 1, #rest do
    if tonumber(hits[j]) then
      oldest = first + j - 1
      break
    end
  end
  redis.call('HSET', key, 't', total, 'o', bucket_field(oldest))
  return total, oldest
end

-- Time until the oldest `excess` hits of `key` (buckets from `oldest` on) have left the window;
-- the window if they never do. The oldest bucket alone usually covers it (one hit over the limit).
local function buckets_until_fits(key, oldest, excess, width, span, window)
  if oldest == nil then
    return window
  end
  local first = tonumber(redis.call('HGET', key, bucket_field(oldest)))
  if first and first >= excess then
    return math.max(bucket_leaves(oldest, width, span) - now, 0)
  end
  local fields = bucket_fields(oldest, math.floor(now / width))
  local hits = redis.call('HMGET', key, unpack(fields))
  local seen = 0
  for j = 1, #fields do
    seen = seen + (tonumber(hits[j]) or 0)
    if seen >= excess then
      return math.max(bucket_leaves(oldest + j - 1, width, span) - now, 0)
    end
  end
  return window
end

-- Whether the provisional hash `log` (bucket index -> provisional hits, at most `span + 1` buckets
-- once trimmed) holds hits in a bucket that still counts (cluster only).
local function buckets_provisional(log, width, span)
  if not log then
    return false
  end
  local current = math.floor(now / width)
  local fields = redis.call('HGETALL', log)
  local held = false
  for f = 1, #fields, 2 do
    if tonumber(fields[f]) + span < current then
      redis.call('HDEL', log, fields[f])
    elseif tonumber(fields[f + 1]) > 0 then
      held = true
    end
  end
  return held
end

-- Pass one for a bucket counter: the hits it holds, the count with this request's earlier
-- counters on the key, decide, and the waits (see the reply's fields); also returns the oldest
-- bucket's index for pass two.
local function decide_buckets(key, log, limit, window, width, hits, pending)
  local span = window / width
  local held, oldest = buckets_trim(key, width, span)
  local c = held + pending
  local over, reset, reset1 = false, 0, -1
  if held + 1 > limit then
    reset1 = buckets_until_fits(key, oldest, held + 1 - limit, width, span, window)
    if buckets_provisional(log, width, span) then
      reset1 = -2
    end
  end
  if hits > limit then
    over, reset = true, window
  elseif c + hits > limit then
    over = true
    reset = buckets_until_fits(key, oldest, c + hits - limit, width, span, window)
  end
  return held, c, over, reset, reset1, oldest
end

-- Pass two for an admitted bucket counter: adds its hits to the current bucket and the total (and,
-- for a cross-slot part, to that bucket of the provisional hash) and keeps the keys until the
-- current bucket leaves the window. Returns the bucket's index.
local function record_buckets(key, log, window, width, hits, part)
  local span = window / width
  local current = math.floor(now / width)
  local field = bucket_field(current)
  redis.call('HINCRBY', key, field, hits)
  if redis.call('HINCRBY', key, 't', hits) == hits then
    redis.call('HSET', key, 'o', field)
  end
  local ttl = math.ceil((bucket_leaves(current, width, span) - now) / 1000)
  redis.call('PEXPIRE', key, ttl)
  if part and log then
    redis.call('HINCRBY', log, field, hits)
    redis.call('PEXPIRE', log, ttl)
  end
  return current
end

-- Decides one request whose keys start at KEYS[k0] and counters at ARGV[a0]; appends its answer.
local function decide(rid, part, n, k0, a0)
  local key, log = {}, {}
  local limit, window, hits, shadow, width, buckets = {}, {}, {}, {}, {}, {}
  local over, count, reset, reset1 = {}, {}, {}, {}
  local held = {}
  local pending = {}
  local allowed = 1

  for i = 1, n do
    key[i] = KEYS[k0 + i - 1]
    if tracked then
      log[i] = KEYS[k0 + n + i - 1]
    end
    local base = a0 + (i - 1) * 5
    limit[i] = tonumber(ARGV[base])
    window[i] = tonumber(ARGV[base + 1])
    hits[i] = tonumber(ARGV[base + 2])
    shadow[i] = ARGV[base + 3] == '1'
    width[i] = tonumber(ARGV[base + 4])

    if width[i] > 0 then
      held[i], count[i], over[i], reset[i], reset1[i], buckets[i] = decide_buckets(key[i], log[i],
        limit[i], window[i], width[i], hits[i], pending[key[i]] or 0)
      if not over[i] then
        pending[key[i]] = (pending[key[i]] or 0) + hits[i]
      end
    else
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
    end
    if over[i] and not shadow[i] then
      allowed = 0
    end
  end

  out[#out + 1] = allowed
  local added = {}
  for i = 1, n do
    local bucket = -1
    if allowed == 0 then
      count[i] = held[i]
    end
    if allowed == 1 and not over[i] and hits[i] > 0 and width[i] > 0 then
      bucket = record_buckets(key[i], log[i], window[i], width[i], hits[i], part)
      count[i] = count[i] + hits[i]
    elseif allowed == 1 and not over[i] and hits[i] > 0 then
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
    if width[i] > 0 then
      local span = window[i] / width[i]
      if not over[i] and count[i] >= limit[i] and buckets_provisional(log[i], width[i], span) then
        reset1[i] = -2
      end
      if not over[i] then
        -- Until the oldest hit's bucket leaves: the oldest bucket before this request, or the
        -- current one if this request (or an earlier one of the call) holds the first hits.
        reset[i] = 0
        if count[i] > 0 then
          local oldest = buckets[i] or math.floor(now / width[i])
          reset[i] = buckets_until_fits(key[i], oldest, 1, width[i], span, window[i])
        end
      end
    elseif not over[i] and count[i] >= limit[i] and has_provisional(log[i], window[i]) then
      reset1[i] = -2
    end
    if not over[i] and width[i] == 0 then
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
    out[#out + 1] = bucket
  end
end

local a = 4
local k = 1
for _ = 1, tonumber(ARGV[1]) do
  local n = tonumber(ARGV[a + 2])
  decide(ARGV[a], ARGV[a + 1] == '1', n, k, a + 3)
  a = a + 3 + 5 * n
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
