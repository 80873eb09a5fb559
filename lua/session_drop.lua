-- Drops a session from the registry slot (deregister, or a registration voided by its probe).
-- Its bucket copies are dropped by bucket_worker.lua; its placements are left to dead-owner
-- eviction.
--
-- KEYS[1]  registry key prefix     ARGV[1] sessionId
-- ARGV[2]  'live' to refuse a session whose lease has run out (deregister), '' otherwise
--
-- Returns JSON {unknown = true} | {session}.
local K = KEYS[1]
local sid = ARGV[1]
local raw = redis.call('HGET', K .. 'sessions', sid)
if not raw then
  return cjson.encode({unknown = true})
end
local s = cjson.decode(raw)
if ARGV[2] == 'live' then
  local t = redis.call('TIME')
  if s.expiry <= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
    return cjson.encode({unknown = true})
  end
end
redis.call('HDEL', K .. 'sessions', sid)
redis.call('DEL', K .. 'control:' .. sid)
local c = redis.call('HGET', K .. 'clients', s.clientId)
if c and cjson.decode(c).sessionId == sid then
  redis.call('HDEL', K .. 'clients', s.clientId)
end
return cjson.encode({session = s})
