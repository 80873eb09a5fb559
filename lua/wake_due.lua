-- The durability sweep's first step for one page of due ids of (env, ns) in a bucket
-- (contract §7), atomic in the bucket's slot: an id whose row is not placed (no row, its
-- owner gone or dead, or its wind-down passed) is paged in as an ownerless placeholder row
-- {"sessionId":"","hostname":H}, H the hostname of its last row (the resurrection target),
-- so that a resolve from that hostname places it. A dead owner's row it replaces is listed
-- on the overwritten hash as a resolve would list it, and an unexpired wind-down fence stays
-- on the placeholder, for the new owner to inherit; so do a pause (the placeholder is then
-- not placed until a resume) and a move's successor (`mv`, for the placement to go to). A
-- dead owner's row it replaces is appended to the ledger ('woken', to no owner); the
-- placement that follows is resolve.lua's ('woken', or 'moved').
--
-- KEYS[1]  the placements hash of (env, ns)   KEYS[2] the overwritten hash of (env, ns)
-- KEYS[3]  the bucket's liveness entries      KEYS[4] the bucket's worker copies
-- KEYS[5]  the bucket's ownership ledger      KEYS[6] the ledger's newest entry of each id
-- ARGV[1]  the ledger's cap (ledger.max_entries_per_bucket; '' for the ledger off)
-- ARGV[2]  env   ARGV[3] ns   ARGV[4…] the due ids, at most 100
--
-- Returns, per id in order, the hostname to resolve it from: its live owner's, or H ('' in
-- single mode, or when no row ever named one).
local placements, overwritten, alive, workers = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = now_ms()
local ledger = {KEYS[5], KEYS[6], ARGV[1]}
local hostnames = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local raw = redis.call('HGET', placements, id)
  local row = raw and cjson.decode(raw) or {}
  local owned = type(row.sessionId) == 'string' and row.sessionId ~= ''
  local expiry, owner_hostname
  if owned then
    expiry, owner_hostname = owner_of(alive, workers, row.sessionId, true)
  end
  local fence_passed = row.expiry and row.expiry <= now
  if expiry and expiry > now and not fence_passed then
    hostnames[#hostnames + 1] = owner_hostname
  else
    local target = row.hostname or owner_hostname or ''
    hostnames[#hostnames + 1] = target
    if owned or not raw then
      local placeholder = {sessionId = '', hostname = target, paused = row.paused, mv = row.mv}
      if row.expiry and row.expiry > now then
        placeholder.expiry = row.expiry
      end
      redis.call('HSET', placements, id, cjson.encode(placeholder))
      if owned then
        redis.call('HSET', overwritten, id, row.epoch or '')
        ledger_append(ledger, ARGV[2], ARGV[3], id, row.epoch or '', row.sessionId, '', 'woken')
      end
    end
  end
end
return hostnames
