-- Placement: the one live owner of (env, namespace, id), decided atomically in the id's bucket.
--
-- Every key it touches is declared, so that Redis Cluster refuses to run it while a slot
-- migration has split them between two nodes (ASK, then TRYAGAIN until the slot settles):
-- KEYS[1]  the placements hash of (env, ns)     KEYS[2] the bucket's worker copies
-- KEYS[3]  the overwritten hash of (env, ns)    KEYS[4] the namespace list of {hostname}{ns}
-- KEYS[5]  the bucket's boot_time               KEYS[6] the bucket's epoch counter
-- KEYS[7]  the bucket's liveness entries (sessionId → '{expiry} {hostname}': hostnames hold no space)
-- KEYS[8]  the bucket's ownership ledger      KEYS[9] the ledger's newest entry of each id
--
-- ARGV[1]  id             ARGV[2] hostname of the request ('' in single mode)
-- ARGV[3]  what only the slower paths read, newline-separated (no field can hold a newline:
--          they are HTTP header values, query values, session ids and numbers), so that a
--          steady request hands Redis three arguments rather than twelve:
--            lease TTL (ms), balance factor,
--            excluded sessionId ('' for none): a worker that just refused this activation,
--            preferred sessionId ('' for none): a caller-attested request's own session,
--            affinity key ('' for none),
--            JSON [sessionId, ...] this node has ejected as outliers,
--            two random unsigned integers for the power-of-two choice,
--            takeover of the request's env ('wind_down' | 'deny'; hostname-aware mode only),
--            remaining ms of a displaced (hostname, ns) binding's quarantine ('0' for none),
--            ms until the client may make a new placement ('0': now;
--            limits.new_placements_per_ip_per_s, counted by the node),
--            most rows the placements hash may hold ('' for no limit;
--            placement.max_rows_per_namespace),
--            the ledger's cap (ledger.max_entries_per_bucket; '' for the ledger off),
--            env, namespace (what a ledger entry names)
--
-- Returns, so that the hot path parses no JSON:
--   an existing row's live owner: one string 'sessionId epoch overwritten' (overwritten '1'
--   when the id is listed on the overwritten hash, else '0'): the caller keeps a session's
--   URL and secret (they never change) and reads the owner's copy when it meets a session it
--   does not know;
--   a new placement: {'placed', sessionId, epoch, overwritten, wind-down expiry ms carried over
--   to the new owner ('' for none), advertiseUrl, secret};
--   {'unknown-ns'} | {'no-backends'} | {'quarantine', remaining ms}
--   {'binding-quarantine', remaining ms}
--   {'takeover-pending', remaining ms} | {'takeover-denied'}
--   {'rate-limited', ms until the client may place} | {'namespace-full'}: a new placement
--   refused, nothing written
--   {'paused'}: an operator paused the id (the row's `paused`): nothing is placed or
--   forwarded, whoever owns it, and nothing is written
--
-- A new placement, and a takeover's fence, are appended to the ownership ledger (the
-- prelude's helper) in the same call: 'placed' (no row, or a live owner's row past its
-- wind-down fence), 're-placed-dead-owner', 'woken' (the durability sweep's placeholder),
-- 'takeover', 'moved' (to the successor an operator's move named, `by` the operator). A
-- steady request writes nothing.
--
-- A row naming a move's successor (`mv`: {to = sessionId, by = the operator's sub}, written by
-- wind_down.lua, kept by a release in an ownerless placeholder) is placed on that session when
-- it is among the candidates, else as any other; the new row drops `mv`, and does not inherit
-- the move's fence (it fenced the old owner, not the instance).
local placements, workers, overwritten, list, boot_key, epoch_key, alive =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local id, hostname = ARGV[1], ARGV[2]
local now = now_ms()

-- 1. An existing row forwards to its owner while the owner lives and its wind-down holds.
-- A row without a sessionId (or an empty one) is an ownerless placeholder (contract §7): free.
-- Nothing else is made or read on the way to that answer: what the other paths need (ARGV[3]'s
-- fields, the prelude's epoch helpers) comes after it.
local raw = redis.call('HGET', placements, id)
local old, owned, owner_live, contested
if raw then
  old = cjson.decode(raw)
  -- A paused id is answered before anything else, steady or not: the row is read anyway.
  if old.paused then
    return {'paused'}
  end
  owned = type(old.sessionId) == 'string' and old.sessionId ~= ''
  -- The owner's liveness entry, not its whole copy: no JSON decoded for a live owner. A copy
  -- without one (written before liveness entries existed) is read as before.
  local owner_expiry, owner_hostname
  if owned then
    owner_expiry, owner_hostname = owner_of(alive, workers, old.sessionId, hostname ~= '')
  end
  owner_live = owner_expiry and owner_expiry > now
  if owner_live and not (old.expiry and old.expiry <= now) then
    if hostname == '' or owner_hostname == hostname then
      return old.sessionId .. ' ' .. (old.epoch or '') .. ' '
        .. redis.call('HEXISTS', overwritten, id)
    end
    -- A live owner serving another hostname.
    contested = true
  end
end
-- @helpers: the prelude's helpers only what follows names are made here, not on every call.

-- ARGV[3]'s fields, split when a path first needs them.
local slow
local function arg(i)
  if not slow then
    slow = {}
    for field in string.gmatch(ARGV[3] .. '\n', '([^\n]*)\n') do
      slow[#slow + 1] = field
    end
  end
  return slow[i]
end

-- The ledger's keys and cap, and what its entries name.
local function ledger_entry(epoch, from, to, reason, extra)
  ledger_append({KEYS[8], KEYS[9], arg(13)}, arg(14), arg(15), id, epoch, from, to, reason, extra)
end

if contested then
  if arg(9) == 'deny' then
    return {'takeover-denied'}
  end
  if not old.expiry then
    old.expiry = now + tonumber(arg(1))
    redis.call('HSET', placements, id, cjson.encode(old))
    ledger_entry(old.epoch or '', old.sessionId, old.sessionId, 'takeover',
      {'fence', string.format('%d', old.expiry)})
  end
  return {'takeover-pending', tostring(old.expiry - now)}
end

-- A displaced (hostname, ns) takes no new placements for a lease; ids with a row bypass it.
if not raw and tonumber(arg(10)) > 0 then
  return {'binding-quarantine', arg(10)}
end

-- 2. The namespace must have (had) workers here.
if redis.call('EXISTS', list) == 0 then
  return {'unknown-ns'}
end

-- What follows places the id: refused, before anything is written, to a client past its
-- placement rate, and, for an id without a row, when the namespace holds its most rows.
if arg(11) ~= '0' then
  return {'rate-limited', arg(11)}
end
local max_rows = tonumber(arg(12))
if not raw and max_rows and redis.call('HLEN', placements) >= max_rows then
  return {'namespace-full'}
end

local lease, balance = tonumber(arg(1)), tonumber(arg(2))
local excluded, preferred, affinity = arg(3), arg(4), arg(5)

-- 3. Cold start: a bucket first seen now waits one lease for workers to re-register, so a
-- restarted registry does not re-place ids their old owners still hold.
redis.call('SET', boot_key, now, 'NX')
local boot = tonumber(redis.call('GET', boot_key))
if boot + lease > now then
  return {'quarantine', tostring(boot + lease - now)}
end

-- 4. Candidates: live, not draining, not degraded, not excluded, with enough lease left.
local margin = math.min(5000, lease / 3)
local ejected = {}
for _, s in ipairs(cjson.decode(arg(6))) do
  ejected[s] = true
end
local healthy, outliers = {}, {}
for _, sid in ipairs(redis.call('SMEMBERS', list)) do
  if sid ~= excluded then
    local rec = redis.call('HGET', workers, sid)
    if rec then
      rec = cjson.decode(rec)
      if rec.expiry - now >= margin and not rec.draining and not rec.degraded then
        rec.sid = sid
        if ejected[sid] then
          outliers[#outliers + 1] = rec
        else
          healthy[#healthy + 1] = rec
        end
      end
    end
  end
end
local candidates = healthy
if #candidates == 0 then
  candidates = outliers
end
if #candidates == 0 then
  return {'no-backends'}
end
table.sort(candidates, function(a, b) return a.sid < b.sid end)

-- 5. A move's successor, when it is a candidate (the operator named it, whatever its headroom).
local successor = old and old.mv and old.mv.to
local chosen
if successor then
  for _, c in ipairs(candidates) do
    if c.sid == successor then
      chosen = c
    end
  end
end
local moved = chosen ~= nil

-- Else affinity, honoured while the preferred worker's headroom >= mean / balance factor.
local total = 0
for _, c in ipairs(candidates) do
  total = total + c.headroom
end
local floor = (total / #candidates) / balance
if not chosen and preferred ~= '' then
  for _, c in ipairs(candidates) do
    if c.sid == preferred and c.headroom >= floor then
      chosen = c
    end
  end
elseif not chosen and affinity ~= '' then
  local best, best_score
  for _, c in ipairs(candidates) do
    local score = redis.sha1hex(affinity .. '\0' .. c.sid)
    if not best_score or score > best_score then
      best, best_score = c, score
    end
  end
  if best.headroom >= floor then
    chosen = best
  end
end

-- 6. Otherwise power of two: two random candidates, the higher headroom wins.
if not chosen then
  local a = candidates[(tonumber(arg(7)) % #candidates) + 1]
  local b = candidates[(tonumber(arg(8)) % #candidates) + 1]
  chosen = (b.headroom > a.headroom) and b or a
end

-- 7. Mint the epoch, list the overwritten row, take one unit of headroom, write the row.
-- In digits (`epoch_cmp`): max(now, previous + 1, last + 1), exact at any size.
local last = redis.call('GET', epoch_key) or '0'
local previous = (old and old.epoch and old.epoch ~= '') and old.epoch or '0'
local epoch = epoch_max(string.format('%d', now), epoch_max(epoch_next(previous), epoch_next(last)))
redis.call('SET', epoch_key, epoch)
-- A placeholder never had an owner to fence off: nothing to list.
if owned then
  redis.call('HSET', overwritten, id, old.epoch or '')
end
local rec = cjson.decode(redis.call('HGET', workers, chosen.sid))
rec.headroom = rec.headroom - 1
redis.call('HSET', workers, chosen.sid, cjson.encode(rec))
local row = {sessionId = chosen.sid, epoch = epoch}
if hostname ~= '' then
  row.hostname = hostname
end
-- A wind-down fence outlives its owner: the replacement owner inherits it (and is told). A
-- move's fence was the old owner's alone.
local fence = ''
if old and old.expiry and old.expiry > now and not old.mv then
  row.expiry = old.expiry
  fence = string.format('%d', old.expiry)
end
redis.call('HSET', placements, id, cjson.encode(row))
-- A placeholder (sessionId '') without a move is the durability sweep's: the id is woken. A
-- live owner's row replaced here is past its wind-down fence.
local reason, by = 'placed', nil
if moved then
  reason, by = 'moved', {'by', old.mv.by or ''}
elseif old and not owned and not old.mv then
  reason = 'woken'
elseif owned and not owner_live then
  reason = 're-placed-dead-owner'
end
ledger_entry(epoch, owned and old.sessionId or '', chosen.sid, reason, by)
return {'placed', chosen.sid, row.epoch, owned and '1' or '0', fence,
  chosen.advertiseUrl, chosen.secret}
