-- POST /registry/tag: compare-and-set of a placement's owner tag, atomic in the bucket's slot.
-- Written only while the row's sessionId matches and its epoch equals the quoted one.
--
-- KEYS[1]  bucket key prefix
-- ARGV[1]  env   ARGV[2] ns   ARGV[3] id   ARGV[4] sessionId   ARGV[5] epoch   ARGV[6] tag
--
-- Returns 1 when tagged, 0 otherwise.
local key = KEYS[1] .. ARGV[1] .. ':' .. ARGV[2] .. ':placements'
local row = redis.call('HGET', key, ARGV[3])
if not row then
  return 0
end
row = cjson.decode(row)
if row.sessionId ~= ARGV[4] or row.epoch ~= ARGV[5] then
  return 0
end
row.tag = ARGV[6]
redis.call('HSET', key, ARGV[3], cjson.encode(row))
return 1
