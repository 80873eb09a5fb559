-- The registry half of POST /registry/heartbeat, atomic in the registry slot: renew the lease,
-- store headroom / draining / degraded, check the hostname bindings still name this session's
-- envs, take acks and peek the control queue.
--
-- KEYS[1]  sessions   KEYS[2] bind:hosts   KEYS[3] the session's control queue
-- KEYS[4]  the drain of the session's client (the caller read the clientId from the record:
--          a session's client never changes)
-- ARGV[1]  sessionId     ARGV[2] headroom      ARGV[3] draining ('1' | '0')
-- ARGV[4]  probe outcome: 'pass' | 'degraded'
-- ARGV[5]  acks: JSON [msgId, ...]
-- ARGV[6]  lease TTL (ms)
--
-- Returns JSON {unknown = true} | {superseded = "..."} (nothing written) |
-- {session, now, drain = {deadline}|false, messages = [{msgId, ns, id, deadline|false}]}.
local sessions, hosts, queue, drain_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local sid = ARGV[1]
local lease = tonumber(ARGV[6])
local now = now_ms()

local raw = redis.call('HGET', sessions, sid)
if not raw then
  return cjson.encode({unknown = true})
end
local s = cjson.decode(raw)
if s.expiry <= now then
  return cjson.encode({unknown = true})
end

-- Hostname-aware: a higher-epoch registration may have rebound one of this session's
-- (hostname, ns) to another env; the session is then superseded (the caller drops it with
-- session_drop.lua).
if s.hostname then
  for _, ns in ipairs(s.namespaces) do
    local mine = s.envs[ns] or s.env
    local bound = redis.call('HGET', hosts, s.hostname .. ns)
    if bound then
      bound = cjson.decode(bound)
      if bound.env ~= mine then
        return cjson.encode({superseded = 'registration superseded: ' .. s.hostname .. ns ..
          ' now bound to env ' .. bound.env .. ' at epoch ' .. epoch_digits(bound.epoch)})
      end
    end
  end
end

local expiry = now + lease
local drain = redis.call('GET', drain_key)
if drain then
  drain = cjson.decode(drain)
  -- A timed drain ends the lease at its deadline; past it the drain only cordons (a session
  -- registered after the deadline lives a normal lease and takes no placements).
  if drain.deadline and drain.deadline > now then
    expiry = math.min(expiry, drain.deadline)
  end
else
  drain = false
end
s.expiry = expiry
s.headroom = tonumber(ARGV[2])
s.draining = ARGV[3] == '1'
if ARGV[4] == 'pass' then
  s.degradedSince = nil
elseif not s.degradedSince then
  s.degradedSince = now
end
redis.call('HSET', sessions, sid, cjson.encode(s))

-- Control messages: acked ones go; the rest are re-delivered on every ack.
for _, id in ipairs(cjson.decode(ARGV[5])) do
  redis.call('HDEL', queue, tostring(id))
end
local messages = {}
local pending = redis.call('HGETALL', queue)
for i = 1, #pending, 2 do
  local m = cjson.decode(pending[i + 1])
  m.msgId = pending[i]
  messages[#messages + 1] = m
end
if #pending > 0 then
  redis.call('PEXPIRE', queue, 2 * lease)
end
return cjson.encode({session = s, now = now, drain = drain, messages = messages})
