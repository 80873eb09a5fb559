-- POST /registry/release for the rows of one bucket: compare-and-delete, atomic in the
-- bucket's slot. A row is freed only while its sessionId matches and its epoch equals the
-- quoted one ('' quotes an epoch-less row).
--
-- KEYS     the placements hashes the rows live in (one per (env, ns))
-- ARGV     groups of four: index into KEYS, id, sessionId, epoch
--
-- Returns the number of rows freed.
local released = 0
for i = 1, #ARGV, 4 do
  local placements = KEYS[tonumber(ARGV[i])]
  local row = redis.call('HGET', placements, ARGV[i + 1])
  if row then
    row = cjson.decode(row)
    if row.sessionId == ARGV[i + 2] and (row.epoch or '') == ARGV[i + 3] then
      redis.call('HDEL', placements, ARGV[i + 1])
      released = released + 1
    end
  end
end
return released
