-- Hostname-aware mode, before a resolve: which env serves (hostname, namespace), with what
-- takeover rule, and whether the binding was displaced within the last lease.
--
-- KEYS[1]  registry key prefix
-- ARGV[1]  hostname .. namespace
--
-- Returns {'no-hostname-workers'} | {'env-conflict'} |
--         {'ok', env, takeover, quarantine remaining ms ('0' when none)}.
local K = KEYS[1]
local bound = redis.call('HGET', K .. 'bind:hosts', ARGV[1])
if not bound then
  return {'no-hostname-workers'}
end
bound = cjson.decode(bound)
local agreed = redis.call('HGET', K .. 'bind:envs', bound.env)
if not agreed then
  return {'env-conflict'}
end
agreed = cjson.decode(agreed)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = tonumber(redis.call('HGET', K .. 'bind:quarantine', ARGV[1]) or '0')
return {'ok', bound.env, agreed.takeover, tostring(math.max(0, until_ms - now))}
