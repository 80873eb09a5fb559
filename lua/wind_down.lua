-- POST /registry/wind_down for rows of one bucket: stamps (or clears) each row's wind-down
-- expiry, atomic in the bucket's slot, but only while the row still belongs to the session and
-- epoch the caller read — a row re-placed meanwhile is left alone.
--
-- KEYS[1]  bucket key prefix
-- ARGV[1]  env   ARGV[2] namespace   ARGV[3] deadline in seconds ('' clears)   ARGV[4] lease (ms)
-- ARGV[5…] groups of three: id, sessionId, epoch ('' for an epoch-less row)
--
-- Returns JSON [[id, sessionId, expiry ms | false], ...] for the rows stamped.
local K = KEYS[1]
local key = K .. ARGV[1] .. ':' .. ARGV[2] .. ':placements'
local expiry = false
if ARGV[3] ~= '' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  expiry = now + math.max(math.floor(tonumber(ARGV[3]) * 1000), tonumber(ARGV[4]))
end
local stamped = {}
for i = 5, #ARGV, 3 do
  local raw = redis.call('HGET', key, ARGV[i])
  if raw then
    local row = cjson.decode(raw)
    if row.sessionId == ARGV[i + 1] and (row.epoch or '') == ARGV[i + 2] then
      row.expiry = expiry or nil
      redis.call('HSET', key, ARGV[i], cjson.encode(row))
      stamped[#stamped + 1] = {ARGV[i], row.sessionId, expiry}
    end
  end
end
return cjson.encode(stamped)
