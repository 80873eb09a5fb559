-- A node's claim on the fleet license and its membership entry, atomic in the registry slot.
--
-- The license is {schema, shards, hostnameAware, epoch}: the configuration every node of the
-- fleet must share for placements to mean the same thing everywhere. It lives with a TTL of one
-- lease, renewed by the nodes holding it; a node with a higher epoch overwrites it, and a node
-- whose license differs (byte for byte) at an equal or lower epoch does not serve.
--
-- KEYS[1]  the fleet license   KEYS[2] the membership hash
-- ARGV[1]  this node's license (JSON, canonical member order)   ARGV[2] its epoch (digits)
-- ARGV[3]  node id                                             ARGV[4] lease TTL (ms)
--
-- Returns {holds ('1'|'0'), members ('1' when every live member agrees, else '0')}.
local fleet, members = KEYS[1], KEYS[2]
local mine, epoch, node = ARGV[1], ARGV[2], ARGV[3]
local lease = tonumber(ARGV[4])
local now = now_ms()
-- A license's epoch as written (digits: `epoch_cmp`), not as cjson would read it (a double).
local function epoch_of(license)
  return string.match(license, '"epoch":(%d+)') or '0'
end

local holds = '0'
local current = redis.call('GET', fleet)
if not current or current == mine then
  redis.call('SET', fleet, mine, 'PX', lease)
  holds = '1'
elseif epoch_cmp(epoch_of(current), epoch) < 0 then
  redis.call('SET', fleet, mine, 'PX', lease)
  holds = '1'
end

-- Membership: one hash, a member per node with its own expiry. Every live member must carry
-- this node's license, unless its epoch is lower (it is on its way out).
redis.call('HSET', members, node, cjson.encode({license = mine, expiry = now + lease}))
local agree = '1'
local all = redis.call('HGETALL', members)
for i = 1, #all, 2 do
  local m = cjson.decode(all[i + 1])
  if m.expiry <= now then
    redis.call('HDEL', members, all[i])
  elseif m.license ~= mine and epoch_cmp(epoch_of(m.license), epoch) >= 0 then
    agree = '0'
  end
end
return {holds, agree}
