-- slidegate: takes back the hits of a denied cross-slot request from one bucket counter (cluster).
--
-- KEYS[1]  the counter's hash (bucket index -> hits, 't' -> their sum, 'w' -> the bucket width;
--          see sliding_window/)
-- KEYS[2]  its provisional hash (bucket index -> provisional hits)
-- ARGV[1]  the bucket the script recorded the request's hits in (it reported the index)
-- ARGV[2]  the request's hits on this counter
-- ARGV[3]  the bucket width the request was decided with (microseconds)
--
-- Takes off at most what the bucket still holds, and no more than its provisional hash still
-- counts: a bucket that left the window meanwhile took the request's hits with it, a refund that
-- came first took them already, and the hits of other requests, in that bucket or any other, stay. A
-- counter carried over into another representation meanwhile (a reload) no longer has the
-- request's bucket, and is left alone: its hits then expire with the window, which over-counts
-- and never over-admits. A bucket left empty is deleted, and the whole counter once its total
-- says it holds no hits; 'o' may then name an empty bucket, which the script reads as "at or
-- before the oldest".
local field, hits, width = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

-- Takes up to `hits` off `field` of `key`; returns what it took.
local function take(key)
  local held = tonumber(redis.call('HGET', key, field)) or 0
  local taken = math.min(hits, held)
  if taken <= 0 then
    return 0
  end
  if held - taken <= 0 then
    redis.call('HDEL', key, field)
  else
    redis.call('HINCRBY', key, field, -taken)
  end
  return taken
end

local meta = redis.pcall('HMGET', KEYS[1], 'w')
if meta.err or (meta[1] and tonumber(meta[1]) ~= width) then
  return 0
end
-- No more than the provisional count still holds: a refund that came first took its hits as the
-- provisional ones (the sliding-window script's `take_back`), and they must not be taken twice.
local provisional = 0
if redis.pcall('TYPE', KEYS[2]).ok == 'hash' then
  provisional = take(KEYS[2])
end
hits = provisional
local taken = take(KEYS[1])
if taken > 0 and redis.call('HINCRBY', KEYS[1], 't', -taken) <= 0 then
  redis.call('DEL', KEYS[1])
end
return taken
