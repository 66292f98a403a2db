-- slidegate: takes back the hits of a denied cross-slot request from one bucket counter (cluster).
--
-- KEYS[1]  the counter's hash (bucket index -> hits)
-- KEYS[2]  its provisional hash (request id -> the bucket index its hits went to)
-- ARGV[1]  the request id
-- ARGV[2]  the request's hits on this counter
--
-- The bucket is found in the provisional hash, because only Redis knew the time (and so the
-- bucket) when the hits were recorded. A bucket left empty is deleted.
local field = redis.call('HGET', KEYS[2], ARGV[1])
if field then
  if redis.call('HINCRBY', KEYS[1], field, -tonumber(ARGV[2])) <= 0 then
    redis.call('HDEL', KEYS[1], field)
  end
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return 0
