-- POST /registry/release for the rows of one bucket: compare-and-delete, atomic in the
-- bucket's slot. A row is freed only while its sessionId matches and its epoch equals the
-- quoted one ('' quotes an epoch-less row). Each row freed is appended to the ledger
-- ('released'). A freed row that is paused, or names a move's successor, leaves an ownerless
-- placeholder keeping the pause, the successor and the move's fence (the prelude's
-- `placeholder_of`): the owner releases as soon as it saved its state, and the next placement
-- must still go to the successor, or wait for a resume.
--
-- KEYS[1]  the bucket's ownership ledger      KEYS[2] the ledger's newest entry of each id
-- KEYS[3…] the placements hashes the rows live in (one per (env, ns))
-- ARGV[1]  the ledger's cap (ledger.max_entries_per_bucket; '' for the ledger off)
-- ARGV[2…] groups of six: index into KEYS of the row's placements hash, env, ns, id,
--          sessionId, epoch
--
-- Returns the number of rows freed.
local ledger = {KEYS[1], KEYS[2], ARGV[1]}
local released = 0
for i = 2, #ARGV, 6 do
  local placements, env, ns, id = KEYS[tonumber(ARGV[i])], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local row = redis.call('HGET', placements, id)
  if row then
    row = cjson.decode(row)
    if row.sessionId == ARGV[i + 4] and (row.epoch or '') == ARGV[i + 5] then
      local placeholder = placeholder_of(row, true)
      if placeholder then
        redis.call('HSET', placements, id, cjson.encode(placeholder))
      else
        redis.call('HDEL', placements, id)
      end
      ledger_append(ledger, env, ns, id, ARGV[i + 5], row.sessionId, '', 'released')
      released = released + 1
    end
  end
end
return released
