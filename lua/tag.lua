-- POST /registry/tag: compare-and-set of a placement's owner tag, atomic in the bucket's slot.
-- Written only while the row's sessionId matches and its epoch equals the quoted one.
--
-- KEYS[1]  the placements hash of (env, ns)
-- ARGV[1]  id   ARGV[2] sessionId   ARGV[3] epoch   ARGV[4] tag
--
-- Returns 1 when tagged, 0 otherwise.
local placements = KEYS[1]
local row = redis.call('HGET', placements, ARGV[1])
if not row then
  return 0
end
row = cjson.decode(row)
if row.sessionId ~= ARGV[2] or row.epoch ~= ARGV[3] then
  return 0
end
row.tag = ARGV[4]
redis.call('HSET', placements, ARGV[1], cjson.encode(row))
return 1
