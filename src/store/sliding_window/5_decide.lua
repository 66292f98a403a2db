-- The sliding-window script, continued: the files of this directory, in order, are one script.

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
    if not carry_functions().stray(log, fields) then
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

-- Decides one request whose keys start at KEYS[k0] and whose counters are those of `shape`;
-- appends its answer. A counter is one table (a table per field costs Redis about a microsecond
-- more a request).
local function decide(rid, shape, k0)
  local part, n = shape.part, shape.n
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
    local base = (i - 1) * 5
    local flags = shape[base + 4]
    local c = {
      key = KEYS[k0 + i - 1],
      log = nil,
      limit = shape[base + 1],
      window = shape[base + 2],
      hits = shape[base + 3],
      shadow = flags % 2 == 1,
      charged = flags % 4 >= 2,
      returned = flags >= 4,
      width = shape[base + 5],
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
    local named = form and form[c.key] ~= nil
    if named then
      c.width = form[c.key]
    end
    -- With the node's clock known a log's trim, which fails on a hash, also tells its form.
    if c.width == 0 and known then
      c.at = node_now
      local trim = redis.pcall('ZREMRANGEBYSCORE', c.key, '-inf', text(node_now - c.window))
      c.trimmed = type(trim) ~= 'table'
    end
    if c.width == 0 and not c.trimmed then
      c.width, c.at = log_functions().form(c.key, c.log, c.window)
      if known and c.at then
        c.at = node_now
      end
    end
    -- A charge that would take a log past what a log holds carries it into buckets first.
    if c.width == 0 and c.charged and not named then
      if not c.trimmed then
        redis.call('ZREMRANGEBYSCORE', c.key, '-inf', int(c.at - c.window))
        c.trimmed = true
      end
      local carrying = carry_functions()
      if redis.call('ZCARD', c.key) + c.hits > carrying.log_held_max(c.limit) then
        c.width = carrying.debt_width(c.window)
        carrying.carry(c.key, c.log, true, c.window, c.width)
      end
    end
    if form then
      form[c.key] = c.width
    end
    local earlier = pending and pending[c.key] or 0

    if c.width > 0 then
      c.held, c.count, c.over, c.reset, c.reset1, c.oldest, c.at, c.newest = bucket_functions()
        .decide(c.key, c.log, c.limit, c.window, c.width, c.hits, earlier)
      if c.returned then
        c.over, c.reset = false, 0
      end
    else
      log_functions().decide(c, earlier)
    end
    if c.at > latest then
      latest = c.at
    end
    if pending and not c.returned and (not c.over or c.charged) then
      pending[c.key] = earlier + c.hits
    end
    if part and c.log then
      carry_functions().provisional_form(c.log, c.width)
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
      bucket, added_hits = bucket_functions().record(c.key, c.log, c.window, c.width, c.hits,
        provisional, c.at, c.newest)
      c.count = math.min(c.count + added_hits, MAX_HELD)
    elseif records then
      local first = (added and added[c.key] or 0) + 1
      log_functions().record(c.key, provisional and c.log, c.at, c.window, c.hits, rid, first)
      c.count = c.count + c.hits
      if added then
        added[c.key] = first + c.hits - 1
      end
    end
    -- Full after this request (the deny cache may remember it): unless provisional hits fill it.
    if c.width > 0 then
      local span = c.window / c.width
      local buckets = bucket_functions()
      if not c.over and c.count >= c.limit and buckets.provisional(c.log, c.width, span, c.at) then
        c.reset1 = -2
      end
      if not c.over then
        -- Until the oldest hit's bucket leaves: the oldest bucket before this request, or the
        -- current one if this request (or an earlier one of the call) holds the first hits.
        c.reset = 0
        if c.count > 0 then
          local oldest = c.oldest or math.floor(c.at / c.width)
          c.reset = buckets.until_fits(c.key, oldest, 1, c.width, span, c.window, c.at)
        end
      end
    elseif not c.over then
      local logs = log_functions()
      if c.count >= c.limit and logs.has_provisional(c.log, c.window, c.at) then
        c.reset1 = -2
      end
      c.reset = logs.reset(c.key, c.held, c.count, c.at, c.window)
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
-- and writes as `decide` (a fifth fewer instructions in Redis). Appends the counter's answer and
-- returns true; or returns false, having written nothing, if the key is not a log: `decide` then
-- finds its form and carries it. One hit that fits (nearly every request) is recorded here, with
-- its shape's trim bound and expiry made once a call: a twelfth fewer instructions in Redis than
-- through the log's functions.
local function decide_log_alone(rid, key, shape)
  local window = shape[2]
  if type(redis.pcall('ZREMRANGEBYSCORE', key, '-inf', shape.since)) == 'table' then
    return false
  end
  local limit, hits = shape[1], shape[3]
  local held = redis.call('ZCARD', key)
  local n = #out
  if hits == 1 and held < limit then
    redis.call('ZADD', key, node_now_text, rid)
    redis.call('PEXPIRE', key, shape.expiry)
    recorded = true
    -- Until the oldest hit leaves: this one if the log held none.
    local reset = node_now + window - now
    if held > 0 then
      local oldest = redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')
      reset = math.max(oldest[2] + window - now, 0)
    end
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] = 1, 0, held + 1,
      reset, -1, -1
    return true
  end
  local logs = log_functions()
  local reset1 = -1
  if held + 1 > limit then
    reset1 = logs.until_fits(key, held + 1 - limit, window)
  end
  local over, count, reset = true, held, nil
  if hits > limit then
    reset = window
  elseif held + hits > limit then
    reset = logs.until_fits(key, held + hits - limit, window)
  else
    over, count = false, held + hits
    if hits > 0 then
      logs.record(key, nil, node_now, window, hits, rid, 1)
      recorded = true
    end
    reset = logs.reset(key, held, count, node_now, window)
  end
  out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] = over and 0 or 1,
    over and 1 or 0, count, reset, reset1, -1
  return true
end

-- The same for one bucket counter (the node's clock known or not: buckets find their "now" from
-- their own fields either way). It always decides: appends the answer and returns true
-- (`decide_buckets` carries a key in another form itself).
--
-- One hit that fits a counter in its steady state (nearly every request) is decided and recorded
-- here from the counter's fields alone: a bucket counter of this width, holding hits, none of
-- them out of the window (no trim) nor later than the node's bucket (its "now" is the node's),
-- with the shape's texts made once a call. Anything else goes the general way.
local function decide_buckets_alone(key, shape)
  local limit, window, hits, width = shape[1], shape[2], shape[3], shape[5]
  local meta = redis.pcall('HMGET', key, 't', 'o', 'n', 'w')
  if meta.err ~= nil then
    meta = nil
  elseif meta[4] then
    local current = shape.current
    if not current then
      -- The shape's texts and times at the node's bucket, made on its first counter that has
      -- fields (a call of new keys needs none).
      current = math.floor(node_now / width)
      shape.current, shape.current_field, shape.width_text = current, text(current), text(width)
      shape.current_leaves = (current + window / width + 1) * width
      shape.bucket_expiry = text(math.ceil((shape.current_leaves - now) / 1000))
    end
    local held, oldest, newest = meta[1], meta[2], meta[3]
    if meta[4] ~= shape.width_text then
      -- To be carried to this width: the general way reads the key again.
      meta = nil
    elseif hits == 1 and held and oldest and newest then
      held, oldest = held + 0, oldest + 0
      local span = window / width
      if held > 0 and held < limit and held < MAX_HELD and oldest >= current - span
        and oldest <= current and (newest == shape.current_field or newest + 0 <= current) then
        local field = shape.current_field
        redis.call('HINCRBY', key, 't', '1')
        redis.call('HINCRBY', key, field, '1')
        if newest ~= field then
          redis.call('HSET', key, 'n', field)
        end
        redis.call('PEXPIRE', key, shape.bucket_expiry)
        recorded = true
        -- Until the oldest bucket leaves: it holds hits (this one, if it is the current bucket).
        local reset = math.max(shape.current_leaves - now, 0)
        if oldest < current then
          local first = reply_number(redis.call('HGET', key, meta[2]))
          if first and first >= 1 then
            reset = math.max((oldest + span + 1) * width - now, 0)
          else
            reset = bucket_functions().until_fits(key, oldest, 1, width, span, window, node_now)
          end
        end
        local n = #out
        out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] = 1, 0, held + 1,
          reset, -1, current
        return true
      end
    end
  end
  local buckets = bucket_functions()
  local held, count, over, reset, reset1, oldest, at, newest = buckets.decide(key, nil, limit,
    window, width, hits, 0, meta)
  if at > latest then
    latest = at
  end
  local bucket = -1
  if over then
    count = held
  else
    if hits > 0 then
      local added
      bucket, added = buckets.record(key, nil, window, width, hits, false, at, newest)
      count = math.min(count + added, MAX_HELD)
      recorded = true
    end
    reset = 0
    if count > 0 then
      reset = buckets.until_fits(key, oldest or math.floor(at / width), 1, width, window / width,
        window, at)
    end
  end
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] = over and 0 or 1,
    over and 1 or 0, count, reset, reset1, bucket
  return true
end

-- Each request is decided under `pcall`: an error (a key of a type no decision writes, left by
-- something else under the prefix) fails that request alone, answered `allowed` 2 and zeros, and
-- the others of the call are decided as usual. For a key of another type its writes include no
-- recorded hit: pass one reads every key of the request in a form that raises on a wrong type
-- before pass two writes, and decides each key in one form. (A key of the right type holding
-- foreign content, such as a bucket field that is not a number, can still fail in pass two.)
-- The call's shapes (see the top), by the text requests name them with: each number read once
-- a call (`+ 0`, which raises on anything else: the script's own client writes them all). A
-- shape of one counter is made whole by its constructor (a table grown field by field is resized
-- three times), and the first shape's name is a literal (formatting a number costs a printf).
local shapes = {}
local a = 5
for s = 1, ARGV[4] + 0 do
  local n = ARGV[a + 1] + 0
  local shape
  if n == 1 then
    local window, width = ARGV[a + 3] + 0, ARGV[a + 6] + 0
    -- A log's trim bound and expiry, the same for every request of the shape (`decide_log_alone`).
    local since, expiry
    if known and width == 0 then
      since, expiry = text(node_now - window), text(math.ceil((node_now + window - now) / 1000))
    end
    shape = { ARGV[a + 2] + 0, window, ARGV[a + 4] + 0, ARGV[a + 5] + 0, width,
      part = ARGV[a] == '1', n = 1, since = since, expiry = expiry }
  else
    shape = { part = ARGV[a] == '1', n = n }
    for j = 1, 5 * n do
      shape[j] = ARGV[a + 1 + j] + 0
    end
  end
  shapes[s == 1 and '1' or int(s)] = shape
  a = a + 2 + 5 * n
end

local k = 1
for _ = 1, tonumber(ARGV[1]) do
  local rid = ARGV[a]
  local shape = shapes[ARGV[a + 1]] or error('slidegate: a request names no shape of the call')
  local n = shape.n
  local mark = #out
  -- `decide` unless a one-counter path answered the request (true) or failed in it (an error);
  -- the log's hands a key in another form over (false).
  local ok, err = true, false
  if n == 1 and not tracked and shape[4] == 0 then
    if shape[5] ~= 0 then
      ok, err = pcall(decide_buckets_alone, KEYS[k], shape)
    elseif known then
      ok, err = pcall(decide_log_alone, rid, KEYS[k], shape)
    end
  end
  if ok and not err then
    ok, err = pcall(decide, rid, shape, k)
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
  a = a + 2
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
