-- slidegate: takes back the hits of a denied cross-slot request from one bucket counter (cluster).
--
-- KEYS[1]  the counter's hash (bucket index -> hits, 't' -> their sum; see sliding_window.lua)
-- KEYS[2]  its provisional hash (bucket index -> provisional hits)
-- ARGV[1]  the bucket the script recorded the request's hits in (it reported the index)
-- ARGV[2]  the request's hits on this counter
--
-- A bucket left empty is deleted, and the whole counter when it holds no hits; 'o' may then name
-- an empty bucket, which the script reads as "at or before the oldest". A counter that expired
-- meanwhile is left alone.
local field, hits = ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 1 and redis.call('HINCRBY', KEYS[2], field, -hits) <= 0 then
  redis.call('HDEL', KEYS[2], field)
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
if redis.call('HINCRBY', KEYS[1], field, -hits) <= 0 then
  redis.call('HDEL', KEYS[1], field)
end
if redis.call('HINCRBY', KEYS[1], 't', -hits) <= 0 then
  redis.call('DEL', KEYS[1])
end
return 0
