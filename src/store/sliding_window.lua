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
-- Each counter has its own "now": TIME, or the counter's newest hit (its newest bucket's start)
-- if that is later. A counter written under a clock ahead of this one (an NTP step back, a
-- failover to a node whose clock is behind) is so trimmed as of its newest hit, which no later
-- than the moment it really happened, and records after it: the counter never goes back in
-- time, never errors, and frees nothing early. Waits are reported in this server's clock. Outside
-- a cluster the node keeps one clock for all its counters instead (see `clock` below).
--
-- ARGV[1]   the number of requests
-- ARGV[2]   '1' if each counter's provisional log follows its request's keys (cluster); '2' if
--           the last key is the node's clock (standalone, Sentinel: see below); else '0'
-- ARGV[3]   the call's deadline in this server's clock (microseconds of TIME), '0' for none: a
--           call that starts later decides nothing and writes nothing (its caller has given up)
-- then per request:
--   id      the request id: member of its first hit on a key; hit n > 1 is id .. ':' .. n
--   part    '1' if this is one slot's part of a cross-slot request, else '0'
--   n       its number of counters
--   then per counter: limit, window (us), hits, flags, bucket width (us; 0: the log)
--   flags   the sum of 1 (shadow), 2 (charged: recorded whatever the decision, over the limit too)
--           and 4 (returned: up to `hits` of the newest hits taken back; never over limit)
-- KEYS, per request: its n counter keys (one hash slot in a cluster), then, in a cluster, their n
--   provisional logs: the hits of cross-slot requests, which the store takes back if another
--   slot denies the request (for a bucket counter a hash: bucket index -> provisional hits);
--   with ARGV[2] '2', last of all the node's clock
--
-- Returns one string of 64-bit little-endian integers (`struct.pack`): parsing one bulk string
-- costs the client a fraction of an array of small integers, and Redis no more. First the header:
--   now             TIME in microseconds (the client estimates this server's clock from it)
--   expired         1 if the deadline had passed: then the reply ends here and nothing was written
-- then per request:
--   allowed, then per counter: over, count, reset_after_us, reset1_us, bucket
--   allowed         1 or 0; 2 if the request failed (see the end): then every counter's are 0
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

-- Redis 7.0 turns a number passed to `redis.call` into text with printf's "%.17g", which costs
-- more than many a command it is an argument of; every count and time here is a whole number, so
-- it goes as text made with "%d" (or as a literal string).
local function int(x)
  return string.format('%d', x)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_text = int(now)
local after_now = '(' .. now_text
local deadline = tonumber(ARGV[3])
if deadline > 0 and now > deadline then
  return struct.pack('<i8i8', now, 1)
end
local tracked = ARGV[2] == '1'

-- The node's clock (one string key per prefix, outside a cluster): at least the "now" of every
-- counter a call has written hits to (recorded or carried). Nothing a call writes is later than
-- its counter's "now" (a hit's time, a bucket's start), so no counter holds a hit later than the
-- clock, and the node's "now", `node_now`, TIME or the clock if that is later, is every
-- counter's "now": no log looks for its newest hit, for a GET and a SET a call. The clock is
-- replicated with the counters, so after a failover to a node whose clock is behind (or a step
-- back) the counters go on from the clock, as if time had stopped there: for at most
-- `CLOCK_AHEAD_MOST`. A clock further ahead (a step back by more) is not used: each counter then
-- finds its own "now" as below, as it does where there is no clock (a cluster, whose calls are
-- per slot; the first call, an evicted key), and the clock stays until TIME has caught up with
-- it. A call that writes hits moves the clock to its latest "now" (`latest`); one that writes
-- none writes nothing. A key there that is not a number (not written here) is left as it is.
-- Bucket counters keep their newest bucket ('n') all the same, so that they lose nothing where
-- the clock is not used.
local CLOCK_AHEAD_MOST = 1000000
local clock = ARGV[2] == '2' and tonumber(ARGV[1]) > 0 and KEYS[#KEYS]
local clock_was = nil
if clock then
  local before = redis.pcall('GET', clock)
  clock_was = tonumber(before)
  if before ~= false and not clock_was then
    clock = false
  end
end
local known = clock_was ~= nil and clock_was <= now + CLOCK_AHEAD_MOST
local node_now = now
if known then
  node_now = math.max(now, clock_was)
end
local latest, recorded = node_now, false
-- The reply's header, then each request's answer.
local out = { now, 0 }

-- Carrying a counter across a change of representation (the rules changed its precision or
-- bucket width; its key is the same). The first decision that finds the key in another form
-- reads it once, deletes it and writes it in the asked one, conservatively: every hit is placed
-- at the latest instant it can have been admitted (a log's hit at its time, a bucket's at the
-- bucket's last microsecond, or the counter's "now" if that is earlier), so it leaves no earlier
-- than it really would have, and goes to the bucket of that instant. Never later than "now": a
-- hit placed ahead would move the counter's "now" on, and free other hits early. Every hit is carried (a later reload may raise the limit again), so
-- writing a log costs one member per hit held: buckets holding more than `LOG_CARRY_MAX` hits go
-- on as they are (the oldest bucket counted whole, which is stricter than the log) until they hold
-- fewer. Writing buckets costs at most a field per bucket of the window.

-- The most hits carried into a log at once: what one request may add to logs (`--max-hits`'s
-- default; `LOG_RECORD_MAX` in `store/form.rs`).
local LOG_CARRY_MAX = 4096

-- The most hits a bucket counter holds (`MAX_HELD` in `store/mod.rs`): past it the oldest make
-- room, so 't' never overflows `HINCRBY` nor leaves the exact integers of a double (a request
-- brings at most 2^50 hits per counter, `MAX_HITS`).
local MAX_HELD = 4503599627370496

-- The hits of `key` as it is stored, a log (`from` 0) or buckets of width `from` whose "now" is
-- `upto`: a list of {time, hits}, oldest first.
local function carry_read(key, from, upto)
  local events = {}
  if from == 0 then
    local entries = redis.call('ZRANGE', key, '0', '-1', 'WITHSCORES')
    for j = 2, #entries, 2 do
      local time = tonumber(entries[j])
      local last = events[#events]
      if last and last[1] == time then
        last[2] = last[2] + 1
      else
        events[#events + 1] = { time, 1 }
      end
    end
    return events
  end
  local fields = redis.call('HGETALL', key)
  for f = 1, #fields, 2 do
    local index = tonumber(fields[f])
    local hits = tonumber(fields[f + 1])
    if index and hits and hits > 0 then
      events[#events + 1] = { math.min((index + 1) * from - 1, upto), hits }
    end
  end
  table.sort(events, function(a, b)
    return a[1] < b[1]
  end)
  return events
end

-- Writes `events` ({time, hits}, oldest first) to `key` as a log (`width` 0) or buckets of
-- `width`, with the expiry the script gives such a counter; a counter's hash (`counter`, not a
-- provisional one) with its fields 't', 'o', 'n' and 'w'.
local function carry_write(key, events, window, width, counter)
  if #events == 0 then
    return
  end
  local newest = events[#events][1]
  local args, ttl = {}, 0
  local function flush(command)
    if #args > 0 then
      redis.call(command, key, unpack(args))
      args = {}
    end
  end
  if width == 0 then
    for _, event in ipairs(events) do
      for j = 1, event[2] do
        args[#args + 1] = int(event[1])
        args[#args + 1] = string.format('~%d:%d', event[1], j)
        if #args >= 512 then
          flush('ZADD')
        end
      end
    end
    flush('ZADD')
    ttl = newest + window - now
  else
    local counts, order = {}, {}
    for _, event in ipairs(events) do
      local index = math.floor(event[1] / width)
      if not counts[index] then
        order[#order + 1] = index
        counts[index] = 0
      end
      counts[index] = counts[index] + event[2]
    end
    local total = 0
    for _, index in ipairs(order) do
      total = total + counts[index]
      args[#args + 1] = int(index)
      args[#args + 1] = int(counts[index])
      if #args >= 512 then
        flush('HSET')
      end
    end
    local last = order[#order]
    if not counter then
      flush('HSET')
    end
    args[#args + 1] = 't'
    args[#args + 1] = int(total)
    args[#args + 1] = 'o'
    args[#args + 1] = int(order[1])
    args[#args + 1] = 'n'
    args[#args + 1] = int(last)
    args[#args + 1] = 'w'
    args[#args + 1] = int(width)
    if counter then
      flush('HSET')
    end
    args = {}
    ttl = (last + window / width + 1) * width - now
  end
  redis.call('PEXPIRE', key, int(math.max(math.ceil(ttl / 1000), 1)))
end

-- Rewrites the counter `key` (and its provisional log `log`, if any), stored as a log when
-- `is_log`, else as buckets of the width in its field 'w', as a log (`width` 0) or buckets of
-- `width`. A hash without 'w' holds nothing that can be placed in time, and goes.
local function carry(key, log, is_log, window, width)
  local from, upto = 0, now
  if not is_log then
    local meta = redis.call('HMGET', key, 'w', 'n')
    from = tonumber(meta[1]) or 0
    upto = math.max(node_now, (tonumber(meta[2]) or 0) * from)
  end
  local events = {}
  if is_log or from > 0 then
    events = carry_read(key, from, upto)
  end
  redis.call('DEL', key)
  carry_write(key, events, window, width, true)
  recorded = true
  if log and redis.call('EXISTS', log) == 1 then
    local provisional = {}
    if is_log or from > 0 then
      provisional = carry_read(log, from, upto)
    end
    redis.call('DEL', log)
    carry_write(log, provisional, window, width, false)
  end
end

-- Whether the provisional log `log` has another representation than its counter (its counter
-- expired before it was carried): then it no longer tells anything, and goes.
local function stray(log, reply)
  if type(reply) == 'table' and reply.err then
    redis.call('DEL', log)
    return true
  end
  return false
end

-- A cross-slot part writes its counters' provisional logs in pass two: one left in the other
-- form (its counter expired before it was carried) goes at the end of pass one (after any carry
-- of the counter, which carries its provisional log too), so that no write can fail.
local function provisional_form(log, width)
  if width == 0 then
    stray(log, redis.pcall('ZCARD', log))
  else
    stray(log, redis.pcall('HLEN', log))
  end
end

-- Time at which the k-th oldest hit of `key` leaves the window, or nil if it holds fewer.
local function dropped_at(key, k, window)
  local entry = redis.call('ZRANGE', key, int(k - 1), int(k - 1), 'WITHSCORES')
  if entry[2] then
    return tonumber(entry[2]) + window
  end
  return nil
end

-- Whether the provisional log `log` holds hits in the window as of `at` (only tracked in a
-- cluster).
local function has_provisional(log, window, at)
  if not log or stray(log, redis.pcall('ZREMRANGEBYSCORE', log, '-inf', int(at - window))) then
    return false
  end
  return redis.call('ZCARD', log) > 0
end

-- The form of a counter asked for as a log, and its "now": 0 and TIME, or its newest hit if a
-- clock ahead of this one recorded it. A counter kept as buckets until now is carried over into
-- the log first, unless it holds more than `LOG_CARRY_MAX` hits: then it is decided as those
-- buckets, and this returns their width (and no "now": the bucket path finds it).
local function log_form(key, log, window)
  -- The newest hit only if it is later than TIME (rare), so that a usual decision parses no score.
  local newest = redis.pcall('ZREVRANGEBYSCORE', key, '+inf', after_now, 'WITHSCORES', 'LIMIT', '0',
    '1')
  if newest.err then
    local meta = redis.call('HMGET', key, 't', 'w')
    local width = tonumber(meta[2]) or 0
    if width > 0 and (tonumber(meta[1]) or 0) > LOG_CARRY_MAX and window % width == 0 then
      return width, nil
    end
    carry(key, log, false, window, 0)
    newest = redis.call('ZREVRANGEBYSCORE', key, '+inf', after_now, 'WITHSCORES', 'LIMIT', '0', '1')
  end
  if newest[2] then
    return 0, math.max(now, tonumber(newest[2]))
  end
  return 0, now
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
-- the buckets, the hash keeps 't', the hits of the buckets it holds, 'o', the index of its
-- oldest bucket (at or before it after a compensation), and 'n', the index of its newest (the
-- counter's clock, see above): a decision reads those three fields, and the buckets themselves
-- only as they leave the window or when it needs the oldest ones' hits. Every bucket is within
-- `span` of 'o' (trimming runs before each record), so a range of buckets is at most `span + 1`
-- fields. `at` below is the counter's "now".

-- A bucket's field in the hash: its index as text.
local bucket_field = int

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
-- range; and a range with more indexes than the hash has buckets is read as the whole hash instead
-- (`HGETALL`, one field per bucket holding hits). A search thus reads at most about twice the
-- fewer of the range's indexes and the counter's buckets, `span + 1` at the most, and, as the
-- oldest bucket moves on, each index about once.
local CHUNK_FIRST, CHUNK_MOST = 4, 64

-- Calls `visit(index, hits)` for each bucket of `key` holding hits in `from ..= to`, oldest first,
-- until it returns true (then returns true).
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
  if is_log or (meta[4] and tonumber(meta[4]) ~= width) then
    carry(key, log, is_log, window, width)
    meta = redis.call('HMGET', key, 't', 'o', 'n', 'w')
  end
  return meta
end

-- Deletes the buckets of `key` that left the window; returns the hits of the others, the index
-- of the oldest of them (nil when none is left) and the counter's "now".
local function buckets_trim(key, width, span, meta)
  local total, oldest = tonumber(meta[1]) or 0, tonumber(meta[2])
  local at = buckets_now(oldest, tonumber(meta[3]), width)
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
-- the window if they never do. The oldest bucket alone usually covers it (one hit over the limit).
local function buckets_until_fits(key, oldest, excess, width, span, window, at)
  if oldest == nil then
    return window
  end
  local first = tonumber(redis.call('HGET', key, bucket_field(oldest)))
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

-- Whether the provisional hash `log` (bucket index -> provisional hits, at most `span + 1` buckets
-- once trimmed) holds hits in a bucket that still counts (cluster only).
local function buckets_provisional(log, width, span, at)
  if not log then
    return false
  end
  local current = math.floor(at / width)
  local fields = redis.pcall('HGETALL', log)
  if stray(log, fields) then
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
-- bucket's index, the counter's "now" and its field 'n' as read for pass two.
local function decide_buckets(key, log, limit, window, width, hits, pending)
  local span = window / width
  local meta = buckets_meta(key, log, window, width)
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

-- Pass two for an admitted bucket counter: adds its hits to the current bucket and the total (and,
-- for a cross-slot part, to that bucket of the provisional hash), the oldest making room past
-- `MAX_HELD` in all, and keeps the keys until the current bucket leaves the window. Returns the
-- bucket's index and the hits added. `at` is the counter's "now", so the current bucket is its
-- newest. `newest` is the field 'n' as pass one read it: it can only have become the current
-- bucket since (an earlier counter of the request on the key), so it is written at most once more.
local function record_buckets(key, log, window, width, hits, part, at, newest)
  local span = window / width
  local current = math.floor(at / width)
  local field = bucket_field(current)
  local total = redis.call('HINCRBY', key, 't', int(hits))
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
  redis.call('HINCRBY', key, field, int(hits))
  if first then
    redis.call('HSET', key, 'o', field, 'n', field, 'w', int(width))
  elseif newest ~= field then
    redis.call('HSET', key, 'n', field)
  end
  local ttl = math.ceil((bucket_leaves(current, width, span) - now) / 1000)
  ttl = int(ttl)
  redis.call('PEXPIRE', key, ttl)
  if part and log then
    redis.call('HINCRBY', log, field, int(hits))
    redis.call('PEXPIRE', log, ttl)
  end
  return current, hits
end

-- Returned hits: removes up to `hits` of the newest hits of `key` (trimmed already), never below
-- zero; returns how many it removed. A bucket counter loses them from its newest buckets (one read
-- of its at most `span + 1` buckets); 'o' and 'n' may then name an empty bucket, which is read as
-- "at or before the oldest" and "at or after the newest". In a cluster, hits taken from a bucket
-- that holds provisional hits (its provisional hash `log`) are taken as those first: the
-- provisional count goes down with them, and a denied cross-slot request's compensation, which
-- takes back no more than the provisional count it finds (`bucket_take_back.lua`), cannot take
-- them a second time from other requests' hits. (A log's compensation removes its own members, so
-- a returned provisional member only makes it remove less.)
local function take_back(key, log, width, hits)
  if width == 0 then
    local popped = redis.call('ZPOPMAX', key, int(hits))
    return #popped / 2
  end
  local total = tonumber(redis.call('HGET', key, 't')) or 0
  if total <= 0 then
    return 0
  end
  local provisional = {}
  if log then
    local fields = redis.pcall('HGETALL', log)
    if not stray(log, fields) then
      for f = 1, #fields, 2 do
        provisional[tonumber(fields[f])] = tonumber(fields[f + 1])
      end
    end
  end
  local fields = redis.call('HGETALL', key)
  local found = {}
  for f = 1, #fields, 2 do
    local index = tonumber(fields[f])
    if index then
      found[#found + 1] = { index, tonumber(fields[f + 1]) }
    end
  end
  table.sort(found, function(a, b)
    return a[1] > b[1]
  end)
  local taken = 0
  for _, bucket in ipairs(found) do
    if taken >= hits then
      break
    end
    local take = math.min(bucket[2], hits - taken)
    taken = taken + take
    if take == bucket[2] then
      redis.call('HDEL', key, bucket_field(bucket[1]))
    else
      redis.call('HINCRBY', key, bucket_field(bucket[1]), int(-take))
    end
    local marked = provisional[bucket[1]] or 0
    if marked > 0 then
      if take >= marked then
        redis.call('HDEL', log, bucket_field(bucket[1]))
      else
        redis.call('HINCRBY', log, bucket_field(bucket[1]), int(-take))
      end
    end
  end
  if taken >= total then
    redis.call('DEL', key)
  elseif taken > 0 then
    redis.call('HINCRBY', key, 't', int(-taken))
  end
  return taken
end

-- Pass one for a log counter `c`: trims what left the window, counts, decides (see the reply's
-- fields); `pending` is the hits this request's earlier counters on the key are to record.
local function decide_log(c, pending)
  if not c.trimmed then
    redis.call('ZREMRANGEBYSCORE', c.key, '-inf', int(c.at - c.window))
  end
  local held = redis.call('ZCARD', c.key)
  local count = held + pending
  c.held, c.count = held, count
  if held + 1 > c.limit then
    c.reset1 = until_fits(c.key, held + 1 - c.limit, c.window)
    if has_provisional(c.log, c.window, c.at) then
      c.reset1 = -2
    end
  end
  if c.returned then
    return
  end
  if c.hits > c.limit then
    c.over, c.reset = true, c.window
  elseif count + c.hits > c.limit then
    c.over, c.reset = true, until_fits(c.key, count + c.hits - c.limit, c.window)
  end
end

-- Pass two for a log counter: records `hits` at `at` (the counter's "now") in `key`, numbered
-- from `first` (per key across the request, so that a counter named twice gets distinct members),
-- also into the provisional log `log` if one is given.
local function record_log(key, log, at, window, hits, rid, first)
  local final = first + hits - 1
  local score = now_text
  if at ~= now then
    score = int(at)
  end
  -- ZADD in chunks: Lua's unpack has a stack limit of a few thousand values.
  local h = first
  while h <= final do
    local args = {}
    local last = math.min(h + 255, final)
    for j = h, last do
      args[#args + 1] = score
      if j == 1 then
        args[#args + 1] = rid
      else
        args[#args + 1] = rid .. ':' .. int(j)
      end
    end
    redis.call('ZADD', key, unpack(args))
    if log then
      redis.call('ZADD', log, unpack(args))
    end
    h = last + 1
  end
  -- Until the hits leave: a window after the counter's "now", in this server's clock.
  local ttl = int(math.ceil((at + window - now) / 1000))
  redis.call('PEXPIRE', key, ttl)
  if log then
    redis.call('PEXPIRE', log, ttl)
  end
end

-- An allowed log counter's wait: until its oldest hit leaves the window. With none `held`
-- before this request, the oldest is one it recorded, at the counter's "now" (no read needed).
local function log_reset(key, held, count, at, window)
  if count > 0 and held == 0 then
    return math.max(at + window - now, 0)
  elseif count > 0 then
    local oldest = redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')
    if oldest[2] then
      return math.max(tonumber(oldest[2]) + window - now, 0)
    end
  end
  return 0
end

-- Decides one request whose keys start at KEYS[k0] and counters at ARGV[a0]; appends its answer.
-- A counter is one table (a table per field costs Redis about a microsecond more a request).
local function decide(rid, part, n, k0, a0)
  local counters = {}
  -- Per key, for a request that names several counters (one may be named twice): the hits its
  -- earlier counters are to record, the bucket width (0: the log) it is decided in, and the
  -- members pass two numbered.
  local pending, form, added
  if n > 1 then
    pending, form, added = {}, {}, {}
  end
  local allowed = 1

  for i = 1, n do
    local base = a0 + (i - 1) * 5
    local flags = tonumber(ARGV[base + 3])
    local c = {
      key = KEYS[k0 + i - 1],
      log = nil,
      limit = tonumber(ARGV[base]),
      window = tonumber(ARGV[base + 1]),
      hits = tonumber(ARGV[base + 2]),
      shadow = flags % 2 == 1,
      charged = flags % 4 >= 2,
      returned = flags >= 4,
      width = tonumber(ARGV[base + 4]),
      -- The counter's "now" (see the top of the script).
      at = now,
      held = 0,
      count = 0,
      over = false,
      reset = 0,
      reset1 = -1,
      -- A bucket counter's oldest bucket and its field 'n', as pass one read them.
      oldest = nil,
      newest = nil,
      -- A log already trimmed as of the node's clock (it then skips its own trim).
      trimmed = false,
    }
    counters[i] = c
    if tracked then
      c.log = KEYS[k0 + n + i - 1]
    end
    -- A key named again in this request keeps the form its first naming found it in (buckets
    -- kept for a large total may fall under `LOG_CARRY_MAX` once trimmed): one form per key and
    -- request, so that pass two writes each key as the type pass one left it.
    if form and form[c.key] ~= nil then
      c.width = form[c.key]
    end
    -- With the node's clock known a log's trim, which fails on a hash, also tells its form.
    if c.width == 0 and known then
      c.at = node_now
      local trim = redis.pcall('ZREMRANGEBYSCORE', c.key, '-inf', int(node_now - c.window))
      c.trimmed = type(trim) ~= 'table'
    end
    if c.width == 0 and not c.trimmed then
      c.width, c.at = log_form(c.key, c.log, c.window)
      if known and c.at then
        c.at = node_now
      end
    end
    if form then
      form[c.key] = c.width
    end
    local earlier = pending and pending[c.key] or 0

    if c.width > 0 then
      c.held, c.count, c.over, c.reset, c.reset1, c.oldest, c.at, c.newest = decide_buckets(c.key,
        c.log, c.limit, c.window, c.width, c.hits, earlier)
      if c.returned then
        c.over, c.reset = false, 0
      end
    else
      decide_log(c, earlier)
    end
    if c.at > latest then
      latest = c.at
    end
    if pending and not c.returned and (not c.over or c.charged) then
      pending[c.key] = earlier + c.hits
    end
    if part and c.log then
      provisional_form(c.log, c.width)
    end
    if c.over and not c.shadow then
      allowed = 0
    end
  end

  out[#out + 1] = allowed
  for i = 1, n do
    local c = counters[i]
    local bucket = -1
    if allowed == 0 then
      c.count = c.held
    end
    local records = c.hits > 0 and not c.returned and (c.charged or (allowed == 1 and not c.over))
    -- Charged hits are never taken back, so they stay out of the provisional logs.
    local provisional = part and not c.charged
    recorded = recorded or records
    if c.returned and c.hits > 0 then
      c.count = c.count - take_back(c.key, c.log, c.width, c.hits)
    elseif records and c.width > 0 then
      local added_hits
      bucket, added_hits = record_buckets(c.key, c.log, c.window, c.width, c.hits, provisional, c.at,
        c.newest)
      c.count = math.min(c.count + added_hits, MAX_HELD)
    elseif records then
      local first = (added and added[c.key] or 0) + 1
      record_log(c.key, provisional and c.log, c.at, c.window, c.hits, rid, first)
      c.count = c.count + c.hits
      if added then
        added[c.key] = first + c.hits - 1
      end
    end
    -- Full after this request (the deny cache may remember it): unless provisional hits fill it.
    if c.width > 0 then
      local span = c.window / c.width
      if not c.over and c.count >= c.limit and buckets_provisional(c.log, c.width, span, c.at) then
        c.reset1 = -2
      end
      if not c.over then
        -- Until the oldest hit's bucket leaves: the oldest bucket before this request, or the
        -- current one if this request (or an earlier one of the call) holds the first hits.
        c.reset = 0
        if c.count > 0 then
          local oldest = c.oldest or math.floor(c.at / c.width)
          c.reset = buckets_until_fits(c.key, oldest, 1, c.width, span, c.window, c.at)
        end
      end
    elseif not c.over then
      if c.count >= c.limit and has_provisional(c.log, c.window, c.at) then
        c.reset1 = -2
      end
      c.reset = log_reset(c.key, c.held, c.count, c.at, c.window)
    end
    local o = 0
    if c.over then
      o = 1
    end
    out[#out + 1] = o
    out[#out + 1] = c.count
    out[#out + 1] = c.reset
    out[#out + 1] = c.reset1
    out[#out + 1] = bucket
  end
end

-- The most common request, decided without `decide`'s tables: one counter, an exact log, no flags
-- (admitted hits, not shadow), no provisional log, with the node's clock known. The same answer
-- and writes as `decide` (a fifth fewer instructions in Redis). Returns false, having written
-- nothing, if the key is not a log: `decide` then finds its form and carries it.
local function decide_log_alone(rid, key, base)
  local window = tonumber(ARGV[base + 1])
  if type(redis.pcall('ZREMRANGEBYSCORE', key, '-inf', int(node_now - window))) == 'table' then
    return false
  end
  local limit, hits = tonumber(ARGV[base]), tonumber(ARGV[base + 2])
  local held = redis.call('ZCARD', key)
  local reset1 = -1
  if held + 1 > limit then
    reset1 = until_fits(key, held + 1 - limit, window)
  end
  local reset
  if hits > limit then
    reset = window
  elseif held + hits > limit then
    reset = until_fits(key, held + hits - limit, window)
  end
  if reset then
    out[#out + 1] = 0
    out[#out + 1] = 1
    out[#out + 1] = held
    out[#out + 1] = reset
    out[#out + 1] = reset1
    out[#out + 1] = -1
    return true
  end
  if hits > 0 then
    record_log(key, nil, node_now, window, hits, rid, 1)
    recorded = true
  end
  out[#out + 1] = 1
  out[#out + 1] = 0
  out[#out + 1] = held + hits
  out[#out + 1] = log_reset(key, held, held + hits, node_now, window)
  out[#out + 1] = reset1
  out[#out + 1] = -1
  return true
end

-- The same for one bucket counter (the node's clock known or not: buckets find their "now" from
-- their own fields either way). `decide_buckets` carries a key in another form itself.
local function decide_buckets_alone(key, base)
  local limit, window = tonumber(ARGV[base]), tonumber(ARGV[base + 1])
  local hits, width = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 4])
  local held, count, over, reset, reset1, oldest, at, newest = decide_buckets(key, nil, limit,
    window, width, hits, 0)
  if at > latest then
    latest = at
  end
  local bucket = -1
  if over then
    count = held
  else
    if hits > 0 then
      local added
      bucket, added = record_buckets(key, nil, window, width, hits, false, at, newest)
      count = math.min(count + added, MAX_HELD)
      recorded = true
    end
    reset = 0
    if count > 0 then
      reset = buckets_until_fits(key, oldest or math.floor(at / width), 1, width, window / width,
        window, at)
    end
  end
  out[#out + 1] = over and 0 or 1
  out[#out + 1] = over and 1 or 0
  out[#out + 1] = count
  out[#out + 1] = reset
  out[#out + 1] = reset1
  out[#out + 1] = bucket
  return true
end

-- Each request is decided under `pcall`: an error (a key of a type no decision writes, left by
-- something else under the prefix) fails that request alone, answered `allowed` 2 and zeros, and
-- the others of the call are decided as usual. For a key of another type its writes include no
-- recorded hit: pass one reads every key of the request in a form that raises on a wrong type
-- before pass two writes, and decides each key in one form. (A key of the right type holding
-- foreign content, such as a bucket field that is not a number, can still fail in pass two.)
local a = 4
local k = 1
for _ = 1, tonumber(ARGV[1]) do
  local n = tonumber(ARGV[a + 2])
  local mark = #out
  -- `decide` unless `decide_log_alone` took the request (true) or failed in it (an error).
  local ok, err = true, false
  if n == 1 and not tracked and ARGV[a + 6] == '0' then
    if ARGV[a + 7] ~= '0' then
      ok, err = pcall(decide_buckets_alone, KEYS[k], a + 3)
    elseif known then
      ok, err = pcall(decide_log_alone, ARGV[a], KEYS[k], a + 3)
    end
  end
  if ok and not err then
    ok, err = pcall(decide, ARGV[a], ARGV[a + 1] == '1', n, k, a + 3)
  end
  if not ok then
    for j = #out, mark + 1, -1 do
      out[j] = nil
    end
    out[#out + 1] = 2
    for _ = 1, 5 * n do
      out[#out + 1] = 0
    end
    if type(err) == 'table' then
      err = err.err
    end
    redis.log(redis.LOG_WARNING, 'slidegate: a request failed: ' .. tostring(err))
  end
  a = a + 3 + 5 * n
  if tracked then
    k = k + 2 * n
  else
    k = k + n
  end
end
-- Under `pcall`: the hits are written, and a refused SET (an ACL) must not fail their requests.
if clock and recorded and (clock_was == nil or latest > clock_was) then
  local set = redis.pcall('SET', clock, int(latest))
  if type(set) == 'table' and set.err then
    redis.log(redis.LOG_WARNING, 'slidegate: the node\'s clock was not written: ' .. set.err)
  end
end
-- Packed in slices: `unpack` passes its values on Lua's stack, which holds about 8000.
local packed = {}
for i = 1, #out, 1000 do
  local j = math.min(i + 999, #out)
  packed[#packed + 1] = struct.pack('<' .. string.rep('i8', j - i + 1), unpack(out, i, j))
end
return table.concat(packed)
