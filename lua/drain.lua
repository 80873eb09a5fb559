-- An operator drain of a client, atomic in the registry slot. A timed drain forces release:
-- heartbeats bound the worker's lease by its deadline. Its key lives 7 days past the deadline;
-- a cordon (no deadline) has no TTL.
--
-- KEYS[1]  registry key prefix
-- ARGV[1]  clientId   ARGV[2] 'set' | 'clear'
-- ARGV[3]  deadline in seconds ('' for a cordon)   ARGV[4] lease TTL (ms)
--
-- Returns 1 when a drain was written ('set') or existed ('clear'), else 0.
local K = KEYS[1]
local key = K .. 'drain:' .. ARGV[1]
if ARGV[2] == 'clear' then
  return redis.call('DEL', key)
end
if ARGV[3] == '' then
  redis.call('SET', key, '{}')
  return 1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + math.max(math.floor(tonumber(ARGV[3]) * 1000), tonumber(ARGV[4]))
local week = 7 * 24 * 3600 * 1000
redis.call('SET', key, cjson.encode({deadline = deadline}), 'PX', deadline - now + week)
return 1
