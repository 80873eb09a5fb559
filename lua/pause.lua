-- POST /registry/pause and POST /registry/resume for one id, atomic in its bucket's slot: the
-- paused field of its row ({by = the operator's sub, at = ms, reason?}), which resolve.lua
-- answers 'paused' for before anything else. The placement itself is left as it is: owner,
-- epoch and fence. An id without a row gets an ownerless placeholder holding the pause alone,
-- so that no node places it while it is paused; a resume deletes a placeholder left holding
-- nothing (no move's successor, no resurrection hostname, no fence). Written only while the
-- row's owner is still the one the caller judged the operator's scope on. Each change is
-- appended to the ledger ('paused' or 'resumed', by the operator); a pause of a paused id, or
-- a resume of one not paused, changes and appends nothing.
--
-- KEYS[1]  the placements hash of (env, ns)
-- KEYS[2]  the bucket's ownership ledger      KEYS[3] the ledger's newest entry of each id
-- ARGV[1]  'pause' | 'resume'   ARGV[2] id
-- ARGV[3]  the owner as read: '-' for no row, '' for an ownerless placeholder, else its
--          sessionId
-- ARGV[4]  the ledger's cap (ledger.max_entries_per_bucket; '' for the ledger off)
-- ARGV[5]  env   ARGV[6] ns   ARGV[7] the operator's sub   ARGV[8] a pause's reason ('' none)
--
-- Returns 'changed' | 'unchanged' | 'stale' (the row's owner is no longer the one read:
-- nothing written; the caller reads and judges again).
local placements, id = KEYS[1], ARGV[2]
local ledger = {KEYS[2], KEYS[3], ARGV[4]}
local raw = redis.call('HGET', placements, id)
local row, owner = nil, '-'
if raw then
  row = cjson.decode(raw)
  owner = type(row.sessionId) == 'string' and row.sessionId or ''
end
if owner ~= ARGV[3] then
  return 'stale'
end
local pausing = ARGV[1] == 'pause'
if (row ~= nil and row.paused ~= nil) == pausing then
  return 'unchanged'
end
local now = now_ms()
row = row or {sessionId = ''}
local reason
if pausing then
  row.paused = {by = ARGV[7], at = now}
  if ARGV[8] ~= '' then
    row.paused.reason = ARGV[8]
  end
  reason = 'paused'
else
  row.paused = nil
  reason = 'resumed'
end
local holds_nothing = owner == '' and not row.paused and not row.mv
  and (row.hostname or '') == '' and not (row.expiry and row.expiry > now)
if holds_nothing then
  redis.call('HDEL', placements, id)
else
  redis.call('HSET', placements, id, cjson.encode(row))
end
local session = owner == '-' and '' or owner
ledger_append(ledger, ARGV[5], ARGV[6], id, row.epoch or '', session, session, reason,
  {'by', ARGV[7]})
return 'changed'
