-- A node's claim on the fleet license and its membership entry, atomic in the registry slot.
--
-- The license is {schema, shards, hostnameAware, epoch}: the configuration every node of the
-- fleet must share for placements to mean the same thing everywhere. It lives with a TTL of one
-- lease, renewed by the nodes holding it; a node with a higher epoch overwrites it, and a node
-- whose license differs (byte for byte) at an equal or lower epoch does not serve.
--
-- KEYS[1]  registry key prefix
-- ARGV[1]  this node's license (JSON, canonical member order)   ARGV[2] its epoch
-- ARGV[3]  node id                                             ARGV[4] lease TTL (ms)
--
-- Returns {holds ('1'|'0'), members ('1' when every live member agrees, else '0')}.
local K = KEYS[1]
local mine, epoch, node = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local lease = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local holds = '0'
local current = redis.call('GET', K .. 'fleet')
if not current or current == mine then
  redis.call('SET', K .. 'fleet', mine, 'PX', lease)
  holds = '1'
elseif (tonumber(cjson.decode(current).epoch) or 0) < epoch then
  redis.call('SET', K .. 'fleet', mine, 'PX', lease)
  holds = '1'
end

-- Membership: one hash, a member per node with its own expiry. Every live member must carry
-- this node's license, unless its epoch is lower (it is on its way out).
redis.call('HSET', K .. 'members', node, cjson.encode({license = mine, expiry = now + lease}))
local agree = '1'
local members = redis.call('HGETALL', K .. 'members')
for i = 1, #members, 2 do
  local m = cjson.decode(members[i + 1])
  if m.expiry <= now then
    redis.call('HDEL', K .. 'members', members[i])
  elseif m.license ~= mine and (tonumber(cjson.decode(m.license).epoch) or 0) >= epoch then
    agree = '0'
  end
end
return {holds, agree}
