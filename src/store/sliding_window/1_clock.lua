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
-- ARGV[4]   the number of shapes: what the call's requests ask, but for their ids and keys. A
--           call's requests mostly ask alike (a rule's limit, window and hits), so each shape
--           goes once a call and a request names its own: Redis turns every argument into a
--           string of its own and into Lua's `ARGV`, some 700 instructions each.
-- then per shape (numbered from 1 in order):
--   part    '1' if its requests are one slot's part of a cross-slot request, else '0'
--   n       its number of counters
--   then per counter: limit, window (us), hits, flags, bucket width (us; 0: the log)
--   flags   the sum of 1 (shadow), 2 (charged: recorded whatever the decision, over the limit too)
--           and 4 (returned: up to `hits` of the newest hits taken back; never over limit)
-- then per request:
--   id      the request id: member of its first hit on a key; hit n > 1 is id .. ':' .. n
--   shape   the number of its shape
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

-- The text of a whole number, made once per call: a call's requests format the same few numbers
-- again and again (a bucket's index, a count of hits, an expiry), and `string.format` with the
-- new string costs Redis about as much as a command's argument handling.
local texts = {}
local function text(n)
  local t = texts[n]
  if not t then
    t = int(n)
    texts[n] = t
  end
  return t
end

-- A number Redis returned as a string, or nil for none (false): read once, by arithmetic. Lua
-- 5.1's `tonumber` reads a string twice (whether it is a number, then the number), each time with
-- strtod: a few hundred instructions a digit string. Anything that is not a number raises.
local function reply_number(s)
  if s then
    return s + 0
  end
  return nil
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
-- The time of the hits a call records (the node's "now"), as text.
local node_now_text = now_text
if node_now ~= now then
  node_now_text = int(node_now)
end
-- The reply's header, then each request's answer.
local out = { now, 0 }
