-- A worker's copy in one placement bucket, atomic in that bucket's slot. Every bucket holds
-- the records and namespace lists its resolves read, so resolving touches one slot.
--
-- The copy holds what a resolve reads of a worker (expiry, headroom, flags, hostname, URL and
-- secret), no namespace list: the lists it is a member of are its membership entry, which only
-- this script reads. A registration's work is cut into calls of at most SCRIPT_PAGE (100) lists
-- joined or ids reclaimed (`src/store/mod.rs`), so no call holds Redis for long whatever the
-- worker sent: the first call ('put' or 'renew') writes the copy and joins the first page of
-- its lists (and a 'put' reclaims the first page of held ids), then 'join' and 'reclaim' calls
-- carry the rest.
--
-- KEYS[1]        the bucket's worker copies   KEYS[2] the bucket's liveness entries
-- KEYS[3]        the bucket's membership entries (sessionId → JSON [{hostname}{ns}, ...])
-- KEYS[4]        the bucket's ownership ledger  KEYS[5] the ledger's newest entry of each id
-- KEYS[6..n+5]   namespace lists, named (as {hostname}{ns}) by ARGV[9] in the same order: the
--                lists joined by this call, and those of every copy the caller read it may drop
-- KEYS[n+6..]    placements hashes of the ids held (reclaim), indexed by ARGV[8]
--
-- ARGV[1]  'put' (register), 'renew' (heartbeat), 'join' (a further page of lists), 'reclaim'
--          (a further page of held ids), 'drop', or 'prune' (the mirror poll: only the prune,
--          no session of its own)   ARGV[2] sessionId ('' for 'prune')
-- ARGV[3]  the copy (JSON, store::BucketCopy) for 'put' and 'renew'; '' otherwise
-- ARGV[4]  lease TTL (ms)
-- ARGV[5]  'prune' to delete copies dead for more than a lease (register, mirror), '' otherwise
-- ARGV[6]  session this registration replaces, or ''
-- ARGV[7]  prevSessionId whose rows to reclaim, or ''
-- ARGV[8]  JSON [[index into KEYS of its placements hash, env, ns, id], ...]: ids still held here
-- ARGV[9]  JSON [{hostname}{ns}, ...]: the names of KEYS[4..n+3]
-- ARGV[10] 'put' and 'renew': the copy's membership entry (JSON, every list it is a member of)
-- ARGV[11] 'put', 'renew' and 'join': JSON [{hostname}{ns}, ...], the lists to join now
-- ARGV[12] the ledger's cap (ledger.max_entries_per_bucket; '' for the ledger off)
--
-- Every copy written also writes its liveness entry ('{expiry} {hostname}'), which a steady
-- resolve reads instead of decoding the copy; every copy dropped or pruned loses it. Every row
-- reclaimed is appended to the ledger ('reclaimed', from the previous session to this one).
--
-- A drop leaves a tombstone ({expiry = now, dropped = true}) that no list names, pruned like any
-- copy dead for a lease: a heartbeat that raced the drop finds it and writes nothing back. A
-- renew whose copy is missing altogether (the bucket lost its keys) writes it again: the
-- caller renews only a session the registry holds live. A 'join' or 'reclaim' for a copy that
-- is gone or a tombstone writes nothing (the registration was replaced meanwhile).
--
-- Returns JSON {stale = true} when a copy to drop is in a list the caller did not declare
-- (it re-reads and retries; nothing was written), else
-- {duplicates = [[ns, id]...], windDowns = [[ns, id, expiry, moved]...], healed = true|false}
-- (moved: the row names a move's successor, and its owner is told the wind-down is a move's).
local workers, alive, memberships = KEYS[1], KEYS[2], KEYS[3]
local op, sid = ARGV[1], ARGV[2]
local lease = tonumber(ARGV[4])
local now = now_ms()

local lists = {}
for i, name in ipairs(cjson.decode(ARGV[9])) do
  lists[name] = KEYS[i + 5]
end
-- The keys of `names`, or nil when one of them was not declared.
local function keys_of(names)
  local keys = {}
  for _, name in ipairs(names) do
    local key = lists[name]
    if not key then
      return nil
    end
    keys[#keys + 1] = key
  end
  return keys
end
-- The lists copy `id` is a member of: its membership entry, or for a copy written before
-- membership entries existed, its own namespaces.
local function lists_of(id, copy)
  local names = redis.call('HGET', memberships, id)
  if names then
    return keys_of(cjson.decode(names))
  end
  names = {}
  for _, ns in ipairs(copy.namespaces or {}) do
    names[#names + 1] = (copy.hostname or '') .. ns
  end
  return keys_of(names)
end
local function leave(id, keys)
  for _, key in ipairs(keys) do
    redis.call('SREM', key, id)
  end
  redis.call('HDEL', memberships, id)
end
-- The lists to join now (ARGV[11]), checked before anything is written.
local function lists_to_join()
  local keys = keys_of(cjson.decode(ARGV[11]))
  if not keys then
    return nil, redis.error_reply('ERR bucket_worker: a list to join is not in KEYS')
  end
  return keys
end
local function join(keys)
  for _, key in ipairs(keys) do
    redis.call('SADD', key, sid)
  end
end
local function done(healed)
  return cjson.encode({duplicates = {}, windDowns = {}, healed = healed})
end
-- This session's copy, when it is live here (neither gone nor a tombstone).
local function live_copy()
  local current = redis.call('HGET', workers, sid)
  return current and not cjson.decode(current).dropped
end

-- Reclaim: rows still owned by the previous session move to this one with their epoch (and
-- tag); any other id is reported so the worker evicts it.
local function reclaim(prev)
  local duplicates, wind_downs = {}, {}
  for _, held in ipairs(cjson.decode(ARGV[8])) do
    local placements, env, ns, id = KEYS[held[1]], held[2], held[3], held[4]
    local row = redis.call('HGET', placements, id)
    local claimed = false
    if row and prev ~= '' then
      row = cjson.decode(row)
      if row.sessionId == prev then
        row.sessionId = sid
        redis.call('HSET', placements, id, cjson.encode(row))
        ledger_append({KEYS[4], KEYS[5], ARGV[12]}, env, ns, id, row.epoch or '', prev, sid,
          'reclaimed')
        claimed = true
        if row.expiry then
          wind_downs[#wind_downs + 1] = {ns, id, row.expiry, row.mv ~= nil}
        end
      end
    end
    if not claimed then
      duplicates[#duplicates + 1] = {ns, id}
    end
  end
  return duplicates, wind_downs
end

if op == 'join' then
  local keys, refused = lists_to_join()
  if not keys then
    return refused
  end
  if live_copy() then
    join(keys)
  end
  return done(false)
end
if op == 'reclaim' then
  -- A session replaced meanwhile takes nothing: every id comes back as a duplicate.
  local duplicates, wind_downs = reclaim(live_copy() and ARGV[7] or '')
  return cjson.encode({duplicates = duplicates, windDowns = wind_downs, healed = false})
end
local join_keys
if op == 'put' or op == 'renew' then
  local refused
  join_keys, refused = lists_to_join()
  if not join_keys then
    return refused
  end
end

-- Every drop is checked before anything is written.
local drops = {}
local function plan_drop(id)
  local raw = redis.call('HGET', workers, id)
  if raw then
    local keys = lists_of(id, cjson.decode(raw))
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
    if copy.expiry + lease < now then
      local keys = lists_of(all[i], copy)
      -- A copy in a list this call does not hold waits for the next prune.
      if keys then
        pruned[#pruned + 1] = {all[i], keys}
      end
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
redis.call('HSET', workers, sid, ARGV[3])
redis.call('HSET', alive, sid, string.format('%d', copy.expiry) .. ' ' .. (copy.hostname or ''))
redis.call('HSET', memberships, sid, ARGV[10])
join(join_keys)
if op == 'renew' then
  return done(healed)
end
local duplicates, wind_downs = reclaim(ARGV[7])
return cjson.encode({duplicates = duplicates, windDowns = wind_downs, healed = healed})
