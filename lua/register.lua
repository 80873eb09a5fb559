-- The registry half of POST /registry/register, atomic in the registry slot.
--
-- KEYS[1]  sessions      KEYS[2] clients        KEYS[3] bind:hosts
-- KEYS[4]  bind:envs     KEYS[5] bind:quarantine
-- KEYS[6]  the client's drain      KEYS[7] namespaces (every (env, ns) pair ever registered)
--
-- The control queues of the sessions it prunes or replaces are not deleted here (they are not
-- its keys): every queue expires two leases after its last write or peek.
--
-- ARGV[1]  new sessionId            ARGV[2] account (credential sub)
-- ARGV[3]  clientId                 ARGV[4] session record (JSON, expiry filled in here)
-- ARGV[5]  lease TTL (ms)           ARGV[6] binding epoch (decimal digits, any size: stored and
--                                   compared as such, `epoch_cmp`)
-- ARGV[7]  host bindings wanted: JSON [[hostname..ns, env], ...] ('[]' in single mode)
-- ARGV[8]  env bindings wanted:  JSON [[env, takeover], ...]      ('[]' in single mode)
-- ARGV[9]  prevSessionId the worker asks to reclaim from, or ''
-- ARGV[10] the (env, ns) pairs the session serves: JSON [field, ...] (`Store::pair_field`)
--
-- Returns JSON: {conflict = "..."} (409, nothing written), or
-- {expiry, now, drain = {deadline = ms}|false, replaced = old sessionId|false,
--  reclaim = prevSessionId|false}: reclaim is the previous session only when it was this
-- account's and this client's, so no credential can take over another worker's rows.
local sessions, clients, hosts, envs, quarantine, drain_key, namespaces =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local sid, account, client = ARGV[1], ARGV[2], ARGV[3]
local session = cjson.decode(ARGV[4])
local lease = tonumber(ARGV[5])
local epoch = ARGV[6]
local hosts_wanted = cjson.decode(ARGV[7])
local envs_wanted = cjson.decode(ARGV[8])
local now = now_ms()

-- Ownership: a clientId belongs to the first account that registered it.
local owner = redis.call('HGET', clients, client)
if owner then
  owner = cjson.decode(owner)
  if owner.account ~= account then
    return cjson.encode({conflict = 'client belongs to another account'})
  end
end

-- Reclaim only your own: the previous session must have been registered by this account
-- under this clientId (its record, or while pruned or replaced the client's own pointer).
-- Decided before pruning and replacing remove the evidence.
local reclaim = false
local prev = ARGV[9]
if prev ~= '' then
  local ps = redis.call('HGET', sessions, prev)
  if ps then
    ps = cjson.decode(ps)
    if ps.account == account and ps.clientId == client then
      reclaim = prev
    end
  elseif owner and owner.sessionId == prev then
    reclaim = prev
  end
end

-- Bindings (hostname-aware): every conflict is found before anything is written.
local host_writes, env_writes = {}, {}
for _, want in ipairs(hosts_wanted) do
  local key, env = want[1], want[2]
  local bound = redis.call('HGET', hosts, key)
  if bound then
    bound = cjson.decode(bound)
    local order = epoch_cmp(epoch, bound.epoch)
    if bound.env ~= env and order <= 0 then
      return cjson.encode({conflict = 'hostname ' .. key .. ' is bound to env ' .. bound.env ..
        ' at epoch ' .. epoch_digits(bound.epoch) .. ', not ' .. env ..
        ' — register with a higher epoch to displace'})
    end
    if bound.env ~= env or order > 0 then
      host_writes[#host_writes + 1] = {key, env, bound.env ~= env}
    end
  else
    host_writes[#host_writes + 1] = {key, env, false}
  end
end
for _, want in ipairs(envs_wanted) do
  local env, takeover = want[1], want[2]
  local bound = redis.call('HGET', envs, env)
  if bound then
    bound = cjson.decode(bound)
    local order = epoch_cmp(epoch, bound.epoch)
    if bound.takeover ~= takeover and order <= 0 then
      return cjson.encode({conflict = 'env ' .. env .. ' agreed takeover ' .. bound.takeover ..
        ' at epoch ' .. epoch_digits(bound.epoch) .. ', not ' .. takeover ..
        ' — register with a higher epoch to displace'})
    end
    if bound.takeover ~= takeover or order > 0 then
      env_writes[#env_writes + 1] = {env, takeover}
    end
  else
    env_writes[#env_writes + 1] = {env, takeover}
  end
end

for _, w in ipairs(host_writes) do
  redis.call('HSET', hosts, w[1], cjson.encode({env = w[2], epoch = epoch}))
  if w[3] then
    -- Displaced: new placements in this (hostname, ns) wait one lease for the old env's
    -- workers to hear they were superseded.
    redis.call('HSET', quarantine, w[1], now + lease)
  end
end
for _, w in ipairs(env_writes) do
  redis.call('HSET', envs, w[1], cjson.encode({takeover = w[2], epoch = epoch}))
end

-- Prune sessions dead for more than a lease, and the bindings no live session uses (nor this
-- registration wants).
prune_registry(sessions, clients, hosts, envs, quarantine, lease, now, hosts_wanted, envs_wanted)

-- One live session per client: a new registration replaces the previous one.
local replaced = false
if owner and owner.sessionId ~= sid then
  if redis.call('HDEL', sessions, owner.sessionId) == 1 then
    replaced = owner.sessionId
  end
end
redis.call('HSET', clients, client, cjson.encode({account = account, sessionId = sid}))
-- The sweeper walks these pairs after every session naming them is pruned; a count that moves
-- tells it a registration named the pair while it judged the pair empty.
for _, pair in ipairs(cjson.decode(ARGV[10])) do
  redis.call('HINCRBY', namespaces, pair, 1)
end

-- An operator drain of this client: draining, and a timed one bounds the lease. Past its
-- deadline the client's placements have moved on: a new session lives a normal lease (no
-- register/409 loop), takes no placements (draining) and reclaims nothing.
local expiry = now + lease
local drain = redis.call('GET', drain_key)
if drain then
  drain = cjson.decode(drain)
  if drain.deadline and drain.deadline > now then
    expiry = math.min(expiry, drain.deadline)
  elseif drain.deadline then
    reclaim = false
  end
else
  drain = false
end
session.expiry = expiry
redis.call('HSET', sessions, sid, cjson.encode(session))
return cjson.encode({expiry = expiry, now = now, drain = drain, replaced = replaced,
  reclaim = reclaim})
