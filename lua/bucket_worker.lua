-- A worker's copy in one placement bucket, atomic in that bucket's slot. Every bucket holds
-- the records and namespace lists its resolves read, so resolving touches one slot.
--
-- KEYS[1]  bucket key prefix ("{prefix}{b}:")
-- ARGV[1]  'put', 'renew' or 'drop'  ARGV[2] sessionId
-- ARGV[3]  bucket record (JSON: expiry, headroom, draining, degraded, namespaces, hostname,
--          env, envs, advertiseUrl, secret) for 'put' and 'renew'; '' for 'drop'
-- ARGV[4]  lease TTL (ms)
-- ARGV[5]  'prune' to drop records dead for more than a lease (register), '' otherwise
-- ARGV[6]  session this registration replaces, or ''
-- ARGV[7]  prevSessionId whose rows to reclaim, or ''
-- ARGV[8]  JSON [[env, ns, id], ...]: ids the worker still holds in this bucket
--
-- Returns JSON {duplicates = [[ns, id]...], windDowns = [[ns, id, expiry]...]}.
local K = KEYS[1]
local op, sid = ARGV[1], ARGV[2]
local lease = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function nslist(record, ns)
  return K .. 'nsw:' .. (record.hostname or '') .. ns
end

local function drop(id)
  local record = redis.call('HGET', K .. 'workers', id)
  if record then
    record = cjson.decode(record)
    for _, ns in ipairs(record.namespaces) do
      redis.call('SREM', nslist(record, ns), id)
    end
    redis.call('HDEL', K .. 'workers', id)
  end
end

if op == 'drop' then
  drop(sid)
  return cjson.encode({duplicates = {}, windDowns = {}})
end
-- A heartbeat only refreshes a copy its registration wrote: when a deregister, a voided or
-- superseded registration, or a replacing one dropped the copy while this heartbeat was in
-- flight, writing it back would resurrect a session the registry no longer has.
if op == 'renew' and redis.call('HEXISTS', K .. 'workers', sid) == 0 then
  return cjson.encode({duplicates = {}, windDowns = {}})
end

if ARGV[5] == 'prune' then
  local all = redis.call('HGETALL', K .. 'workers')
  for i = 1, #all, 2 do
    if cjson.decode(all[i + 1]).expiry + lease < now then
      drop(all[i])
    end
  end
end
if ARGV[6] ~= '' then
  drop(ARGV[6])
end

local record = cjson.decode(ARGV[3])
redis.call('HSET', K .. 'workers', sid, ARGV[3])
for _, ns in ipairs(record.namespaces) do
  redis.call('SADD', nslist(record, ns), sid)
end

-- Reclaim: rows still owned by the previous session move to this one with their epoch (and
-- tag); any other id is reported so the worker evicts it.
local duplicates, wind_downs = {}, {}
local prev = ARGV[7]
for _, held in ipairs(cjson.decode(ARGV[8])) do
  local env, ns, id = held[1], held[2], held[3]
  local key = K .. env .. ':' .. ns .. ':placements'
  local row = redis.call('HGET', key, id)
  local claimed = false
  if row and prev ~= '' then
    row = cjson.decode(row)
    if row.sessionId == prev then
      row.sessionId = sid
      redis.call('HSET', key, id, cjson.encode(row))
      claimed = true
      if row.expiry then
        wind_downs[#wind_downs + 1] = {ns, id, row.expiry}
      end
    end
  end
  if not claimed then
    duplicates[#duplicates + 1] = {ns, id}
  end
end
return cjson.encode({duplicates = duplicates, windDowns = wind_downs})
