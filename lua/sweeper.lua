-- The sweeper lease (contract §6): one node at a time sweeps. Atomic in the registry slot.
--
-- KEYS[1]  the sweeper lease
-- ARGV[1]  'claim' or 'release'   ARGV[2] this node's node_id   ARGV[3] lease TTL (ms)
--
-- 'claim' takes the lease when nobody holds it, or renews it when this node does (TTL one
-- lease from now); 'release' gives it up, if this node holds it.
-- Returns 1 when this node holds the lease after a claim (or gave it up on a release), else 0.
local lease_key, op, node = KEYS[1], ARGV[1], ARGV[2]
local holder = redis.call('GET', lease_key)
if op == 'release' then
  if holder == node then
    redis.call('DEL', lease_key)
    return 1
  end
  return 0
end
if holder and holder ~= node then
  return 0
end
redis.call('SET', lease_key, node, 'PX', ARGV[3])
return 1
