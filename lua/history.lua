-- GET /registry/history: one page of an id's ownership ledger, newest first, read by following
-- its chain (each entry names the one before it, `prev`) from its newest entry, one exact
-- `XRANGE stream e e` per entry: at most `limit` lookups, never a scan of the bucket's stream,
-- however many other ids it holds. Writes nothing.
--
-- KEYS[1]  the bucket's ownership ledger      KEYS[2] the ledger's newest entry of each id
-- ARGV[1]  env   ARGV[2] ns   ARGV[3] id
-- ARGV[4]  the stream ID to start at (a page's `next`), '' for the newest
-- ARGV[5]  the most entries to read (1–1000)
-- ARGV[6]  since (ms, '' for none): the walk stops after the first entry at or before it, the
--          one in force then
--
-- Returns JSON {entries = [[stream ID, field, value, ...], ...], next = stream ID | false,
-- truncated = the chain reached an entry the stream's cap trimmed, foreign = the start named
-- another id's entry}.
local stream, env, ns, id = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local at = ARGV[4]
if at == '' then
  at = redis.call('HGET', KEYS[2], ledger_field(env, ns, id))
end
local limit, since = tonumber(ARGV[5]), tonumber(ARGV[6])
local entries, truncated = {}, false
while at and #entries < limit do
  local found = redis.call('XRANGE', stream, at, at)[1]
  if not found then
    truncated = true
    at = nil
    break
  end
  local fields = {}
  for i = 1, #found[2], 2 do
    fields[found[2][i]] = found[2][i + 1]
  end
  if fields.env ~= env or fields.ns ~= ns or fields.id ~= id then
    -- Only a cursor can name another id's entry: the chain never leaves its id.
    return cjson.encode({entries = {}, next = false, truncated = false, foreign = true})
  end
  local entry = {found[1]}
  for _, value in ipairs(found[2]) do
    entry[#entry + 1] = value
  end
  entries[#entries + 1] = entry
  at = fields.prev
  if since and tonumber(string.match(found[1], '^%d+')) <= since then
    at = nil
  end
end
return cjson.encode({entries = entries, next = at or false, truncated = truncated,
  foreign = false})
