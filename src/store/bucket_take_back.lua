-- slidegate: takes back the hits of a denied cross-slot request from one bucket counter (cluster).
--
-- KEYS[1]  the counter's hash (bucket index -> hits, 't' -> their sum; see sliding_window.lua)
-- KEYS[2]  its provisional hash (request id -> the bucket index its hits went to)
-- ARGV[1]  the request id
-- ARGV[2]  the request's hits on this counter
--
-- The bucket is found in the provisional hash, because only Redis knew the time (and so the
-- bucket) when the hits were recorded. A bucket left empty is deleted, and the whole counter when
-- it holds no hits; 'o' may then name an empty bucket, which the script reads as "at or before the
-- oldest".
local field = redis.call('HGET', KEYS[2], ARGV[1])
if field then
  redis.call('HDEL', KEYS[2], ARGV[1])
  if redis.call('EXISTS', KEYS[1]) == 0 then
    return 0
  end
  local hits = tonumber(ARGV[2])
  if redis.call('HINCRBY', KEYS[1], field, -hits) <= 0 then
    redis.call('HDEL', KEYS[1], field)
  end
  if redis.call('HINCRBY', KEYS[1], 't', -hits) <= 0 then
    redis.call('DEL', KEYS[1])
  end
end
return 0
