-- An operator drain of a client, atomic in the registry slot. A timed drain forces release:
-- heartbeats bound the worker's lease by its deadline. Its key lives 7 days past the deadline;
-- a cordon (no deadline) has no TTL.
--
-- KEYS[1]  the client's drain
-- ARGV[1]  'set' | 'clear'
-- ARGV[2]  deadline in seconds ('' for a cordon)   ARGV[3] lease TTL (ms)
--
-- Returns 1 when a drain was written ('set') or existed ('clear'), else 0.
local key = KEYS[1]
if ARGV[1] == 'clear' then
  return redis.call('DEL', key)
end
if ARGV[2] == '' then
  redis.call('SET', key, '{}')
  return 1
end
local now = now_ms()
local deadline = now + math.max(math.floor(tonumber(ARGV[2]) * 1000), tonumber(ARGV[3]))
local week = 7 * 24 * 3600 * 1000
redis.call('SET', key, cjson.encode({deadline = deadline}), 'PX', deadline - now + week)
return 1
