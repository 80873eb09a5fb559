-- POST /registry/wind_down and POST /registry/move for rows of one bucket: stamps (or clears)
-- each row's wind-down expiry, atomic in the bucket's slot, but only while the row still
-- belongs to the session and epoch the caller read — a row re-placed meanwhile is left alone.
-- A move also names its successor on the row (`mv`: {to = sessionId, by = the operator}),
-- for resolve.lua to place the id there next; a wind-down, or its clear, drops a move's
-- successor (the last act wins). Each row stamped is appended to the ledger ('wind-down', by
-- the operator, with the fence set or '' cleared).
--
-- KEYS[1]  the placements hash of (env, ns)
-- KEYS[2]  the bucket's ownership ledger      KEYS[3] the ledger's newest entry of each id
-- ARGV[1]  deadline in seconds ('' clears)   ARGV[2] lease (ms)
-- ARGV[3]  the ledger's cap (ledger.max_entries_per_bucket; '' for the ledger off)
-- ARGV[4]  env   ARGV[5] ns   ARGV[6] the operator's sub
-- ARGV[7]  a move's successor session ('' for none: a wind-down, or a move without one)
-- ARGV[8…] groups of three: id, sessionId, epoch ('' for an epoch-less row); at most 100 ids
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
local successor = nil
if ARGV[7] ~= '' then
  successor = {to = ARGV[7], by = ARGV[6]}
end
local stamped = {}
for i = 8, #ARGV, 3 do
  local raw = redis.call('HGET', placements, ARGV[i])
  if raw then
    local row = cjson.decode(raw)
    if row.sessionId == ARGV[i + 1] and (row.epoch or '') == ARGV[i + 2] then
      row.expiry = expiry or nil
      row.mv = successor
      redis.call('HSET', placements, ARGV[i], cjson.encode(row))
      ledger_append(ledger, ARGV[4], ARGV[5], ARGV[i], ARGV[i + 2], row.sessionId,
        row.sessionId, 'wind-down', {'by', ARGV[6], 'fence', fence})
      stamped[#stamped + 1] = {ARGV[i], row.sessionId, expiry}
    end
  end
end
return cjson.encode(stamped)
