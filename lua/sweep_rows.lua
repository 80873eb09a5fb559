-- The sweeper's GC of one page of (env, ns) in a bucket, atomic in the bucket's slot
-- (contract §6). The caller walks the hash with HSCAN and hands each page's ids here, at most
-- 100 a call (SCRIPT_PAGE); every condition is judged again here, on the row as it is now.
--
-- KEYS[1]  the placements hash of (env, ns)   KEYS[2] the overwritten hash of (env, ns)
-- KEYS[3]  the wake schedule of (env, ns)     KEYS[4] the bucket's liveness entries
-- KEYS[5]  the bucket's worker copies
-- KEYS[6]  the bucket's ownership ledger      KEYS[7] the ledger's newest entry of each id
-- ARGV[1]  'rows' or 'markers'   ARGV[2] lease TTL (ms)
-- ARGV[3]  the ledger's cap (ledger.max_entries_per_bucket; '' for the ledger off)
-- ARGV[4]  env   ARGV[5] ns   ARGV[6…] ids
--
-- 'rows': deletes each row whose owner is gone or dead for more than a lease (no copy in the
-- bucket, or its expiry a lease past; an ownerless placeholder has none), unless the id is on
-- the wake schedule or the row's wind-down fence has not passed. The lease of grace is the
-- one the registry gives a dead record before pruning it: a worker that re-registers within
-- it (after a Redis or network outage) still reclaims its rows. Each owned row deleted is
-- appended to the ledger ('swept'); a placeholder had no owner to lose. A paused row is never
-- deleted: a dead owner's is retired to an ownerless placeholder keeping the pause (the
-- prelude's `placeholder_of`), a paused placeholder stays until a resume. A move's successor
-- (`mv`) keeps its row a lease past the move's fence, for the successor to be placed on.
-- 'markers': deletes each overwritten marker whose id has no row.
--
-- Returns the number deleted (a dead owner's paused row retired counts as one).
local placements, overwritten, wake, alive, workers = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = now_ms()
local lease = tonumber(ARGV[2])
local ledger = {KEYS[6], KEYS[7], ARGV[3]}
local deleted = 0
for i = 6, #ARGV do
  local id = ARGV[i]
  if ARGV[1] == 'markers' then
    if redis.call('HEXISTS', placements, id) == 0 then
      deleted = deleted + redis.call('HDEL', overwritten, id)
    end
  else
    local raw = redis.call('HGET', placements, id)
    if raw then
      local row = cjson.decode(raw)
      local owned = type(row.sessionId) == 'string' and row.sessionId ~= ''
      local expiry
      if owned then
        expiry = owner_of(alive, workers, row.sessionId)
      end
      local owner_dead = not expiry or expiry + lease < now
      local fenced = row.expiry and row.expiry + (row.mv and lease or 0) > now
      if owner_dead and not fenced and not redis.call('ZSCORE', wake, id) then
        local placeholder = placeholder_of(row, false)
        if not placeholder then
          deleted = deleted + redis.call('HDEL', placements, id)
        elseif owned then
          redis.call('HSET', placements, id, cjson.encode(placeholder))
          deleted = deleted + 1
        end
        if owned then
          ledger_append(ledger, ARGV[4], ARGV[5], id, row.epoch or '', row.sessionId, '', 'swept')
        end
      end
    end
  end
end
return deleted
