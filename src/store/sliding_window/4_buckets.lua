-- The sliding-window script, continued: the files of this directory, in order, are one script.

-- Bucket counters. `span` buckets of `width` make the window; at `now` the buckets
-- `floor(now / width) - span ..= floor(now / width)` count (the oldest overlaps the window). Besides
-- the buckets, the hash keeps 't', the hits of the buckets it holds, 'o', the index of its
-- oldest bucket (at or before it after a compensation), and 'n', the index of its newest (the
-- counter's clock, see above): a decision reads those three fields, and the buckets themselves
-- only as they leave the window or when it needs the oldest ones' hits. Every bucket is within
-- `span` of 'o' (trimming runs before each record), so a range of buckets is at most `span + 1`
-- fields. `at` below is the counter's "now".

-- A bucket's field in the hash: its index as text.
local bucket_field = text

-- The bucket functions, made on a call's first bucket counter (`bucket_functions`): Redis makes
-- a script's closures anew for every call (each with its upvalues), and a call of exact logs
-- alone needs none of these.
local bucket_functions_made = nil
local function bucket_functions()
  if bucket_functions_made then
    return bucket_functions_made
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

  -- A range of buckets is read in chunks that start at 4 fields and double up to 64, so that a
  -- search for the next bucket holding hits reads about as many fields as it passes, not the whole
  -- range; and a range with more indexes than the hash has buckets is read as the whole hash
  -- instead (`HGETALL`, one field per bucket holding hits). A search thus reads at most about twice
  -- the fewer of the range's indexes and the counter's buckets, `span + 1` at the most, and, as the
  -- oldest bucket moves on, each index about once.
  local CHUNK_FIRST, CHUNK_MOST = 4, 64

  -- Calls `visit(index, hits)` for each bucket of `key` holding hits in `from ..= to`, oldest
  -- first, until it returns true (then returns true).
  local function buckets_scan(key, from, to, visit)
    if to < from then
      return false
    end
    if to - from + 1 > 2 * CHUNK_MOST and to - from + 1 > 2 * redis.call('HLEN', key) then
      local fields = redis.call('HGETALL', key)
      local found = {}
      for f = 1, #fields, 2 do
        local index = tonumber(fields[f])
        if index and index >= from and index <= to then
          found[#found + 1] = { index, tonumber(fields[f + 1]) }
        end
      end
      table.sort(found, function(a, b)
        return a[1] < b[1]
      end)
      for _, bucket in ipairs(found) do
        if visit(bucket[1], bucket[2]) then
          return true
        end
      end
      return false
    end
    local start, size = from, CHUNK_FIRST
    while start <= to do
      local last = math.min(start + size - 1, to)
      local hits = redis.call('HMGET', key, unpack(bucket_fields(start, last)))
      for j = 1, #hits do
        local h = tonumber(hits[j])
        if h and visit(start + j - 1, h) then
          return true
        end
      end
      start, size = last + 1, math.min(2 * size, CHUNK_MOST)
    end
    return false
  end

  -- The counter's "now" from its oldest and newest bucket indexes (either may be nil): TIME, or
  -- the newest bucket's start if that is later. Never before the oldest bucket either, so that the
  -- buckets of the window (`oldest ..= current`) are never an empty range.
  local function buckets_now(oldest, newest, width)
    local at = node_now
    if newest then
      at = math.max(at, newest * width)
    end
    if oldest then
      at = math.max(at, oldest * width)
    end
    return at
  end

  -- The fields 't', 'o' and 'n' of the bucket counter `key` (see above), after carrying it over
  -- into buckets of `width` if it was a log or buckets of another width ('w').
  local function buckets_meta(key, log, window, width)
    local meta = redis.pcall('HMGET', key, 't', 'o', 'n', 'w')
    local is_log = meta.err ~= nil
    if is_log or (meta[4] and reply_number(meta[4]) ~= width) then
      carry_functions().carry(key, log, is_log, window, width)
      meta = redis.call('HMGET', key, 't', 'o', 'n', 'w')
    end
    return meta
  end

  -- Deletes the buckets of `key` that left the window; returns the hits of the others, the index
  -- of the oldest of them (nil when none is left) and the counter's "now".
  local function buckets_trim(key, width, span, meta)
    local total, oldest = reply_number(meta[1]) or 0, reply_number(meta[2])
    local at = buckets_now(oldest, reply_number(meta[3]), width)
    local current = math.floor(at / width)
    local first = current - span
    if total <= 0 or oldest == nil then
      return 0, nil, node_now
    end
    if oldest >= first then
      return total, oldest, at
    end
    if oldest + span < first then
      -- Every bucket is within `span` of the oldest: all of them left.
      redis.call('DEL', key)
      return 0, nil, node_now
    end
    local stale = {}
    buckets_scan(key, oldest, first - 1, function(index, hits)
      total = total - hits
      stale[#stale + 1] = bucket_field(index)
      if #stale >= 256 then
        redis.call('HDEL', key, unpack(stale))
        stale = {}
      end
    end)
    if #stale > 0 then
      redis.call('HDEL', key, unpack(stale))
    end
    if total <= 0 then
      redis.call('DEL', key)
      return 0, nil, node_now
    end
    oldest = current
    buckets_scan(key, first, current, function(index)
      oldest = index
      return true
    end)
    redis.call('HSET', key, 't', int(total), 'o', bucket_field(oldest))
    return total, oldest, at
  end

  -- Time until the oldest `excess` hits of `key` (buckets from `oldest` on) have left the window;
  -- the window if they never do. The oldest bucket alone usually covers it (one hit over the
  -- limit).
  local function buckets_until_fits(key, oldest, excess, width, span, window, at)
    if oldest == nil then
      return window
    end
    local first = reply_number(redis.call('HGET', key, bucket_field(oldest)))
    if first and first >= excess then
      return math.max(bucket_leaves(oldest, width, span) - now, 0)
    end
    local seen, fits = 0, window
    buckets_scan(key, oldest, math.floor(at / width), function(index, hits)
      seen = seen + hits
      if seen >= excess then
        fits = math.max(bucket_leaves(index, width, span) - now, 0)
        return true
      end
    end)
    return fits
  end

  -- Whether the provisional hash `log` (bucket index -> provisional hits, at most `span + 1`
  -- buckets once trimmed) holds hits in a bucket that still counts (cluster only).
  local function buckets_provisional(log, width, span, at)
    if not log then
      return false
    end
    local current = math.floor(at / width)
    local fields = redis.pcall('HGETALL', log)
    if carry_functions().stray(log, fields) then
      return false
    end
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
  -- bucket's index, the counter's "now" and its field 'n' as read for pass two. `meta`: its
  -- fields 't', 'o', 'n', 'w' if already read, of a bucket counter of this width or of no key.
  local function decide_buckets(key, log, limit, window, width, hits, pending, meta)
    local span = window / width
    meta = meta or buckets_meta(key, log, window, width)
    local held, oldest, at = buckets_trim(key, width, span, meta)
    local c = held + pending
    local over, reset, reset1 = false, 0, -1
    if held + 1 > limit then
      reset1 = buckets_until_fits(key, oldest, held + 1 - limit, width, span, window, at)
      if buckets_provisional(log, width, span, at) then
        reset1 = -2
      end
    end
    if hits > limit then
      over, reset = true, window
    elseif c + hits > limit then
      over = true
      reset = buckets_until_fits(key, oldest, c + hits - limit, width, span, window, at)
    end
    return held, c, over, reset, reset1, oldest, at, meta[3]
  end

  -- Pass two for an admitted bucket counter: adds its hits to the current bucket and the total
  -- (and, for a cross-slot part, to that bucket of the provisional hash), the oldest making room
  -- past `MAX_HELD` in all, and keeps the keys until the current bucket leaves the window. Returns
  -- the bucket's index and the hits added. `at` is the counter's "now", so the current bucket is
  -- its newest. `newest` is the field 'n' as pass one read it: it can only have become the current
  -- bucket since (an earlier counter of the request on the key), so it is written at most once
  -- more.
  local function record_buckets(key, log, window, width, hits, part, at, newest)
    local span = window / width
    local current = math.floor(at / width)
    local field = bucket_field(current)
    local total = redis.call('HINCRBY', key, 't', text(hits))
    local first = total == hits
    if total > MAX_HELD then
      -- The oldest hits make room: the counter stays over every limit while it holds `MAX_HELD`,
      -- and the newest hits keep it so for the longest.
      local excess = total - MAX_HELD
      local oldest = tonumber(redis.call('HGET', key, 'o')) or current
      buckets_scan(key, math.min(oldest, current), current, function(index, held)
        local take = math.min(held, excess)
        if take == held then
          redis.call('HDEL', key, bucket_field(index))
        else
          redis.call('HINCRBY', key, bucket_field(index), int(-take))
        end
        excess = excess - take
        return excess <= 0
      end)
      redis.call('HSET', key, 't', int(MAX_HELD))
    end
    redis.call('HINCRBY', key, field, text(hits))
    if first then
      redis.call('HSET', key, 'o', field, 'n', field, 'w', int(width))
    elseif newest ~= field then
      redis.call('HSET', key, 'n', field)
    end
    local ttl = text(math.ceil((bucket_leaves(current, width, span) - now) / 1000))
    redis.call('PEXPIRE', key, ttl)
    if part and log then
      redis.call('HINCRBY', log, field, text(hits))
      redis.call('PEXPIRE', log, ttl)
    end
    return current, hits
  end

  bucket_functions_made = {
    decide = decide_buckets,
    record = record_buckets,
    until_fits = buckets_until_fits,
    provisional = buckets_provisional,
  }
  return bucket_functions_made
end
