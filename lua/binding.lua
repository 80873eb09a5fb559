-- Hostname-aware mode, before a resolve: which env serves (hostname, namespace), with what
-- takeover rule, and whether the binding was displaced within the last lease.
--
-- KEYS[1]  bind:hosts   KEYS[2] bind:envs   KEYS[3] bind:quarantine
-- ARGV[1]  hostname .. namespace
--
-- Returns {'no-hostname-workers'} | {'env-conflict'} |
--         {'ok', env, takeover, quarantine remaining ms ('0' when none)}.
local hosts, envs, quarantine = KEYS[1], KEYS[2], KEYS[3]
local bound = redis.call('HGET', hosts, ARGV[1])
if not bound then
  return {'no-hostname-workers'}
end
bound = cjson.decode(bound)
local agreed = redis.call('HGET', envs, bound.env)
if not agreed then
  return {'env-conflict'}
end
agreed = cjson.decode(agreed)
local until_ms = tonumber(redis.call('HGET', quarantine, ARGV[1]) or '0')
return {'ok', bound.env, agreed.takeover, tostring(math.max(0, until_ms - now_ms()))}
