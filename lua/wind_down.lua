-- POST /registry/wind_down for rows of one bucket: stamps (or clears) each row's wind-down
-- expiry, atomic in the bucket's slot, but only while the row still belongs to the session and
-- epoch the caller read — a row re-placed meanwhile is left alone. Each row stamped is
-- appended to the ledger ('wind-down', by the operator, with the fence set or '' cleared).
--
-- KEYS[1]  the placements hash of (env, ns)
-- KEYS[2]  the bucket's ownership ledger      KEYS[3] the ledger's newest entry of each id
-- ARGV[1]  deadline in seconds ('' clears)   ARGV[2] lease (ms)
-- ARGV[3]  the ledger's cap (ledger.max_entries_per_bucket; '' for the ledger off)
-- ARGV[4]  env   ARGV[5] ns   ARGV[6] the operator's sub
-- ARGV[7…] groups of three: id, sessionId, epoch ('' for an epoch-less row); at most 100 ids
--          per call (SCRIPT_PAGE): an id-less wind-down walks the bucket with HSCAN and sends
--          each page's ids in calls of 100, so no call holds Redis for long
--
-- Returns JSON [[id, sessionId, expiry ms | false], ...] for the rows stamped.
local placements = KEYS[1]
local ledger = {KEYS[2], KEYS[3], ARGV[3]}
local expiry = false
if ARGV[1] ~= '' then
  expiry = now_ms() + math.max(math.floor(tonumber(ARGV[1]) * 1000), tonumber(ARGV[2]))
end
local fence = expiry and string.format('%d', expiry) or ''
local stamped = {}
for i = 7, #ARGV, 3 do
  local raw = redis.call('HGET', placements, ARGV[i])
  if raw then
    local row = cjson.decode(raw)
    if row.sessionId == ARGV[i + 1] and (row.epoch or '') == ARGV[i + 2] then
      row.expiry = expiry or nil
      redis.call('HSET', placements, ARGV[i], cjson.encode(row))
      ledger_append(ledger, ARGV[4], ARGV[5], ARGV[i], ARGV[i + 2], row.sessionId,
        row.sessionId, 'wind-down', {'by', ARGV[6], 'fence', fence})
      stamped[#stamped + 1] = {ARGV[i], row.sessionId, expiry}
    end
  end
end
return cjson.encode(stamped)
