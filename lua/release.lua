-- POST /registry/release for the rows of one bucket: compare-and-delete, atomic in the
-- bucket's slot. A row is freed only while its sessionId matches and its epoch equals the
-- quoted one ('' quotes an epoch-less row).
--
-- KEYS[1]  bucket key prefix
-- ARGV     groups of five: env, ns, id, sessionId, epoch
--
-- Returns the number of rows freed.
local K = KEYS[1]
local released = 0
for i = 1, #ARGV, 5 do
  local key = K .. ARGV[i] .. ':' .. ARGV[i + 1] .. ':placements'
  local row = redis.call('HGET', key, ARGV[i + 2])
  if row then
    row = cjson.decode(row)
    if row.sessionId == ARGV[i + 3] and (row.epoch or '') == ARGV[i + 4] then
      redis.call('HDEL', key, ARGV[i + 2])
      released = released + 1
    end
  end
end
return released
