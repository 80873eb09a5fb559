-- POST /registry/schedule for the rows of one bucket: compare-and-set of each id's entry on
-- its wake schedule (contract §7), atomic in the bucket's slot. An entry is written (or
-- removed) only while the id's row is the quoted session's at the quoted epoch.
--
-- KEYS     pairs: the placements hash of an (env, ns), then its wake schedule
-- ARGV     groups of five: index into KEYS of the pair's placements hash, id, sessionId,
--          epoch, wake-at in epoch ms ('' removes the entry)
--
-- Returns the number of entries written or removed.
local scheduled = 0
for i = 1, #ARGV, 5 do
  local at = tonumber(ARGV[i])
  local placements, wake, id = KEYS[at], KEYS[at + 1], ARGV[i + 1]
  local row = redis.call('HGET', placements, id)
  if row then
    row = cjson.decode(row)
    if row.sessionId == ARGV[i + 2] and row.epoch == ARGV[i + 3] then
      if ARGV[i + 4] == '' then
        scheduled = scheduled + redis.call('ZREM', wake, id)
      else
        redis.call('ZADD', wake, ARGV[i + 4], id)
        scheduled = scheduled + 1
      end
    end
  end
end
return scheduled
