-- After a 2xx from an HTTP forward on an overwritten-listed id: the new owner has served, so
-- the marker goes — but only a marker at or below the served epoch (a later overwrite stays).
--
-- KEYS[1]  bucket key prefix
-- ARGV[1]  env   ARGV[2] namespace   ARGV[3] id   ARGV[4] served epoch
--
-- Returns 1 when the marker was cleared.
local key = KEYS[1] .. ARGV[1] .. ':' .. ARGV[2] .. ':overwritten'
local marker = redis.call('HGET', key, ARGV[3])
if marker and (tonumber(marker) or 0) <= tonumber(ARGV[4]) then
  redis.call('HDEL', key, ARGV[3])
  return 1
end
return 0
