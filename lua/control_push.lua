-- Queues control messages to a session, atomic in the registry slot. The queue expires two
-- lease TTLs after its last write or peek.
--
-- KEYS[1]  the session's control queue   KEYS[2] the message id counter
-- ARGV[1]  lease TTL (ms)
-- ARGV[2]  JSON [message, ...] (each {type, ns, id, deadline?})
--
-- Returns the number of messages queued.
local queue, seq = KEYS[1], KEYS[2]
local messages = cjson.decode(ARGV[2])
for _, m in ipairs(messages) do
  local id = redis.call('INCR', seq)
  redis.call('HSET', queue, tostring(id), cjson.encode(m))
end
if #messages > 0 then
  redis.call('PEXPIRE', queue, 2 * tonumber(ARGV[1]))
end
return #messages
