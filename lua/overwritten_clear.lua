-- After a 2xx from an HTTP forward on an overwritten-listed id: the new owner has served, so
-- the marker goes — but only a marker at or below the served epoch (a later overwrite stays).
--
-- KEYS[1]  the overwritten hash of (env, ns)
-- ARGV[1]  id   ARGV[2] served epoch
--
-- Returns 1 when the marker was cleared.
local overwritten = KEYS[1]
local marker = redis.call('HGET', overwritten, ARGV[1])
if marker and epoch_cmp(marker ~= '' and marker or '0', ARGV[2]) <= 0 then
  redis.call('HDEL', overwritten, ARGV[1])
  return 1
end
return 0
