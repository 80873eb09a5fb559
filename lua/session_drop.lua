-- Drops a session from the registry slot (deregister, or a registration voided by its probe).
-- Its bucket copies are dropped by bucket_worker.lua; its placements are left to dead-owner
-- eviction.
--
-- KEYS[1]  sessions   KEYS[2] clients   KEYS[3] the session's control queue
-- ARGV[1]  sessionId
-- ARGV[2]  'live' to refuse a session whose lease has run out (deregister), '' otherwise
--
-- Returns JSON {unknown = true} | {session}.
local sessions, clients, queue = KEYS[1], KEYS[2], KEYS[3]
local sid = ARGV[1]
local raw = redis.call('HGET', sessions, sid)
if not raw then
  return cjson.encode({unknown = true})
end
local s = cjson.decode(raw)
if ARGV[2] == 'live' then
  if s.expiry <= now_ms() then
    return cjson.encode({unknown = true})
  end
end
redis.call('HDEL', sessions, sid)
redis.call('DEL', queue)
local c = redis.call('HGET', clients, s.clientId)
if c and cjson.decode(c).sessionId == sid then
  redis.call('HDEL', clients, s.clientId)
end
return cjson.encode({session = s})
