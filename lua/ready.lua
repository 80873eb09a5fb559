-- Readiness probe run by every core for GET /readyz.
-- Going through EVALSHA (not PING) proves the scripting path the data plane depends on
-- works on this server. Returns the server clock in milliseconds.
local t = redis.call('TIME')
return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
