-- The nginx + Lua + Redis peer's resolve, run in Redis by EVALSHA (SCRIPT LOAD once): the
-- work of a steady-state Pinboard resolve of an id that is already placed, on the same keys,
-- read the same way (lua/resolve.lua's step 1): the placement row, then the owner's liveness
-- entry (`{expiry} {hostname}`), not its whole copy.
--
-- KEYS[1]  the placements hash of (env, ns)  "{prefix}{b}:{env}:{ns}:placements"
-- KEYS[2]  the bucket's liveness entries     "{prefix}{b}:alive"
-- KEYS[3]  the bucket's worker copies        "{prefix}{b}:workers" (read only for an owner
--          without a liveness entry, as Pinboard does)
-- ARGV[1]  id
-- (b = the first 4 bytes of sha256(id), big-endian, mod shards: the caller's to compute.)
--
-- Returns one status line, the cheapest reply to write and to parse (no array, no bulk
-- lengths): "+{sessionId} {epoch}" while the owner lives and the row is not fenced, else
-- "+-miss" (no row: this peer places nothing) or "+-dead" (owner gone, expired or fenced).
-- Session ids are hex and epochs digits, so neither holds a space or a line break.
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return {ok = '-miss'}
end
local row = cjson.decode(raw)
local sid = row.sessionId
if type(sid) ~= 'string' or sid == '' then
  return {ok = '-dead'}
end
local expiry
local live = redis.call('HGET', KEYS[2], sid)
if live then
  expiry = tonumber(string.sub(live, 1, string.find(live, ' ', 1, true) - 1))
else
  local copy = redis.call('HGET', KEYS[3], sid)
  if copy then
    expiry = cjson.decode(copy).expiry
  end
end
if not expiry then
  return {ok = '-dead'}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if expiry <= now or (row.expiry and row.expiry <= now) then
  return {ok = '-dead'}
end
return {ok = sid .. ' ' .. (row.epoch or '')}
