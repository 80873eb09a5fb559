-- The sweeper's pruning of a bucket's `ledger:last` hash, atomic in the bucket's slot: a field
-- whose newest entry the stream's cap has trimmed away (older than the stream's first entry, or
-- the stream gone) goes, so that the hash does not outgrow the stream. The caller walks the
-- hash with HSCAN and hands a page's candidate fields here, at most 100 a call (SCRIPT_PAGE);
-- each is judged again here, on the hash and the stream as they are now.
--
-- KEYS[1]  the bucket's ownership ledger      KEYS[2] the ledger's newest entry of each id
-- ARGV     the fields
--
-- Returns the number of fields deleted.
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)[1]
-- A stream ID as (ms, sequence), compared as numbers: a ms count fits a double exactly.
local function parts(entry)
  local ms, seq = string.match(entry, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local first_ms, first_seq
if first then
  first_ms, first_seq = parts(first[1])
end
local deleted = 0
for _, field in ipairs(ARGV) do
  local newest = redis.call('HGET', KEYS[2], field)
  if newest then
    local ms, seq = parts(newest)
    if not first or ms < first_ms or (ms == first_ms and seq < first_seq) then
      deleted = deleted + redis.call('HDEL', KEYS[2], field)
    end
  end
end
return deleted
