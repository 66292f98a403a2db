-- The sliding-window script, continued: the files of this directory, in order, are one script.

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

-- The functions of carrying, made on a call's first use of them (`carry_functions`): Redis makes a
-- script's closures anew for every call, and most calls carry nothing.
local carry_functions_made = nil
local function carry_functions()
  if carry_functions_made then
    return carry_functions_made
  end

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

  -- The most hits a log holds after a charge (`log_held_max` in `store/form.rs`): its limit or
  -- `LOG_CARRY_MAX`, whichever is more, and `LOG_CARRY_MAX` over it. A charge that would take a
  -- log past it carries the log into buckets (`debt_width`): charges land over the limit, and a
  -- log keeps a member per hit.
  local function log_held_max(limit)
    return math.max(limit, LOG_CARRY_MAX) + LOG_CARRY_MAX
  end

  -- The buckets a debt is kept in (`Precision::for_debt` in `store/form.rs`): a sixtieth of the
  -- window, or a fiftieth where a sixtieth is not a whole number of microseconds, else the window.
  local function debt_width(window)
    if window >= 60 and window % 60 == 0 then
      return window / 60
    elseif window >= 50 and window % 50 == 0 then
      return window / 50
    end
    return window
  end

  carry_functions_made = {
    carry = carry,
    debt_width = debt_width,
    log_held_max = log_held_max,
    stray = stray,
    provisional_form = provisional_form,
  }
  return carry_functions_made
end
