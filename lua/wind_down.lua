-- POST /registry/wind_down for rows of one bucket: stamps (or clears) each row's wind-down
-- expiry, atomic in the bucket's slot, but only while the row still belongs to the session and
-- epoch the caller read — a row re-placed meanwhile is left alone.
--
-- KEYS[1]  the placements hash of (env, ns)
-- ARGV[1]  deadline in seconds ('' clears)   ARGV[2] lease (ms)
-- ARGV[3…] groups of three: id, sessionId, epoch ('' for an epoch-less row); at most 100 ids
--          per call (SCRIPT_PAGE): an id-less wind-down walks the bucket with HSCAN and sends
--          each page's ids in calls of 100, so no call holds Redis for long
--
-- Returns JSON [[id, sessionId, expiry ms | false], ...] for the rows stamped.
local placements = KEYS[1]
local expiry = false
if ARGV[1] ~= '' then
  expiry = now_ms() + math.max(math.floor(tonumber(ARGV[1]) * 1000), tonumber(ARGV[2]))
end
local stamped = {}
for i = 3, #ARGV, 3 do
  local raw = redis.call('HGET', placements, ARGV[i])
  if raw then
    local row = cjson.decode(raw)
    if row.sessionId == ARGV[i + 1] and (row.epoch or '') == ARGV[i + 2] then
      row.expiry = expiry or nil
      redis.call('HSET', placements, ARGV[i], cjson.encode(row))
      stamped[#stamped + 1] = {ARGV[i], row.sessionId, expiry}
    end
  end
end
return cjson.encode(stamped)
