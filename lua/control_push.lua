-- Queues control messages to a session, atomic in the registry slot. The queue expires two
-- lease TTLs after its last write or peek.
--
-- KEYS[1]  registry key prefix
-- ARGV[1]  sessionId   ARGV[2] lease TTL (ms)
-- ARGV[3]  JSON [message, ...] (each {type, ns, id, deadline?})
--
-- Returns the number of messages queued.
local K = KEYS[1]
local queue = K .. 'control:' .. ARGV[1]
local messages = cjson.decode(ARGV[3])
for _, m in ipairs(messages) do
  local id = redis.call('INCR', K .. 'control:seq')
  redis.call('HSET', queue, tostring(id), cjson.encode(m))
end
if #messages > 0 then
  redis.call('PEXPIRE', queue, 2 * tonumber(ARGV[2]))
end
return #messages
