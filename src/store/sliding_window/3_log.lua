-- The sliding-window script, continued: the files of this directory, in order, are one script.

-- The log functions, made on a call's first exact counter (`log_functions`): Redis makes a
-- script's closures anew for every call, and a call of bucket counters alone needs none of these.
local log_functions_made = nil
local function log_functions()
  if log_functions_made then
    return log_functions_made
  end

  -- Time at which the k-th oldest hit of `key` leaves the window, or nil if it holds fewer.
  local function dropped_at(key, k, window)
    local entry = redis.call('ZRANGE', key, int(k - 1), int(k - 1), 'WITHSCORES')
    if entry[2] then
      return entry[2] + window
    end
    return nil
  end

  -- Whether the provisional log `log` holds hits in the window as of `at` (only tracked in a
  -- cluster).
  local function has_provisional(log, window, at)
    if not log then
      return false
    end
    local trim = redis.pcall('ZREMRANGEBYSCORE', log, '-inf', int(at - window))
    if carry_functions().stray(log, trim) then
      return false
    end
    return redis.call('ZCARD', log) > 0
  end

  -- The form of a counter asked for as a log, and its "now": 0 and TIME, or its newest hit if a
  -- clock ahead of this one recorded it. A counter kept as buckets until now is carried over into
  -- the log first, unless it holds more than `LOG_CARRY_MAX` hits: then it is decided as those
  -- buckets, and this returns their width (and no "now": the bucket path finds it).
  local function log_form(key, log, window)
    -- The newest hit only if it is later than TIME (rare), so that a usual decision parses no
    -- score.
    local newest = redis.pcall('ZREVRANGEBYSCORE', key, '+inf', after_now, 'WITHSCORES', 'LIMIT',
      '0', '1')
    if newest.err then
      local meta = redis.call('HMGET', key, 't', 'w')
      local width = tonumber(meta[2]) or 0
      if width > 0 and (tonumber(meta[1]) or 0) > LOG_CARRY_MAX and window % width == 0 then
        return width, nil
      end
      carry_functions().carry(key, log, false, window, 0)
      newest = redis.call('ZREVRANGEBYSCORE', key, '+inf', after_now, 'WITHSCORES', 'LIMIT', '0',
        '1')
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
    if final == 1 then
      -- One hit, the first of its key (most requests): its member is the request id. Without the
      -- table below, Redis spends a twentieth less on such a request.
      redis.call('ZADD', key, score, rid)
      if log then
        redis.call('ZADD', log, score, rid)
      end
    else
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
    end
    -- Until the hits leave: a window after the counter's "now", in this server's clock.
    local ttl = text(math.ceil((at + window - now) / 1000))
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
        return math.max(oldest[2] + window - now, 0)
      end
    end
    return 0
  end

  log_functions_made = {
    form = log_form,
    decide = decide_log,
    record = record_log,
    reset = log_reset,
    has_provisional = has_provisional,
    until_fits = until_fits,
  }
  return log_functions_made
end
