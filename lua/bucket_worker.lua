-- A worker's copy in one placement bucket, atomic in that bucket's slot. Every bucket holds
-- the records and namespace lists its resolves read, so resolving touches one slot.
--
-- KEYS[1]        the bucket's worker copies   KEYS[2] the bucket's liveness entries
-- KEYS[3..n+2]   namespace lists, named (as {hostname}{ns}) by ARGV[9] in the same order: the
--                lists of the copy written, and of every copy the caller read it may drop
-- KEYS[n+3..]    placements hashes of the ids held (reclaim), indexed by ARGV[8]
--
-- ARGV[1]  'put' (register), 'renew' (heartbeat), 'drop', or 'prune' (the mirror poll: only
--          the prune, no session of its own)   ARGV[2] sessionId ('' for 'prune')
-- ARGV[3]  the copy (JSON, store::BucketCopy) for 'put' and 'renew'; '' for 'drop' and 'prune'
-- ARGV[4]  lease TTL (ms)
-- ARGV[5]  'prune' to delete copies dead for more than a lease (register, mirror), '' otherwise
-- ARGV[6]  session this registration replaces, or ''
-- ARGV[7]  prevSessionId whose rows to reclaim, or ''
-- ARGV[8]  JSON [[index into KEYS of its placements hash, ns, id], ...]: ids still held here
-- ARGV[9]  JSON [{hostname}{ns}, ...]: the names of KEYS[3..n+2]
--
-- Every copy written also writes its liveness entry ('{expiry} {hostname}'), which a steady
-- resolve reads instead of decoding the copy; every copy dropped or pruned loses it.
--
-- A drop leaves a tombstone ({expiry = now, dropped = true}) that no list names, pruned like any
-- copy dead for a lease: a heartbeat that raced the drop finds it and writes nothing back. A
-- renew whose copy is missing altogether (the bucket lost its keys) writes it again: the
-- caller renews only a session the registry holds live.
--
-- Returns JSON {stale = true} when a copy to drop is in a list the caller did not declare
-- (it re-reads and retries; nothing was written), else
-- {duplicates = [[ns, id]...], windDowns = [[ns, id, expiry]...], healed = true|false}.
local workers, alive = KEYS[1], KEYS[2]
local op, sid = ARGV[1], ARGV[2]
local lease = tonumber(ARGV[4])
local now = now_ms()

local lists = {}
for i, name in ipairs(cjson.decode(ARGV[9])) do
  lists[name] = KEYS[i + 2]
end
-- The lists a copy is a member of, or nil when one of them was not declared.
local function lists_of(copy)
  local keys = {}
  for _, ns in ipairs(copy.namespaces or {}) do
    local key = lists[(copy.hostname or '') .. ns]
    if not key then
      return nil
    end
    keys[#keys + 1] = key
  end
  return keys
end
local function leave(id, keys)
  for _, key in ipairs(keys) do
    redis.call('SREM', key, id)
  end
end
local function done(healed)
  return cjson.encode({duplicates = {}, windDowns = {}, healed = healed})
end

-- Every drop is checked before anything is written.
local drops = {}
local function plan_drop(id)
  local raw = redis.call('HGET', workers, id)
  if raw then
    local keys = lists_of(cjson.decode(raw))
    if not keys then
      return false
    end
    drops[#drops + 1] = {id, keys}
  end
  return true
end
if op == 'drop' and not plan_drop(sid) then
  return cjson.encode({stale = true})
end
if ARGV[6] ~= '' and not plan_drop(ARGV[6]) then
  return cjson.encode({stale = true})
end
local pruned = {}
if ARGV[5] == 'prune' then
  local all = redis.call('HGETALL', workers)
  for i = 1, #all, 2 do
    local copy = cjson.decode(all[i + 1])
    local keys = lists_of(copy)
    -- A copy in a list this call does not hold waits for the next prune.
    if copy.expiry + lease < now and keys then
      pruned[#pruned + 1] = {all[i], keys}
    end
  end
end

for _, d in ipairs(drops) do
  leave(d[1], d[2])
  redis.call('HSET', workers, d[1], cjson.encode({expiry = now, dropped = true}))
  redis.call('HDEL', alive, d[1])
end
for _, p in ipairs(pruned) do
  leave(p[1], p[2])
  redis.call('HDEL', workers, p[1])
  redis.call('HDEL', alive, p[1])
end
if op == 'drop' or op == 'prune' then
  return done(false)
end

local healed = false
if op == 'renew' then
  local current = redis.call('HGET', workers, sid)
  if current and cjson.decode(current).dropped then
    return done(false)
  end
  healed = not current
end
local copy = cjson.decode(ARGV[3])
local keys = lists_of(copy)
if not keys then
  return redis.error_reply('ERR bucket_worker: the copy names a list not in KEYS')
end
redis.call('HSET', workers, sid, ARGV[3])
redis.call('HSET', alive, sid, string.format('%d', copy.expiry) .. ' ' .. (copy.hostname or ''))
for _, key in ipairs(keys) do
  redis.call('SADD', key, sid)
end

-- Reclaim: rows still owned by the previous session move to this one with their epoch (and
-- tag); any other id is reported so the worker evicts it.
local duplicates, wind_downs = {}, {}
local prev = ARGV[7]
for _, held in ipairs(cjson.decode(ARGV[8])) do
  local placements, ns, id = KEYS[held[1]], held[2], held[3]
  local row = redis.call('HGET', placements, id)
  local claimed = false
  if row and prev ~= '' then
    row = cjson.decode(row)
    if row.sessionId == prev then
      row.sessionId = sid
      redis.call('HSET', placements, id, cjson.encode(row))
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
return cjson.encode({duplicates = duplicates, windDowns = wind_downs, healed = healed})
