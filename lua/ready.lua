-- Readiness probe run by every core for GET /readyz. It touches no key.
-- Going through EVALSHA (not PING) proves the scripting path the data plane depends on
-- works on this server. Returns the server clock in milliseconds.
return now_ms()
